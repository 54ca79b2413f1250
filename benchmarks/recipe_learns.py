"""A few hundred steps of the packaged Fashion-MNIST recipe learn: the bars, over seeds.

    python benchmarks/recipe_learns.py [--seeds 0 1 2 3] [--out benchmarks/results]

The convergence check that was a slow test (tests/test_training.py, 167 s on CI's host):
MobileViTV2-0.5 from scratch at 32x32 on the first 12,000 training images, 3 epochs of
100 steps of 32 (300 steps), validated on the first 1,000 test images; one run per seed
(`data.seed` and `training.seed`). The bars, per seed: the loss starts near chance
(mean of the first 20 steps > 2.0, ~ln 10), its mean over the last 50 steps is below
0.6x that, and the test top-1 of the raw and the EMA weights is above 0.5 (chance is
0.1: a broken pipeline, such as shuffled labels, a wrong normalization or no learning,
stays near it). Measured over seeds 0-3 (2026-11-28, 2 shared cores): last / first loss
0.47-0.51, raw top-1 0.695-0.759, EMA 0.702-0.762; 91-590 s a seed, with the load.

Writes ``recipe_learns.json`` (per seed: the figures, wall seconds, each bar) and
``recipe_learns.md`` (the table) to ``--out``; exits 1 if a seed misses a bar.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

#: The recipe's overrides: the short run (what the test trained).
OVERRIDES = [
    "model.image_size=32",
    "data.train_limit=12000", "data.validation_limit=1000", "data.batch_size=32",
    "training.epochs=3", "training.steps_per_epoch=100", "training.validate_every=0",
    "schedule.warmup_epochs=0.3", "optimizer.reference_batch_size=32", "ema.decay=0.99",
    "output.verbose=0", "output.tensorboard=false",
]
#: The bars: first-20-step mean loss above, last-50 / first-20 below, test top-1 above.
BAR_FIRST_LOSS, BAR_LOSS_RATIO, BAR_TOP1 = 2.0, 0.6, 0.5


def run_seed(seed: int, run_dir: str) -> dict:
    """One short run of the recipe at `seed`: its figures and whether each bar holds."""
    import keras
    import numpy as np

    from keras_mvit2 import training

    class StepLosses(keras.callbacks.Callback):
        """Per-step losses from Keras' running epoch mean."""

        def __init__(self):
            super().__init__()
            self.losses, self._mean, self._k = [], 0.0, 0

        def on_epoch_begin(self, epoch, logs=None):
            self._mean, self._k = 0.0, 0

        def on_train_batch_end(self, batch, logs=None):
            mean = float(logs["loss"])
            self._k += 1
            self.losses.append(self._k * mean - (self._k - 1) * self._mean)
            self._mean = mean

    config = training.load_config("fashion_mnist", [
        *OVERRIDES, f"data.seed={seed}", f"training.seed={seed}", f"output.dir={run_dir}"])
    steps = StepLosses()
    start = time.perf_counter()
    result = training.train(config, callbacks=[steps])
    wall = time.perf_counter() - start
    losses = np.array(steps.losses)
    first, last = float(losses[:20].mean()), float(losses[-50:].mean())
    raw, ema = result.metrics["raw"].top1, result.metrics["ema"].top1
    bars = {"steps": len(losses) == 300 and bool(np.isfinite(losses).all()),
            "first_loss": first > BAR_FIRST_LOSS,
            "loss_ratio": last < BAR_LOSS_RATIO * first,
            "raw_top1": raw > BAR_TOP1, "ema_top1": ema > BAR_TOP1,
            "num_examples": result.metrics["raw"].num_examples == 1000}
    return {"seed": seed, "first_loss": first, "last_loss": last, "raw_top1": raw,
            "ema_top1": ema, "images_per_second": result.images_per_second,
            "wall_seconds": wall, "bars": bars, "met": all(bars.values())}


def _markdown(runs: list[dict]) -> str:
    lines = [
        "Fashion-MNIST recipe, MobileViTV2-0.5 from scratch at 32x32, 300 steps of 32 "
        "(12,000 training images), test top-1 on 1,000 test images.",
        "",
        "| seed | loss first 20 | loss last 50 | ratio | raw top-1 | EMA top-1 | wall (s) "
        "| bars met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        missed = ", ".join(k for k, v in r["bars"].items() if not v)
        lines.append(
            f"| {r['seed']} | {r['first_loss']:.3f} | {r['last_loss']:.3f} | "
            f"{r['last_loss'] / r['first_loss']:.2f} | {r['raw_top1']:.3f} | "
            f"{r['ema_top1']:.3f} | {r['wall_seconds']:.0f} | "
            f"{'yes' if r['met'] else 'no: ' + missed} |")
    lines += ["", f"Bars: first-20 loss > {BAR_FIRST_LOSS}, last-50 < {BAR_LOSS_RATIO}x "
              f"first-20, raw and EMA top-1 > {BAR_TOP1}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)

    from keras_mvit2.utils.files import atomic_output, write_text

    runs = []
    with tempfile.TemporaryDirectory(prefix="keras_mvit2_recipe_") as tmp:
        for seed in args.seeds:
            runs.append(run_seed(seed, os.path.join(tmp, f"seed{seed}")))
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "bars"}), flush=True)
    os.makedirs(args.out, exist_ok=True)
    report = {"benchmark": "recipe_learns", "overrides": OVERRIDES,
              "bars": {"first_loss": BAR_FIRST_LOSS, "loss_ratio": BAR_LOSS_RATIO,
                       "top1": BAR_TOP1},
              "runs": runs, "met": all(r["met"] for r in runs)}
    with atomic_output(os.path.join(args.out, "recipe_learns.json")) as tmp, \
            open(tmp, "w") as f:
        json.dump(report, f, indent=1)
    text = _markdown(runs)
    write_text(os.path.join(args.out, "recipe_learns.md"), text)
    print(text)
    return 0 if report["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
