"""TFLite latency of our MobileViTV2-0.5 (float32, full int8) against the kecam peer (one command).

    python benchmarks/latency.py [--out benchmarks/results/latency.json]
        [--rounds 40] [--invokes 5] [--weights trained|random] [--keras-model PATH.keras]

Batch 1, 256x256, 1 thread, ``ai_edge_litert``; every model once with its default
delegate (XNNPACK) and once without (``BUILTIN_WITHOUT_DEFAULT_DELEGATES``). All twelve
interpreters are timed in interleaved rounds (A B C D ..., A B C D ..., each round
`--invokes` invokes of each), so load changes on a shared machine hit all of them alike;
the table reports medians of all invokes of the invoking thread's CPU time (with one
interpreter thread the kernels run in it, so this leaves out the time the machine made it
wait; wall-clock medians beside), the interquartile range and the ratios ours / peer
from this one run.

Our models: MobileViTV2-0.5 converted with `keras_mvit2.export.to_tflite` (float32, and
full int8 with int8 I/O like the peer), as shipped (back-to-back 1x1 convolutions fused,
`keras_mvit2.export.tflite.pointwise_fusion`) and with ``fuse_pointwise=False`` (``*_unfused``:
the converter's graph op for op), so the run shows what the fusion is worth. Weights
(latency does not depend on them, int8 calibration does): by default the model is
trained for `--train-steps` steps on Fashion-MNIST at 32x32 (1000-class head, as the
peer) and the weights are moved to the 256x256 model (MobileViTv2 has no size-dependent
weights); int8 is calibrated on Fashion-MNIST training images at 256x256.
``--weights random`` uses variance-preserving random weights with perturbed BN/GN
statistics instead, calibrated on the same images; ``--keras-model`` uses a trained
`.keras` model.

Peers: ``/work/shared/anchors/kecam_mobilevit_v2_050_{fp32,int8}.tflite`` (kecam 1.4.3's
MobileViT_V2_050, random weights, int8 I/O; see the anchors README).

Bars (issue 5): our int8 <= 0.55x kecam int8, our float32 <= 0.9x kecam float32.

Ratios: ours / kecam for float32 and int8 (the bars), the unfused models / kecam, and
int8 / float32 of each. Recorded: CPU model, cores, load average before/after, versions,
and per model its XNNPACK partition count, the ops left outside XNNPACK, and the float ops (int8).
Prints a table and writes JSON (atomically).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time

import numpy as np

INT8_BAR = 0.55
FP32_BAR = 0.90
SIZE = 256
ANCHOR_DIRS = ("/work/shared/anchors",)


# --------------------------------------------------------------------------------------
# Environment


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("ai-edge-litert", "tensorflow", "keras", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def environment() -> dict:
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "affinity_cores": (
            len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        ),
        "platform": platform.platform(),
        "versions": _versions(),
        "loadavg_before": list(os.getloadavg()),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


# --------------------------------------------------------------------------------------
# Our models


def _fashion_mnist(split: str, n: int, offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    from keras_mvit2.data import load_fashion_mnist_arrays

    x, y = load_fashion_mnist_arrays(split)
    return x[offset : offset + n], y[offset : offset + n].astype("int64")


def _rgb(images: np.ndarray, size: int) -> np.ndarray:
    import tensorflow as tf

    out = []
    for i in range(0, len(images), 64):
        x = tf.image.resize(images[i : i + 64, ..., None].astype("float32") / 255.0,
                            (size, size), "bilinear")
        out.append(np.repeat(np.clip(np.asarray(x), 0.0, 1.0), 3, axis=-1))
    return np.concatenate(out)


def _perturb(model, seed: int = 0) -> None:
    """Random BN statistics / affine and GN1 affine, so activations do not vanish."""
    import keras

    from keras_mvit2.layers import GroupNorm1

    rng = np.random.default_rng(seed)
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, keras.layers.BatchNormalization):
            c = layer.gamma.shape[0]
            layer.gamma.assign(rng.uniform(0.5, 1.5, c).astype("float32"))
            layer.beta.assign(rng.normal(0.0, 0.05, c).astype("float32"))
            layer.moving_mean.assign(rng.normal(0.0, 0.05, c).astype("float32"))
            layer.moving_variance.assign(rng.uniform(0.5, 2.0, c).astype("float32"))
        elif isinstance(layer, GroupNorm1):
            c = layer.gamma.shape[0]
            layer.gamma.assign(rng.uniform(0.5, 1.5, c).astype("float32"))
            layer.beta.assign(rng.normal(0.0, 0.05, c).astype("float32"))


def build_our_model(args, log) -> tuple[object, str]:
    """The 256x256 MobileViTV2-0.5 (1000 classes) and a description of its weights."""
    import keras

    import keras_mvit2 as mv

    model = mv.MobileViTV2(0.5, input_shape=(SIZE, SIZE, 3), classes=1000)
    if args.keras_model:
        trained = keras.models.load_model(args.keras_model, compile=False)
        model = mv.MobileViTV2(
            0.5, input_shape=(SIZE, SIZE, 3), classes=int(trained.outputs[0].shape[-1])
        )
        model.set_weights(trained.get_weights())
        return model, f"trained weights from {args.keras_model}"
    if args.weights == "random":
        keras.utils.set_random_seed(0)
        _perturb(model)
        return model, "variance-preserving random init with perturbed BN/GN statistics (seed 0)"
    steps, batch = args.train_steps, 64
    log(f"training MobileViTV2-0.5 at 32x32 on Fashion-MNIST for {steps} steps ...")
    x, y = _fashion_mnist("train", steps * batch)
    keras.utils.set_random_seed(0)
    small = mv.MobileViTV2(0.5, input_shape=(32, 32, 3), classes=1000)
    optimizer = keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(3e-3, steps, 0.05))
    small.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    optimizer.build(small.trainable_variables)
    start = time.perf_counter()
    small.fit(_rgb(x, 32), y, batch_size=batch, epochs=1, verbose=0)
    xt, yt = _fashion_mnist("test", 1000)
    accuracy = float(small.evaluate(_rgb(xt, 32), yt, verbose=0)[1])
    log(f"  trained in {time.perf_counter() - start:.0f} s, test accuracy {accuracy:.3f} at 32x32")
    model.set_weights(small.get_weights())
    return model, (
        f"trained {steps} steps x {batch} on Fashion-MNIST at 32x32 (test accuracy "
        f"{accuracy:.3f}), weights moved to the 256x256 model"
    )


def convert_ours(model, out_dir: str, num_calibration: int, log) -> dict[str, str]:
    from keras_mvit2.export import to_tflite

    calib_raw, _ = _fashion_mnist("train", num_calibration, offset=50_000)
    calibration = _rgb(calib_raw, SIZE)
    paths = {}
    for suffix, fuse in (("", True), ("_unfused", False)):
        log(f"converting ours{suffix}: float32 ...")
        paths[f"ours_fp32{suffix}"] = to_tflite(
            model, os.path.join(out_dir, f"ours_fp32{suffix}.tflite"), fuse_pointwise=fuse
        ).path
        log(f"converting ours{suffix}: full int8 (int8 I/O, {num_calibration} calibration "
            "images) ...")
        paths[f"ours_int8{suffix}"] = to_tflite(
            model, os.path.join(out_dir, f"ours_int8{suffix}.tflite"), quantization="int8",
            io_dtype="int8", representative_data=calibration, fuse_pointwise=fuse,
        ).path
    return paths


# --------------------------------------------------------------------------------------
# Timing


def time_interleaved(configs: dict[str, tuple[str, bool]], rounds: int, invokes: int,
                     warmup: int):
    """Thread-CPU and wall ms per invoke for each config (`keras_mvit2.latency` harness)."""
    from keras_mvit2.latency.host import make_interpreter, measure_interleaved

    interpreters = {name: make_interpreter(path, threads=1, xnnpack=xnn)
                    for name, (path, xnn) in configs.items()}
    return measure_interleaved(interpreters, runs=rounds * invokes, warmup=warmup,
                               rounds=rounds)


def _stats(samples) -> dict:
    """Medians of the calling thread's CPU time (the latency on an idle core: a shared
    machine's waits are left out) and, beside it, of the wall clock."""
    a = np.asarray(samples.cpu_ms)
    q1, median, q3 = np.percentile(a, [25, 50, 75])
    return {"median_ms": float(median), "q1_ms": float(q1), "q3_ms": float(q3),
            "min_ms": float(a.min()), "wall_median_ms": float(np.median(samples.wall_ms)),
            "runs": len(a)}


