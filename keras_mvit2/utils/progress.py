"""Training progress that reads well in a terminal and in a log file.

Keras' progress bar (`verbose=1`) redraws itself with carriage returns, backspaces and
ANSI colours, and on Linux it does so even when standard output is a file or a pipe (it
takes any POSIX system for a terminal): a CI log or `mvit2 train > train.log` gets
thousands of redraws per epoch. `progress_verbose` turns the bar into one plain line per
epoch (Keras' `verbose=2`) whenever standard output is not a terminal (or a notebook,
which draws the bar), and `EpochProgress` prints the epochs of a run trained one `fit`
call per epoch with the run's own total (`Epoch 4/5`, not Keras' `Epoch 4/4`), the
summary of each epoch on the same line as its number.
"""

from __future__ import annotations

import sys
import time

import keras


def stdout_is_terminal() -> bool:
    """Whether standard output shows a live progress bar: a terminal or a notebook."""
    isatty = getattr(sys.stdout, "isatty", None)
    try:
        terminal = bool(isatty and isatty())
    except ValueError:  # a closed stream
        terminal = False
    return terminal or "ipykernel" in sys.modules


def progress_verbose(verbose: int) -> int:
    """Keras' `verbose` for a requested one: 1 (the bar) becomes 2 (one line per epoch)
    when standard output is not a terminal; 0 and 2 stay."""
    return 2 if verbose == 1 and not stdout_is_terminal() else verbose


class EpochProgress(keras.callbacks.ProgbarLogger):
    """Keras' `ProgbarLogger` with a fixed total of epochs and a one-line mode.

    Passed in `fit(callbacks=...)`, it replaces Keras' own progress output. `verbose=1`:
    the live bar under `Epoch k/n`; `verbose=2`: one line per epoch, `Epoch k/n - 40/40 -
    3s - 75ms/step - accuracy: 0.8125 - loss: 0.6043`, with no control characters.

    Args:
        epochs: int. The run's number of epochs, shown as `n`, whatever `fit(epochs=...)`
            a call gets (a run trained one `fit` per epoch passes `epochs=epoch + 1`).
        verbose: int. 1 or 2 (see `progress_verbose`).

    Example:

    ```python
    verbose = progress_verbose(1)  # 2 in a log file
    model.fit(data, initial_epoch=3, epochs=4, verbose=verbose,
              callbacks=[EpochProgress(5, verbose)])  # prints "Epoch 4/5 ..."
    ```
    """

    def __init__(self, epochs: int, verbose: int = 1):
        super().__init__()
        if epochs < 1 or verbose not in (1, 2):
            raise ValueError(f"EpochProgress needs epochs >= 1 and verbose 1 or 2. Received: "
                             f"epochs={epochs}, verbose={verbose}")
        self.total_epochs = epochs
        self.mode = verbose
        self._epoch_start = 0.0
        self._steps = 0

    def set_params(self, params):
        super().set_params(params)
        self.verbose, self.epochs = self.mode, self.total_epochs

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start, self._steps = time.time(), 0
        if self.mode == 1:
            super().on_epoch_begin(epoch, logs)
        else:
            self._reset_progbar()

    def on_train_batch_end(self, batch, logs=None):
        self._steps = batch + 1
        if self.mode == 1:
            super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        if self.mode == 1:
            super().on_epoch_end(epoch, logs)
            return
        seconds = time.time() - self._epoch_start
        steps = self.target or self._steps
        parts = [f"Epoch {epoch + 1}/{self.total_epochs}", f"{self._steps}/{steps}",
                 f"{seconds:.0f}s", _per_step(seconds / max(self._steps, 1))]
        parts += [f"{k}: {_number(v)}" for k, v in (logs or {}).items()]
        print(" - ".join(parts), flush=True)

    def _finalize_progbar(self, logs):
        if self.mode == 1:
            super()._finalize_progbar(logs)


def _per_step(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.0f}s/step"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.0f}ms/step"
    return f"{seconds * 1e6:.0f}us/step"


def _number(value) -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{value:.4f}" if abs(value) > 1e-3 else f"{value:.4e}"
