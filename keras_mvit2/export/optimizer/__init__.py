"""Ship to a budget: `optimize` builds every candidate file of a target, measures each on
held-out images and ships the smallest (or fastest) one whose top-1 drop against the float
Keras model is within the budget (`mvit2 optimize`)."""

from keras_mvit2.export.optimizer.data import OptimizeData, load_optimize_data
from keras_mvit2.export.optimizer.search import (
    OBJECTIVES,
    OptimizeResult,
    OverBudgetError,
    best_within,
    optimize,
)

__all__ = [
    "OBJECTIVES",
    "OptimizeData",
    "OptimizeResult",
    "OverBudgetError",
    "best_within",
    "load_optimize_data",
    "optimize",
]
