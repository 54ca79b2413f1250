"""Stopping a training run at the first non-finite loss, and saying what to do about it.

A learning rate far too high (or a float16 overflow) turns the loss into NaN or inf within
a step or two; every later step keeps it there. Keras' `fit` carries on regardless, and a
run left alone would save NaN weights as checkpoints and models. `StopOnNonFiniteLoss`
(Keras' `TerminateOnNaN`, which also records where) stops `fit` after the first such
batch; the trainer then raises `TrainingDivergedError` before anything of that epoch is
written.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import keras
import numpy as np


class TrainingDivergedError(FloatingPointError):
    """The loss (or a weight) became NaN or infinite; nothing of that epoch was saved.

    Attributes:
        epoch: the epoch (1-based) in which it happened.
        batch: the batch of that epoch (1-based), or `None` if the loss stayed finite and a
            weight did not (the last step of the epoch).
        last_checkpoint: the last checkpoint written with finite weights (the run resumes
            from it), or `None` if no epoch finished.
    """

    def __init__(self, message: str, *, epoch: int, batch: int | None,
                 last_checkpoint: str | None):
        super().__init__(message)
        self.epoch = epoch
        self.batch = batch
        self.last_checkpoint = last_checkpoint


class StopOnNonFiniteLoss(keras.callbacks.TerminateOnNaN):
    """Keras' `TerminateOnNaN` that remembers the batch and the loss it stopped at.

    Attributes:
        batch: the batch (0-based, within the epoch) whose loss was not finite, else `None`.
        loss: that loss.
    """

    def __init__(self):
        super().__init__()
        self.batch: int | None = None
        self.loss: float | None = None

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)) and self.batch is None:
            self.batch, self.loss = batch, float(loss)
            self.model.stop_training = True


def non_finite_weights(variables: Sequence[keras.Variable]) -> list[str]:
    """Paths of the variables holding a NaN or an infinity."""
    return [v.path for v in variables
            if not np.all(np.isfinite(np.asarray(keras.ops.convert_to_numpy(v))))]


def diverged_error(*, epoch: int, batch: int | None, loss: float | None,
                   bad_weights: Sequence[str], last_checkpoint: str | None, lr: float,
                   clip_global_norm: float | None, precision: str) -> TrainingDivergedError:
    """The one-line error for a run that diverged in `epoch` (1-based)."""
    if batch is not None:
        what = f"the loss became {loss} at epoch {epoch}, batch {batch}"
    else:
        what = f"{len(bad_weights)} weight(s) became NaN or infinite in epoch {epoch} " \
               f"(e.g. {bad_weights[0]})"
    if last_checkpoint is None:
        kept = "no epoch had finished, so there is no checkpoint to resume from"
    else:
        kept = f"the last finite checkpoint, {last_checkpoint}, is kept and a rerun resumes " \
               "from it (with a changed learning rate, add --resume to re-plan its schedule)"
    fixes = [f"a lower learning rate (optimizer.lr={lr:g} now; e.g. --set optimizer.lr="
             f"{lr / 10:g})"]
    if clip_global_norm is None:
        fixes.append("gradient clipping (optimizer.clip_global_norm=1.0)")
    else:
        fixes.append(f"tighter gradient clipping (optimizer.clip_global_norm="
                     f"{clip_global_norm:g} now)")
    if precision != "float32":
        fixes.append(f"training.precision=float32 ({precision} now)")
    message = (f"Training diverged: {what}. Nothing of that epoch was saved and no model "
               f"was written; {kept}. Try {', '.join(fixes[:-1])} or {fixes[-1]}.")
    return TrainingDivergedError(message, epoch=epoch, batch=batch,
                                 last_checkpoint=last_checkpoint)
