"""The two roads to a `.tflite` and to a Core ML `.mlpackage` on the same weights:
TensorFlow's converters and PyTorch's (litert-torch; torch.export + coremltools), one command.

    python benchmarks/export_roads.py [--size 256] [--rounds 60] [--out benchmarks/results]

MobileViTV2-0.5 (1000 classes, seeded weights with perturbed norms: batch-norm statistics,
every norm's scale and shift) at SIZE x SIZE is saved
as `.weights.h5`, exported here by the TensorFlow road (`to_tflite`, float32 and float16),
and by the PyTorch road in a ``KERAS_BACKEND=torch`` process (`to_tflite_via_torch`,
float32 and float16: litert-torch, then ai-edge-quantizer's float casting) from those weights.
Writes ``export_roads.json`` and ``export_roads.md``: per file the op histogram, the size, the
max |output - Keras| over 8 images (relative to the largest |logit|), the max difference
between the two roads' float32 files, and the LiteRT latency at 1 thread (XNNPACK), the two
float32 files timed interleaved in one process (medians of ROUNDS x 5 invokes each) and
given as a ratio. The Core ML packages (float32 and float16, logits output, by
`to_coreml` here and `to_coreml_via_torch` in the same torch process) are compared by the op
histogram of their MIL program, their size, and their outputs against Keras, computed on
Linux by running each package's own MIL program with its own weights
(`predict_with_package_weights`; Core ML predicts only on macOS): exact for float32, float16
weights with float32 activations for float16. With the coreai extra, the torch process also
writes a Core AI `.aimodel` (size, op histogram, conversion time; Core AI runs only on macOS).
"""

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGES = 8


def _torch_worker(weights: str, size: int, folder: str) -> None:
    """Runs under KERAS_BACKEND=torch: the torch road's files, and Keras' outputs there."""
    import numpy as np

    import keras_mvit2 as mv

    model = mv.MobileViTV2(0.5, input_shape=(size, size, 3), classes=1000,
                           classifier_activation=None, weights=None)
    model.load_weights(weights)
    with np.load(os.path.join(folder, "x.npz")) as data:
        x = data["x"]
    np.save(os.path.join(folder, "keras_torch.npy"), model.predict(x, batch_size=len(x),
                                                                    verbose=0))
    target = mv.export.get_target("tflite")
    seconds = {}
    for quantization in ("float32", "float16"):
        start = time.perf_counter()
        target.convert(model, os.path.join(folder, f"torch_{quantization}.tflite"),
                       quantization=quantization, road="torch")
        seconds[quantization] = time.perf_counter() - start
    coreml = mv.export.get_target("coreml")
    for quantization in ("float32", "float16"):
        start = time.perf_counter()
        coreml.convert(model, os.path.join(folder, f"torch_{quantization}.mlpackage"),
                       quantization=quantization, road="torch")
        seconds[f"coreml_{quantization}"] = time.perf_counter() - start
    if importlib.util.find_spec("coreai_torch") is not None:  # the coreai extra
        start = time.perf_counter()
        asset = mv.export.get_target("coreai").convert(model, os.path.join(
            folder, "torch_float32.aimodel"))
        seconds["coreai"] = time.perf_counter() - start
        seconds["coreai_report"] = {
            "size_bytes": asset.size_bytes, "num_ops": asset.num_ops,
            "op_histogram": dict(sorted(asset.op_histogram.items())),
            "storage_types": asset.storage_types, "minimum_os": asset.minimum_os,
            "converter": json.loads(asset.metadata["keras_mvit2.converter"])}
    with open(os.path.join(folder, "torch_seconds.json"), "w") as f:
        json.dump({**seconds, "tensorflow_imported": "tensorflow" in sys.modules}, f)


