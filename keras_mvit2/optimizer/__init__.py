"""Ship to a budget: `optimize` builds every candidate file of a target, measures each on
held-out images and ships the smallest one within the top-1 budget (against the float Keras
model) that is not slower than float32 on this host (objective ``"size_fast"``; ``"size"``
and ``"latency"`` choose the smallest or the fastest), `mvit2 optimize`.

The optimizer stands above `keras_mvit2.export` (the targets write the files),
`keras_mvit2.quantize` (the ``qat_int8`` candidate) and `keras_mvit2.latency` (the timings):

* `search`: `optimize`, `OptimizeResult`, `best_within` and the objectives;
* `data`: the disjoint calibration and held-out images (`load_optimize_data`);
* `candidate`: `Candidate` and `CandidateResult`; `targets`: the candidates of each export
  target (`tflite_candidates`, `coreml_candidates`);
* `qat_settings`: `QATSettings`, the ``qat_int8`` candidate's images and schedule;
* `report`: ``report.json``, ``pareto.png`` and the table `mvit2 optimize` prints.

`QATSettings` needs no TensorFlow (`mvit2 finetune` checks it on every backend); the other
names read images and files through `keras_mvit2.export` and are imported on first use.
"""

from keras_mvit2.backend import lazy_attributes
from keras_mvit2.optimizer.candidate import Candidate, CandidateResult
from keras_mvit2.optimizer.qat_settings import (
    QAT_BATCH_SIZE,
    QAT_CANDIDATE,
    QAT_EPOCHS,
    QAT_LEARNING_RATE,
    QAT_MAX_STEPS,
    QATSettings,
    qat_settings,
)

_SEARCH = ("DEFAULT_OBJECTIVE", "OBJECTIVES", "OptimizeResult", "OverBudgetError", "best_within",
           "compare_with_float", "float_reference", "optimize", "qat_decision")
_DATA = ("OptimizeData", "load_optimize_data", "training_images_of")

__getattr__ = lazy_attributes(__name__, {
    **{name: ("keras_mvit2.optimizer.search", name) for name in _SEARCH},
    **{name: ("keras_mvit2.optimizer.data", name) for name in _DATA},
})

__all__ = [
    "DEFAULT_OBJECTIVE",
    "OBJECTIVES",
    "QAT_BATCH_SIZE",
    "QAT_CANDIDATE",
    "QAT_EPOCHS",
    "QAT_LEARNING_RATE",
    "QAT_MAX_STEPS",
    "Candidate",
    "CandidateResult",
    "OptimizeData",
    "OptimizeResult",
    "OverBudgetError",
    "QATSettings",
    "best_within",
    "compare_with_float",
    "float_reference",
    "load_optimize_data",
    "optimize",
    "qat_decision",
    "qat_settings",
    "training_images_of",
]
