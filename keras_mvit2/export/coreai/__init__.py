"""Core AI export: an Apple Core AI model asset (`.aimodel`) through PyTorch.

* `convert`: `to_coreai` (``torch.export`` + coreai-torch, keras_mvit2 metadata, atomic
  save), on Keras' PyTorch backend: Core AI's only road (`keras_mvit2.export.roads`);
* `inspect`: `CoreAIReport`, `inspect_coreai` (program summary and metadata, any OS),
  `run_coreai` and `coreai_predictions_available` (predictions need macOS);
* `target`: `CoreAITarget`, registered as ``"coreai"`` (suffix ``.aimodel``).

coreai-torch and coreai-core are imported on use (the ``coreai`` extra).
"""

from keras_mvit2.export.coreai.convert import MINIMUM_OS, to_coreai
from keras_mvit2.export.coreai.inspect import (
    CoreAIReport,
    coreai_predictions_available,
    inspect_coreai,
    run_coreai,
)
from keras_mvit2.export.coreai.target import COREAI, CoreAITarget

__all__ = [
    "COREAI",
    "MINIMUM_OS",
    "CoreAIReport",
    "CoreAITarget",
    "coreai_predictions_available",
    "inspect_coreai",
    "run_coreai",
    "to_coreai",
]
