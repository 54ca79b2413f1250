"""`python -m keras_mvit2.cli ...`: the `mvit2` command (`mvit2 export --road` re-runs itself
this way on another Keras backend)."""

import sys

from keras_mvit2.cli.main import main

sys.exit(main())
