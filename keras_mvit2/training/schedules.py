"""Learning-rate schedules of the MobileViTv2 recipe."""

import math

import keras
from keras import ops

from keras_mvit2.api_export import serializable


@serializable
class WarmupCosineDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from `warmup_init_lr` to `peak_lr`, then cosine decay to `min_lr`.

    ```
    step < warmup_steps:  lr = warmup_init_lr + (peak_lr - warmup_init_lr) * step / warmup_steps
    otherwise:            t = min(1, (step - warmup_steps) / (total_steps - warmup_steps))
                          lr = min_lr + (peak_lr - min_lr) * (1 + cos(pi * t)) / 2
    ```

    This is ml-cvnets' `cosine` scheduler with linear warm-up (Table 9: 1e-6 -> 0.002 over
    20k iterations, then cosine to 0.0002), evaluated per optimizer step. With
    `min_lr == peak_lr` it is a warm-up followed by a constant rate (Table 10's "fixed").
    Registered for serialization, so optimizers saved in `.keras` files reload it.

    Args:
        peak_lr: float. Rate at the end of the warm-up.
        total_steps: int. Steps of the whole run (warm-up included); the rate reaches
            `min_lr` there and stays.
        warmup_steps: int. Warm-up length (0: start at `peak_lr`).
        warmup_init_lr: float. Rate at step 0 of the warm-up.
        min_lr: float. Final rate of the cosine.
        name: optional name.

    Example:
    >>> s = WarmupCosineDecay(0.002, total_steps=100, warmup_steps=10, warmup_init_lr=1e-6)
    >>> [round(float(s(i)), 6) for i in (0, 5, 10, 55, 100)]
    [1e-06, 0.001, 0.002, 0.001, 0.0]
    """

    def __init__(
        self,
        peak_lr: float,
        total_steps: int,
        warmup_steps: int = 0,
        warmup_init_lr: float = 0.0,
        min_lr: float = 0.0,
        name: str | None = None,
    ):
        super().__init__()
        if peak_lr <= 0 or warmup_init_lr < 0 or min_lr < 0:
            raise ValueError(
                "peak_lr must be > 0 and warmup_init_lr, min_lr >= 0. Received: "
                f"peak_lr={peak_lr}, warmup_init_lr={warmup_init_lr}, min_lr={min_lr}"
            )
        if total_steps < 1 or not 0 <= warmup_steps <= total_steps:
            raise ValueError(
                "total_steps must be >= 1 and 0 <= warmup_steps <= total_steps. Received: "
                f"total_steps={total_steps}, warmup_steps={warmup_steps}"
            )
        self.peak_lr = float(peak_lr)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.warmup_init_lr = float(warmup_init_lr)
        self.min_lr = float(min_lr)
        self.name = name

    def __call__(self, step):
        step = ops.cast(step, "float32")
        warmup = float(max(self.warmup_steps, 1))
        warm_lr = self.warmup_init_lr + (self.peak_lr - self.warmup_init_lr) * step / warmup
        decay_steps = float(max(self.total_steps - self.warmup_steps, 1))
        t = ops.clip((step - self.warmup_steps) / decay_steps, 0.0, 1.0)
        cos_lr = self.min_lr + 0.5 * (self.peak_lr - self.min_lr) * (1.0 + ops.cos(math.pi * t))
        return ops.where(step < self.warmup_steps, warm_lr, cos_lr)

    def get_config(self):
        return {
            "peak_lr": self.peak_lr,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "warmup_init_lr": self.warmup_init_lr,
            "min_lr": self.min_lr,
            "name": self.name,
        }


@serializable
class ReplannedCosineDecay(keras.optimizers.schedules.LearningRateSchedule):
    """A run's learning rate re-planned at `start_step` for a new end, `total_steps`.

    A run resumed with another length or schedule (`mvit2 train --resume`,
    `train(config, replan=True)`) continues from the rate it has, `start_lr`, instead of
    jumping to wherever the new plan would be at that step:

    ```
    start_step < warmup_steps (the warm-up is not over):
        step < warmup_steps: lr = start_lr + (peak_lr - start_lr) * (step - start_step)
                                            / (warmup_steps - start_step)
        otherwise:           cosine from peak_lr at warmup_steps to min_lr at total_steps
    otherwise:               cosine from start_lr at start_step to min_lr at total_steps
    ```

    with the cosine of `WarmupCosineDecay`; steps before `start_step` get `start_lr`.
    With `start_step=0` and `start_lr=warmup_init_lr` it is `WarmupCosineDecay`.

    Args:
        start_step: int. The optimizer step the run resumes at.
        start_lr: float. The rate there (the old plan's rate at that step).
        total_steps: int. The new last step; the rate reaches `min_lr` there and stays.
        warmup_steps: int. End of the warm-up (a step count from 0, as in
            `WarmupCosineDecay`); ignored when `start_step >= warmup_steps`.
        peak_lr: float. Rate at the end of the warm-up.
        min_lr: float. Final rate.
        name: optional name.

    Example:
    >>> s = ReplannedCosineDecay(start_step=50, start_lr=0.001, total_steps=150,
    ...                          warmup_steps=10, peak_lr=0.002, min_lr=0.0)
    >>> [round(float(s(i)), 6) for i in (0, 50, 100, 150, 200)]
    [0.001, 0.001, 0.0005, 0.0, 0.0]
    """

    def __init__(
        self,
        start_step: int,
        start_lr: float,
        total_steps: int,
        warmup_steps: int,
        peak_lr: float,
        min_lr: float,
        name: str | None = None,
    ):
        super().__init__()
        if start_lr < 0 or peak_lr <= 0 or min_lr < 0:
            raise ValueError(
                "start_lr, min_lr must be >= 0 and peak_lr > 0. Received: "
                f"start_lr={start_lr}, peak_lr={peak_lr}, min_lr={min_lr}"
            )
        if not 0 <= start_step < total_steps or not 0 <= warmup_steps <= total_steps:
            raise ValueError(
                "0 <= start_step < total_steps and 0 <= warmup_steps <= total_steps are "
                f"needed. Received: start_step={start_step}, total_steps={total_steps}, "
                f"warmup_steps={warmup_steps}"
            )
        self.start_step = int(start_step)
        self.start_lr = float(start_lr)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.peak_lr = float(peak_lr)
        self.min_lr = float(min_lr)
        self.name = name

    @property
    def warms_up(self) -> bool:
        """Whether the re-planned rate first rises to `peak_lr` (the warm-up is not over)."""
        return self.start_step < self.warmup_steps

    def __call__(self, step):
        step = ops.maximum(ops.cast(step, "float32"), float(self.start_step))
        if self.warms_up:
            span = float(self.warmup_steps - self.start_step)
            warm_lr = self.start_lr + (self.peak_lr - self.start_lr) * (
                step - self.start_step) / span
            begin, top = self.warmup_steps, self.peak_lr
        else:
            begin, top = self.start_step, self.start_lr
        decay_steps = float(max(self.total_steps - begin, 1))
        t = ops.clip((step - begin) / decay_steps, 0.0, 1.0)
        cos_lr = self.min_lr + 0.5 * (top - self.min_lr) * (1.0 + ops.cos(math.pi * t))
        if not self.warms_up:
            return cos_lr
        return ops.where(step < self.warmup_steps, warm_lr, cos_lr)

    def get_config(self):
        return {
            "start_step": self.start_step,
            "start_lr": self.start_lr,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "peak_lr": self.peak_lr,
            "min_lr": self.min_lr,
            "name": self.name,
        }
