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
