"""Ship to a budget: `optimize` builds every candidate file of a target, measures each on
held-out images and ships the smallest one within the top-1 budget (against the float Keras
model) that is not slower than float32 on this host (objective ``"size_fast"``; ``"size"``
and ``"latency"`` choose the smallest or the fastest), `mvit2 optimize`."""

from keras_mvit2.export.optimizer.data import (
    OptimizeData,
    load_optimize_data,
    training_images_of,
)
from keras_mvit2.export.optimizer.search import (
    DEFAULT_OBJECTIVE,
    OBJECTIVES,
    QAT_BATCH_SIZE,
    QAT_CANDIDATE,
    QAT_EPOCHS,
    QAT_LEARNING_RATE,
    QAT_MAX_STEPS,
    OptimizeResult,
    OverBudgetError,
    QATSettings,
    best_within,
    compare_with_float,
    float_reference,
    optimize,
    qat_decision,
    qat_settings,
)

__all__ = [
    "DEFAULT_OBJECTIVE",
    "OBJECTIVES",
    "QAT_BATCH_SIZE",
    "QAT_CANDIDATE",
    "QAT_EPOCHS",
    "QAT_LEARNING_RATE",
    "QAT_MAX_STEPS",
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