def _interleaved_latency(paths: dict[str, str], x, rounds: int, per_round: int = 5,
                         warmup: int = 10) -> dict[str, float]:
    """Median ms of one invoke per file, 1 thread, the files alternating each round."""
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter

    interpreters = {}
    for key, path in paths.items():
        interpreter = Interpreter(model_path=path, num_threads=1)
        interpreter.allocate_tensors()
        interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x[:1])
        for _ in range(warmup):
            interpreter.invoke()
        interpreters[key] = interpreter
    times = {key: [] for key in paths}
    for _ in range(rounds):
        for key, interpreter in interpreters.items():
            for _ in range(per_round):
                start = time.perf_counter()
                interpreter.invoke()
                times[key].append((time.perf_counter() - start) * 1e3)
    return {key: float(np.median(t)) for key, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=60, help="interleaved timing rounds")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--torch-worker", nargs=3, metavar=("WEIGHTS", "SIZE", "FOLDER"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.torch_worker:
        weights, size, folder = args.torch_worker
        _torch_worker(weights, int(size), folder)
        return 0

    import keras
    import numpy as np

    import keras_mvit2 as mv
    from keras_mvit2.export import (
        inspect_coreml,
        inspect_tflite,
        read_tflite_metadata,
        run_tflite,
        to_coreml,
        to_tflite,
    )
    from keras_mvit2.export.coreml import measurement_kind, predict_with_package_weights

    size = args.size
    keras.utils.set_random_seed(0)
    model = mv.MobileViTV2(0.5, input_shape=(size, size, 3), classes=1000,
                           classifier_activation=None, weights=None)
    rng = np.random.default_rng(0)
    for layer in model.layers:  # O(1) logits: BatchNorm statistics away from 0 / 1
        if isinstance(layer, keras.layers.BatchNormalization):
            mean, var = layer.moving_mean, layer.moving_variance
            mean.assign(rng.normal(0, 0.1, mean.shape).astype("float32"))
            var.assign(rng.uniform(0.5, 1.5, var.shape).astype("float32"))
    affine = np.random.default_rng(1)  # trained-like norms: no scale of 1 or shift of 0 that
    for weight in model.weights:       # a converter would drop as a no-op
        if weight.name in ("gamma", "beta"):
            weight.assign((affine.uniform(0.8, 1.2, weight.shape) if weight.name == "gamma"
                           else affine.normal(0, 0.05, weight.shape)).astype("float32"))
    x = rng.random((IMAGES, size, size, 3), dtype=np.float32)
    keras_out = np.asarray(model.predict(x, batch_size=IMAGES, verbose=0))
    scale = float(np.abs(keras_out).max())

    with tempfile.TemporaryDirectory() as folder:
        weights = os.path.join(folder, "model.weights.h5")
        model.save_weights(weights)
        np.savez(os.path.join(folder, "x.npz"), x=x)
        paths, seconds = {}, {}
        for quantization in ("float32", "float16"):
            paths[f"tensorflow_{quantization}"] = os.path.join(folder, f"tf_{quantization}.tflite")
            start = time.perf_counter()
            to_tflite(model, paths[f"tensorflow_{quantization}"], quantization=quantization)
            seconds[f"tensorflow_{quantization}"] = time.perf_counter() - start
        packages, package_seconds = {}, {}
        for quantization in ("float32", "float16"):
            packages[f"tensorflow_{quantization}"] = os.path.join(
                folder, f"tf_{quantization}.mlpackage")
            start = time.perf_counter()
            to_coreml(model, packages[f"tensorflow_{quantization}"], quantization=quantization)
            package_seconds[f"tensorflow_{quantization}"] = time.perf_counter() - start
        env = dict(os.environ, KERAS_BACKEND="torch")
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--torch-worker",
                               weights, str(size), folder], env=env, capture_output=True,
                              text=True)
        if done.returncode != 0:
            print(done.stderr[-4000:], file=sys.stderr)
            return 1
        with open(os.path.join(folder, "torch_seconds.json")) as f:
            torch_info = json.load(f)
        for quantization in ("float32", "float16"):
            paths[f"torch_{quantization}"] = os.path.join(folder, f"torch_{quantization}.tflite")
            seconds[f"torch_{quantization}"] = torch_info[quantization]
        for quantization in ("float32", "float16"):
            packages[f"torch_{quantization}"] = os.path.join(
                folder, f"torch_{quantization}.mlpackage")
            package_seconds[f"torch_{quantization}"] = torch_info[f"coreml_{quantization}"]
        keras_torch = np.load(os.path.join(folder, "keras_torch.npy"))
        package_outputs = {key: predict_with_package_weights(model, path, x)
                           for key, path in packages.items()}
        coreml_files = {}
        for key, path in packages.items():
            report = inspect_coreml(path)
            diff = float(np.abs(package_outputs[key] - keras_out).max())
            coreml_files[key] = {
                "size_bytes": report.size_bytes, "num_ops": report.num_ops,
                "op_histogram": dict(sorted(report.op_histogram.items())),
                "max_abs_diff_vs_keras": diff, "relative_diff_vs_keras": diff / scale,
                "measured": measurement_kind(path),
                "convert_seconds": package_seconds[key],
                "converter": json.loads(report.metadata.get("keras_mvit2.converter", "null")),
            }
        outputs = {key: run_tflite(path, x) for key, path in paths.items()}
        files = {}
        for key, path in paths.items():
            report = inspect_tflite(path)
            meta = read_tflite_metadata(path) or {}
            files[key] = {
                "size_bytes": report.size_bytes, "num_ops": report.num_ops,
                "op_histogram": dict(sorted(report.op_histogram.items())),
                "max_abs_diff_vs_keras": float(np.abs(outputs[key] - keras_out).max()),
                "relative_diff_vs_keras": float(np.abs(outputs[key] - keras_out).max()) / scale,
                "convert_seconds": seconds[key],
                "quantization": meta.get("quantization"),
                "converter": meta.get("converter"),
            }
        latency = _interleaved_latency(
            {k: paths[k] for k in ("tensorflow_float32", "torch_float32")}, x, args.rounds)
    result = {
        "benchmark": "export_roads", "model": f"MobileViTV2-0.5, {size}x{size}, 1000 classes",
        "host": {"machine": platform.machine(), "processor": platform.processor(),
                 "cpus": os.cpu_count(), "python": platform.python_version()},
        "versions": {name: _version(name) for name in (
            "tensorflow", "keras", "torch", "litert-torch", "ai-edge-litert",
            "ai-edge-quantizer", "coremltools", "coreai-torch", "coreai-core")},
        "images": IMAGES, "max_abs_keras_logit": scale,
        "keras_torch_vs_keras_tensorflow": float(np.abs(keras_torch - keras_out).max()),
        "roads_float32_max_abs_diff": float(np.abs(
            outputs["torch_float32"] - outputs["tensorflow_float32"]).max()),
        "torch_worker_imported_tensorflow": torch_info["tensorflow_imported"],
        "files": files,
        "latency_ms_1_thread": latency,
        "latency_ratio_torch_over_tensorflow": latency["torch_float32"]
        / latency["tensorflow_float32"],
        "coreml_files": coreml_files,
        "coreai_file": None if "coreai" not in torch_info else {
            **torch_info["coreai_report"], "convert_seconds": torch_info["coreai"],
            "outputs": "not measured: Core AI runs assets on macOS only"},
        "coreml_roads_float32_max_abs_diff": float(np.abs(
            package_outputs["torch_float32"] - package_outputs["tensorflow_float32"]).max()),
        "timing": {"rounds": args.rounds, "invokes_per_round": 5, "warmup": 10,
                   "threads": 1, "xnnpack": True},
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "export_roads.json"), "w") as f:
        json.dump(result, f, indent=2)
    markdown = _markdown(result)
    with open(os.path.join(args.out, "export_roads.md"), "w") as f:
        f.write(markdown)
    print(markdown)
    return 0


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _markdown(result: dict) -> str:
    files, latency = result["files"], result["latency_ms_1_thread"]
    lines = [f"# Two roads to .tflite: {result['model']}", "",
             "| file | size | ops | max abs diff vs Keras (relative) | LiteRT 1 thread | convert |",
             "|---|---:|---:|---:|---:|---:|"]
    for key, info in files.items():
        ms = f"{latency[key]:.1f} ms" if key in latency else "-"
        lines.append(f"| {key} | {info['size_bytes'] / 1e6:.2f} MB | {info['num_ops']} | "
                     f"{info['max_abs_diff_vs_keras']:.2e} ({info['relative_diff_vs_keras']:.1e})"
                     f" | {ms} | {info['convert_seconds']:.0f} s |")
    lines += ["", f"Latency ratio torch / tensorflow road (float32, interleaved medians): "
              f"**{result['latency_ratio_torch_over_tensorflow']:.2f}**; the two float32 files "
              f"differ by at most {result['roads_float32_max_abs_diff']:.2e} "
              f"(largest |logit| {result['max_abs_keras_logit']:.2f}); Keras on PyTorch vs "
              f"Keras on TensorFlow: {result['keras_torch_vs_keras_tensorflow']:.2e}.", "",
              "Op histograms (float32):", ""]
    ops = sorted(set(files["tensorflow_float32"]["op_histogram"])
                 | set(files["torch_float32"]["op_histogram"]))
    lines += ["| op | tensorflow | torch |", "|---|---:|---:|"]
    for op in ops:
        lines.append(f"| {op} | {files['tensorflow_float32']['op_histogram'].get(op, 0)} | "
                     f"{files['torch_float32']['op_histogram'].get(op, 0)} |")
    coreml = result["coreml_files"]
    lines += ["", f"## Two roads to Core ML: {result['model']}", "",
              "| package | size | ops (no const) | transposes | max abs diff vs Keras "
              "(relative) | measured | convert |", "|---|---:|---:|---:|---:|---|---:|"]
    for key, info in coreml.items():
        ops = info["num_ops"]  # CoreMLReport.num_ops: every op but const
        lines.append(f"| {key} | {info['size_bytes'] / 1e6:.2f} MB | {ops} | "
                     f"{info['op_histogram'].get('transpose', 0)} | "
                     f"{info['max_abs_diff_vs_keras']:.2e} ({info['relative_diff_vs_keras']:.1e})"
                     f" | {info['measured']} | {info['convert_seconds']:.0f} s |")
    lines += ["", "Outputs: each package's own MIL program and weights run in TensorFlow "
              "(`predict_with_package_weights`; Core ML predicts only on macOS). The two float32 "
              f"packages differ by at most {result['coreml_roads_float32_max_abs_diff']:.2e}.",
              "", "MIL op histograms (float32, without const):", "",
              "| op | tensorflow | torch |", "|---|---:|---:|"]
    ops = sorted((set(coreml["tensorflow_float32"]["op_histogram"])
                  | set(coreml["torch_float32"]["op_histogram"])) - {"const"})
    for op in ops:
        lines.append(f"| {op} | {coreml['tensorflow_float32']['op_histogram'].get(op, 0)} | "
                     f"{coreml['torch_float32']['op_histogram'].get(op, 0)} |")
    asset = result["coreai_file"]
    if asset is not None:
        ops = asset["num_ops"] - asset["op_histogram"].get("constant", 0)
        lines += ["", "## Core AI (PyTorch road only)", "",
                  f"float32 `.aimodel` (coreai-torch): {asset['size_bytes'] / 1e6:.2f} MB, "
                  f"{ops} ops besides {asset['op_histogram'].get('constant', 0)} constants "
                  f"(conv2d {asset['op_histogram'].get('conv2d', 0)}, transpose "
                  f"{asset['op_histogram'].get('transpose', 0)}), minimum OS "
                  f"{asset['minimum_os']}, converted in {asset['convert_seconds']:.0f} s; "
                  "outputs not measured (Core AI runs assets on macOS only)."]
    lines += ["", f"Versions: {result['versions']}; host: {result['host']}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
