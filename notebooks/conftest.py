"""Notebooks run in CI through nbmake with small settings (each notebook reads MVIT2_SMALL)."""

import os

os.environ.setdefault("MVIT2_SMALL", "1")