def _outside_xnnpack_elements(path: str) -> dict[str, int]:
    """Op name -> output elements computed outside XNNPACK (a cost proxy for the ops that
    run on the plain TFLite kernels; walks back from the outputs like `inspect_tflite`)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=path, num_threads=1)
    interpreter.allocate_tensors()
    sizes = {t["index"]: int(np.prod(t["shape"])) for t in interpreter.get_tensor_details()}
    ops = interpreter._get_ops_details()
    producer = {int(t): op for op in ops for t in op["outputs"]}
    elements: dict[str, int] = {}
    seen: set[int] = set()
    stack = [int(d["index"]) for d in interpreter.get_output_details()]
    while stack:
        op = producer.get(stack.pop())
        if op is None or op["index"] in seen:
            continue
        seen.add(op["index"])
        if op["op_name"] != "DELEGATE":
            count = sum(sizes.get(int(t), 0) for t in op["outputs"])
            elements[op["op_name"]] = elements.get(op["op_name"], 0) + count
        stack.extend(int(t) for t in op["inputs"] if t >= 0)
    return dict(sorted(elements.items(), key=lambda kv: -kv[1]))


def _model_info(path: str) -> dict:
    from keras_mvit2.export import inspect_tflite

    report = inspect_tflite(path)
    metadata = report.metadata or {}
    return {
        "graph_optimizations": metadata.get("graph_optimizations"),
        "path": os.path.abspath(path),
        "size_bytes": report.size_bytes,
        "num_ops": report.num_ops,
        "xnnpack_partitions": report.num_xnnpack_partitions,
        "ops_in_xnnpack": report.num_ops_in_xnnpack,
        "ops_outside_xnnpack": report.ops_outside_xnnpack,
        "outside_xnnpack_output_elements": _outside_xnnpack_elements(path),
        "float_ops": report.float_ops,
        "input_dtype": report.inputs[0].dtype,
        "op_histogram": report.op_histogram,
    }


# --------------------------------------------------------------------------------------


def _find_anchor(name: str, override: str | None) -> str:
    if override:
        return override
    here = os.path.dirname(os.path.abspath(__file__))
    for root in (os.path.join(here, "..", "..", "shared", "anchors"),
                 os.path.join(here, "..", "shared", "anchors"), *ANCHOR_DIRS):
        path = os.path.join(root, name)
        if os.path.exists(path):
            return os.path.abspath(path)
    raise FileNotFoundError(
        f"Peer model {name} not found in shared/anchors; pass --peer-fp32/--peer-int8."
    )


def _table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    env = result["environment"]
    table = Table(title=(
        f"TFLite latency, batch 1, {SIZE}x{SIZE}, 1 thread, ai_edge_litert "
        f"{env['versions']['ai-edge-litert']} ({env['cpu']}, {env['cores']} cores, load "
        f"{env['loadavg_before'][0]:.1f} -> {env['loadavg_after'][0]:.1f})"
    ))
    for column in ("model", "XNNPACK median ms (IQR), CPU", "wall", "no XNNPACK median ms",
                   "XNNPACK partitions", "ops outside XNNPACK", "size MB"):
        table.add_column(column)
    for name, row in result["models"].items():
        x, n = row["xnnpack"], row["no_xnnpack"]
        outside = row["info"]["ops_outside_xnnpack"] or {}
        table.add_row(
            name,
            f"{x['median_ms']:.2f} ({x['q1_ms']:.2f}-{x['q3_ms']:.2f})",
            f"{x['wall_median_ms']:.2f}",
            f"{n['median_ms']:.2f}",
            str(row["info"]["xnnpack_partitions"]),
            ", ".join(f"{k} {v}" for k, v in outside.items()) or "0",
            f"{row['info']['size_bytes'] / 1e6:.2f}",
        )
    console = Console()
    console.print(table)
    for name, row in result["models"].items():
        elements = row["info"]["outside_xnnpack_output_elements"]
        if elements:
            console.print(f"{name}: output elements computed outside XNNPACK: " + ", ".join(
                f"{k} {v:,}" for k, v in elements.items()))
    for key, ratio in result["ratios"].items():
        verdict = "" if ratio["bar"] is None else (
            f"; bar <= {ratio['bar']} -> {'PASS' if ratio['pass'] else 'MISS'}")
        console.print(
            f"{key}: {ratio['value']:.3f} (no XNNPACK {ratio['no_xnnpack']:.3f}){verdict}"
        )


def main(argv: list[str] | None = None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(here, "results", "latency.json"))
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--invokes", type=int, default=5, help="invokes per model per round")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--weights", choices=("trained", "random"), default="trained")
    parser.add_argument("--train-steps", type=int, default=160)
    parser.add_argument("--keras-model", help="use this trained .keras model's weights")
    parser.add_argument("--num-calibration", type=int, default=200)
    parser.add_argument("--peer-fp32")
    parser.add_argument("--peer-int8")
    parser.add_argument("--models-dir", help="keep the converted .tflite files here")
    args = parser.parse_args(argv)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    env = environment()
    peers = {
        "kecam_fp32": _find_anchor("kecam_mobilevit_v2_050_fp32.tflite", args.peer_fp32),
        "kecam_int8": _find_anchor("kecam_mobilevit_v2_050_int8.tflite", args.peer_int8),
    }
    with tempfile.TemporaryDirectory(prefix="mvit2_latency_") as tmp:
        out_dir = args.models_dir or tmp
        os.makedirs(out_dir, exist_ok=True)
        model, weights = build_our_model(args, log)
        ours = convert_ours(model, out_dir, args.num_calibration, log)
        order = {**ours, **peers}
        configs = {}
        for name, path in order.items():
            configs[f"{name}|xnnpack"] = (path, True)
            configs[f"{name}|no_xnnpack"] = (path, False)
        log(f"timing {len(configs)} interpreters: {args.rounds} interleaved rounds x "
            f"{args.invokes} invokes ...")
        times = time_interleaved(configs, args.rounds, args.invokes, args.warmup)
        models = {
            name: {
                "xnnpack": _stats(times[f"{name}|xnnpack"]),
                "no_xnnpack": _stats(times[f"{name}|no_xnnpack"]),
                "info": _model_info(path),
            }
            for name, path in order.items()
        }
    env["loadavg_after"] = list(os.getloadavg())

    def ratio(a: str, b: str, bar: float | None = None) -> dict:
        value = models[a]["xnnpack"]["median_ms"] / models[b]["xnnpack"]["median_ms"]
        no_xnn = models[a]["no_xnnpack"]["median_ms"] / models[b]["no_xnnpack"]["median_ms"]
        return {"value": value, "no_xnnpack": no_xnn, "bar": bar,
                "pass": None if bar is None else value <= bar}

    result = {
        "benchmark": "keras_mvit2 TFLite latency vs kecam (issue 5)",
        "settings": {"batch": 1, "input": [SIZE, SIZE, 3], "threads": 1,
                     "rounds": args.rounds, "invokes_per_round": args.invokes,
                     "warmup": args.warmup,
                     "statistic": "median of all invokes, thread CPU time (wall beside)",
                     "order": f"interleaved rounds over all {len(configs)} interpreters"},
        "our_weights": weights,
        "environment": env,
        "models": models,
        "ratios": {
            "ours_int8 / kecam_int8": ratio("ours_int8", "kecam_int8", INT8_BAR),
            "ours_fp32 / kecam_fp32": ratio("ours_fp32", "kecam_fp32", FP32_BAR),
            "ours_int8_unfused / kecam_int8": ratio("ours_int8_unfused", "kecam_int8"),
            "ours_fp32_unfused / kecam_fp32": ratio("ours_fp32_unfused", "kecam_fp32"),
            "ours_fp32 / ours_fp32_unfused": ratio("ours_fp32", "ours_fp32_unfused"),
            "ours_int8 / ours_int8_unfused": ratio("ours_int8", "ours_int8_unfused"),
            "ours_int8 / ours_fp32": ratio("ours_int8", "ours_fp32", 1.0),
            "kecam_int8 / kecam_fp32": ratio("kecam_int8", "kecam_fp32", 1.0),
        },
    }
    from keras_mvit2.utils.files import write_json

    write_json(args.out, result)
    _table(result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
