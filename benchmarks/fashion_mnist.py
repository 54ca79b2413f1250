"""Fashion-MNIST from scratch with MobileViTV2-0.5 on CPU: the packaged recipe, timed.

    python benchmarks/fashion_mnist.py [--threads 2] [--set key=value ...]
        [--run-dir runs/fashion_mnist_benchmark] [--out benchmarks/results]

Runs `keras_mvit2.training.train` on the packaged `fashion_mnist` config (the stock
`mobilevitv2_050` builder, float32, 60,000 training images, validation = the 10,000 test
images) from scratch (`output.resume=false`), with TensorFlow limited to `--threads`
threads, and records the test accuracy of the raw and the EMA weights, wall time,
process CPU time (user + system, all threads), training images / second, and the
environment: TensorFlow version, CPU count, and the load average at the start, at the end
and sampled every 30 s during the run (on a shared machine other processes inflate the
wall time; CPU time / threads is what the run would take on idle cores at full use).
The bar: test accuracy >= 92.0 % within 60 minutes of wall time on 2 CPU cores.

Writes ``fashion_mnist.json`` (with the per-epoch history and per-class accuracy),
``fashion_mnist.md`` and ``fashion_mnist_confusion_matrix.png`` (the better of raw / EMA).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BAR_ACCURACY = 0.92
BAR_MINUTES = 60.0


class LoadSampler(threading.Thread):
    """Samples `os.getloadavg()` (1-minute average) every `interval` seconds."""

    def __init__(self, interval: float = 30.0):
        super().__init__(daemon=True)
        self.interval, self.samples = interval, []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> list[float]:
        self._stop_event.set()
        self.join()
        return self.samples


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _markdown(r: dict) -> str:
    m, e, c = r["metrics"], r["environment"], r["config"]
    load = r["load_average"]
    lines = [
        f"Fashion-MNIST, {c['model']['name']} from scratch at {c['model']['image_size']}x"
        f"{c['model']['image_size']}, {c['training']['epochs']} epochs, batch "
        f"{c['data']['batch_size']}, float32 on CPU ({e['threads']} TensorFlow threads, "
        f"{e['cpu_count']} CPUs); test set = the 10,000 official test images.",
        "",
        "| weights | test top-1 (%) | test top-5 (%) |",
        "|---|---|---|",
    ]
    for name in ("raw", "ema"):
        if name in m:
            lines.append(f"| {name} | {100 * m[name]['top1']:.2f} | {100 * m[name]['top5']:.2f} |")
    lines += [
        "",
        "| wall (min) | process CPU (min) | CPU / threads (min) | train images/s | "
        "load avg start / mean / end | bar met |",
        "|---|---|---|---|---|---|",
        f"| {r['wall_seconds'] / 60:.1f} | {r['cpu_seconds'] / 60:.1f} | "
        f"{r['cpu_seconds'] / e['threads'] / 60:.1f} | {r['images_per_second']:.1f} | "
        f"{load['start'][0]:.2f} / {load['mean']:.2f} / {load['end'][0]:.2f} | "
        f"{'yes' if r['bar']['met'] else 'no'} (>= {100 * BAR_ACCURACY:.1f} % in <= "
        f"{BAR_MINUTES:.0f} min wall) |",
        "",
        f"TensorFlow {e['tensorflow']}, Keras {e['keras']}, Python {e['python']}, "
        f"{e['processor']}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="fashion_mnist", help="config name or YAML")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="config override (quick looks only)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--run-dir", default=os.path.join("runs", "fashion_mnist_benchmark"))
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)

    load_start = os.getloadavg()
    wall_start, cpu_start = time.perf_counter(), _cpu_seconds()
    sampler = LoadSampler()
    sampler.start()

    import keras
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)

    from keras_mvit2 import training
    from keras_mvit2.utils.files import atomic_output, write_text

    config = training.load_config(args.config, [
        *args.overrides, f"output.dir={json.dumps(args.run_dir)}", "output.resume=false",
        "output.verbose=2"])
    result = training.train(config)
    wall, cpu = time.perf_counter() - wall_start, _cpu_seconds() - cpu_start
    samples = sampler.stop()
    load_end = os.getloadavg()

    metrics = {k: v.to_dict() for k, v in result.metrics.items()}
    best = max(result.metrics.values(), key=lambda v: v.top1)
    report = {
        "benchmark": "fashion_mnist",
        "config": config.to_dict(),
        "overrides": args.overrides,
        "metrics": metrics,
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "images_per_second": result.images_per_second,
        "history": result.history,
        "bar": {"accuracy": BAR_ACCURACY, "wall_minutes": BAR_MINUTES,
                "met": best.top1 >= BAR_ACCURACY and wall <= 60 * BAR_MINUTES},
        "load_average": {"start": load_start, "end": load_end, "samples": samples,
                         "mean": statistics.mean(samples) if samples else load_end[0]},
        "environment": {
            "tensorflow": tf.__version__, "keras": keras.__version__,
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
            "threads": args.threads,
        },
        "run_dir": os.path.abspath(args.run_dir),
    }
    os.makedirs(args.out, exist_ok=True)
    with atomic_output(os.path.join(args.out, "fashion_mnist.json")) as tmp, \
            open(tmp, "w") as f:
        json.dump(report, f, indent=1)
    text = _markdown(report)
    write_text(os.path.join(args.out, "fashion_mnist.md"), text)
    training.plot_confusion_matrix(
        best, os.path.join(args.out, "fashion_mnist_confusion_matrix.png"),
        title=f"Fashion-MNIST test, MobileViTV2-0.5: top-1 {100 * best.top1:.2f} %")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
