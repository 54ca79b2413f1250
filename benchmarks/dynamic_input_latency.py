"""Keras inference latency of one dynamic-size MobileViTV2 against the fixed-size model.

    python benchmarks/dynamic_input_latency.py [--width 0.5] [--runs 20] [--rounds 10]
        [--batch 1] [--sizes 256x256 193x201] [--out benchmarks/results]

The same weights in two models: `MobileViTV2(w, input_shape=(None, None, 3))` and
`MobileViTV2(w, input_shape=(H, W, 3))`. Each is called through a `tf.function`
(inference, `training=False`), interleaved call by call in the same process (one call of
every variant, in a rotating order, `--rounds x --runs` times), so each call is compared
with the static call made next to it under the same load. Variants per size:

- `static`: the fixed-size model, traced for `(batch, H, W, 3)`;
- `dynamic_traced_at_size`: the dynamic model traced for `(batch, H, W, 3)`, what
  `model.predict` / `model(x)` do for a batch of one size (the blocks see static
  shapes, the graph is the static one);
- `dynamic_any_size`: the dynamic model traced ONCE for `(None, None, None, 3)`: the
  shape-generic graph (patch grid from the runtime shape, the odd-side resize behind a
  `tf.cond`) that serves every size without retracing.

Writes ``dynamic_input_latency.json`` (medians, quartiles, ratios to `static`) and
``dynamic_input_latency.md`` (the table).
"""

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np


def _parse_size(text: str) -> tuple[int, int]:
    height, _, width = text.lower().partition("x")
    return int(height), int(width or height)


def _quartiles(samples: list[float]) -> tuple[float, float, float]:
    q = np.percentile(np.asarray(samples), [25, 50, 75])
    return float(q[0]), float(q[1]), float(q[2])


def run(width: float, sizes: list[tuple[int, int]], batch: int, runs: int, rounds: int,
        warmup: int, log=print) -> dict:
    import keras
    import tensorflow as tf

    import keras_mvit2 as mv

    keras.utils.set_random_seed(0)
    dynamic = mv.MobileViTV2(width, input_shape=(None, None, 3), classifier_activation=None)
    generic = tf.function(lambda x: dynamic(x, training=False),
                          input_signature=[tf.TensorSpec((None, None, None, 3), tf.float32)])
    rows = []
    for height, width_px in sizes:
        static = mv.MobileViTV2(width, input_shape=(height, width_px, 3),
                                classifier_activation=None)
        static.set_weights(dynamic.get_weights())
        spec = [tf.TensorSpec((batch, height, width_px, 3), tf.float32)]
        variants = {
            "static": tf.function(lambda x, m=static: m(x, training=False), input_signature=spec),
            "dynamic_traced_at_size": tf.function(lambda x: dynamic(x, training=False),
                                                  input_signature=spec),
            "dynamic_any_size": generic,
        }
        x = tf.constant(np.random.default_rng(0).random((batch, height, width_px, 3), "float32"))
        reference = variants["static"](x).numpy()
        for name, fn in variants.items():  # trace, warm up, and check they agree
            for _ in range(warmup):
                out = fn(x)
            diff = float(np.abs(out.numpy() - reference).max())
            if diff > 1e-4:
                raise RuntimeError(f"{name} differs from the static model by {diff:.2e}")
        samples = {name: [] for name in variants}
        names = list(variants)
        for i in range(rounds * runs):
            # One call of every variant back to back, in a rotating order: the calls of a
            # triple share the machine's load, so their ratios are paired measurements.
            for name in names[i % len(names):] + names[:i % len(names)]:
                start = time.perf_counter()
                variants[name](x).numpy()
                samples[name].append((time.perf_counter() - start) * 1e3)
        static = np.asarray(samples["static"])
        for name, times in samples.items():
            q1, median, q3 = _quartiles(times)
            ratio = float(np.median(np.asarray(times) / static))
            row = {"size": f"{height}x{width_px}", "variant": name, "batch": batch,
                   "median_ms": median, "q1_ms": q1, "q3_ms": q3, "min_ms": float(min(times)),
                   "samples": len(times), "ratio_to_static": ratio,
                   "ratio_of_medians": median / statistics.median(samples["static"])}
            rows.append(row)
            log(f"{row['size']} {name:24s} median {median:7.2f} ms (IQR {q1:.2f}-{q3:.2f}, "
                f"min {row['min_ms']:.2f}), paired ratio x{ratio:.3f} of static")
    return {
        "model": f"MobileViTV2-{width}",
        "batch": batch,
        "runs_per_round": runs,
        "rounds": rounds,
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "rows": rows,
    }


def markdown(result: dict) -> str:
    lines = [
        f"{result['model']}, batch {result['batch']}, Keras (TF {result['tensorflow']}) "
        f"inference through `tf.function`, {result['rounds']} interleaved rounds x "
        f"{result['runs_per_round']} runs per variant, {result['cpu_count']} CPUs.",
        "",
        "`/ static` is the median of the paired ratios (each call against the static call",
        "made next to it); `min` is the fastest call.",
        "",
        "| size | variant | median ms | IQR ms | min ms | / static |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        lines.append(f"| {row['size']} | {row['variant']} | {row['median_ms']:.2f} | "
                     f"{row['q1_ms']:.2f}-{row['q3_ms']:.2f} | {row['min_ms']:.2f} | "
                     f"{row['ratio_to_static']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=float, default=0.5)
    parser.add_argument("--sizes", nargs="+", default=["256x256", "193x201"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(here, "results"))
    args = parser.parse_args(argv)
    result = run(args.width, [_parse_size(s) for s in args.sizes], args.batch, args.runs,
                 args.rounds, args.warmup)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dynamic_input_latency.json"), "w") as f:
        json.dump(result, f, indent=2)
    table = markdown(result)
    with open(os.path.join(args.out, "dynamic_input_latency.md"), "w") as f:
        f.write(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
