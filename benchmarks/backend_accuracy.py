"""A short Fashion-MNIST run on each Keras backend: does the recipe reach the same accuracy?

    python benchmarks/backend_accuracy.py [--epochs 1] [--image-size 32]
        [--backends tensorflow,jax,torch] [--tensorflow-seeds 0,1]
        [--work /tmp/backend_accuracy] [--out benchmarks/results]

Runs `mvit2 train --config fashion_mnist` (MobileViTV2-0.5 from scratch, the packaged recipe:
AdamW without decay on 1-D weights, warm-up + cosine, label smoothing, clipping, EMA) for
`--epochs` at `--image-size` on each backend, each in a fresh process with `KERAS_BACKEND` set
(TensorFlow and JAX read tf.data, PyTorch numpy / PIL batches), and records the raw and EMA
top-1 on the 10,000 test images from the run's `metrics.json`, with the wall time. TensorFlow
also runs with a second seed: the spread of those two runs is the noise a backend's figure is
judged against (initialization and augmentation draw different numbers on each backend).
Writes ``backend_accuracy.json`` / ``.md`` under `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(backend: str, seed: int, args: argparse.Namespace) -> dict:
    """One `mvit2 train` in a fresh process; returns its figures."""
    run_dir = os.path.join(args.work, f"{backend}_seed{seed}")
    command = [sys.executable, "-m", "keras_mvit2.cli", "train", "--config", "fashion_mnist",
               "-o", run_dir, "--set", "output.resume=false",
               "--set", f"training.epochs={args.epochs}",
               "--set", f"model.image_size={args.image_size}",
               "--set", f"data.seed={seed}", "--set", f"training.seed={seed}"]
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=ROOT)
    start = time.monotonic()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    seconds = time.monotonic() - start
    with open(os.path.join(run_dir, "metrics.json")) as f:
        metrics = json.load(f)["metrics"]
    figures = {"backend": backend, "seed": seed, "wall_s": round(seconds, 1),
               "top1_raw": metrics["raw"]["top1"],
               "top1_ema": metrics.get("ema", {}).get("top1")}
    print(figures, flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--backends", default="tensorflow,jax,torch")
    parser.add_argument("--tensorflow-seeds", default="0,1")
    parser.add_argument("--work", default="/tmp/backend_accuracy")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args()
    runs = []
    for backend in args.backends.split(","):
        seeds = ([int(s) for s in args.tensorflow_seeds.split(",")]
                 if backend == "tensorflow" else [0])
        runs += [run(backend, seed, args) for seed in seeds]
    results = {"epochs": args.epochs, "image_size": args.image_size, "cpus": os.cpu_count(),
               "runs": runs}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "backend_accuracy.json"), "w") as f:
        json.dump(results, f, indent=2)
    lines = [f"Fashion-MNIST, MobileViTV2-0.5 from scratch, {args.epochs} epoch(s) at "
             f"{args.image_size}x{args.image_size}, the packaged recipe; top-1 on the 10,000 "
             "test images.", "", "| backend | seed | top-1 (raw) | top-1 (EMA) | wall time |",
             "|---|---:|---:|---:|---:|"]
    for r in runs:
        ema = "-" if r["top1_ema"] is None else f"{100 * r['top1_ema']:.2f} %"
        lines.append(f"| {r['backend']} | {r['seed']} | {100 * r['top1_raw']:.2f} % | {ema} | "
                     f"{r['wall_s'] / 60:.1f} min |")
    with open(os.path.join(args.out, "backend_accuracy.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
