"""Full int8 through the two roads to `.tflite`, on a trained model and real images.

    python benchmarks/torch_road_int8.py RUN [--test-images 1000] [--calibration 200]
        [--rounds 40] [--work DIR] [--out benchmarks/results]

RUN is a `mvit2 finetune` run folder on Fashion-MNIST photos (`benchmarks/finetune_photos.py`):
its Keras model (`RUN/model_ema.keras`, MobileViTV2 at the run's image size) is converted to
full int8 (float32 input and output, int8 activations and weights):

- ``tensorflow_int8``: the TensorFlow road's default (`to_tflite`, the TFLite converter with
  per-tensor 99.99 % activation ranges), the file `mvit2 finetune` ships;
- ``torch_int8``: the PyTorch road (`KERAS_BACKEND=torch`, litert-torch, then
  ai-edge-quantizer's ``static_wi8_ai8`` recipe), with the token sum traced as the matrix
  product (the TensorFlow road's form);
- ``torch_int8_product_mean``: the same with the token sum traced as a product and a mean
  (the PyTorch road's default form);
- a file the road refuses (it does not run in LiteRT) is recorded with its error;
- and each road's float32 file, for the latency ratio.

All calibrate on the same `--calibration` images of the run's training photos. Each file
runs on `--test-images` Fashion-MNIST test images written as photos (as
`benchmarks/finetune_int8_check.py` does); reported: top-1, the drop against Keras in
points, argmax agreement with Keras, and the LiteRT latency at 1 thread (medians of
`--rounds` x 5 invokes, the files interleaved in one process), and per int8 file how many
of its matrix products (BATCH_MATMUL with a second operand computed at run time) give that
operand zero point 0 (the two roads share the rule: `activation_ranges.
zero_offset_matmul_operands`). Writes
``torch_road_int8.json`` / ``.md`` under `--out`, one entry per run folder name.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from export_roads import _interleaved_latency
from finetune_photos import write_photos

HERE = os.path.dirname(os.path.abspath(__file__))
KEYS = ("tensorflow_float32", "tensorflow_int8", "torch_float32", "torch_int8",
        "torch_int8_product_mean")


def _torch_worker(model_path: str, folder: str) -> None:
    """Runs under KERAS_BACKEND=torch: the PyTorch road's float32 and int8 files."""
    import keras

    import keras_mvit2 as mv
    from keras_mvit2.layers.export_forms import ExportForms

    model = keras.saving.load_model(model_path)
    with np.load(os.path.join(folder, "calibration.npz")) as data:
        calibration = data["x"]
    target = mv.export.get_target("tflite")
    target.convert(model, os.path.join(folder, "torch_float32.tflite"), road="torch")
    errors = {}
    for key, pooling in (("torch_int8", "matmul"), ("torch_int8_product_mean", "product_mean")):
        try:  # a file that does not run in LiteRT is refused by the road: recorded, not fatal
            target.convert(model, os.path.join(folder, f"{key}.tflite"), quantization="int8",
                           calibration_data=calibration, road="torch",
                           forms=ExportForms(token_pooling=pooling))
        except RuntimeError as err:
            errors[key] = str(err)[:400]
    with open(os.path.join(folder, "torch_errors.json"), "w") as f:
        json.dump(errors, f)


def product_zero_points(path: str) -> dict[str, int]:
    """The file's matrix products whose second operand is computed at run time (not a
    constant), and how many of those operands are int8 with zero point 0."""
    from keras_mvit2.export.tflite.flatbuffer import op_names, parse_flatbuffer, tensor_indices

    model = parse_flatbuffer(path)
    names, tensors = op_names(model), model.subgraphs[0].tensors
    products = zero = 0
    for op in model.subgraphs[0].operators:
        ins = tensor_indices(op.inputs)
        if names[op.opcodeIndex] != "BATCH_MATMUL" or len(ins) < 2:
            continue
        operand = tensors[ins[1]]
        data = model.buffers[operand.buffer].data
        if data is not None and len(data):
            continue
        products += 1
        q = operand.quantization
        zero += int(q is not None and q.zeroPoint is not None and len(q.zeroPoint) == 1
                    and int(q.zeroPoint[0]) == 0 and int(operand.type) == 9)  # INT8
    return {"products": products, "second_operand_zero_point_0": zero}


def write_table(results: dict, out: str) -> list[str]:
    """`torch_road_int8.md` under `out` from the JSON results; returns its lines."""
    lines = ["# Full int8 through the two roads (MobileViTV2-0.5 fine-tuned by `mvit2 finetune`; "
             "Fashion-MNIST test images as photos)", ""]
    for run_name, entry in results.items():
        lines += [f"## {run_name} ({entry['image_size']}x{entry['image_size']}, "
                  f"{entry['test_images']} test images, {entry['calibration_images']} "
                  f"calibration images, Keras top-1 {100 * entry['keras_top1']:.1f} %)", "",
                  "| file | top-1 | drop (points) | agreement | LiteRT 1 thread | size | "
                  "products: second operand at zero point 0 |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for key, row in entry["files"].items():
            if "error" in row:
                reason = row["error"].split("ai_edge_litert: ")[-1].split(".Node")[0][:90]
                lines.append(f"| {key} | does not run in LiteRT ({reason}) | | | | | |")
                continue
            zeros = row.get("products")
            zeros = ("" if zeros is None or "int8" not in key else
                     f"{zeros['second_operand_zero_point_0']} of {zeros['products']}")
            lines.append(f"| {key} | {100 * row['top1']:.1f} % | {row['drop_points']:.1f} | "
                         f"{100 * row['agreement']:.1f} % | "
                         f"{row['latency_ms_1_thread']:.2f} ms | "
                         f"{row['size_bytes'] / 1e6:.2f} MB | {zeros} |")
        lines.append("")
    with open(os.path.join(out, "torch_road_int8.md"), "w") as f:
        f.write("\n".join(lines))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", help="a `mvit2 finetune` run on Fashion-MNIST photos")
    parser.add_argument("--test-images", type=int, default=1000)
    parser.add_argument("--calibration", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=40, help="interleaved timing rounds")
    parser.add_argument("--work", default="/tmp/finetune_int8_check")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--torch-worker", nargs=2, metavar=("MODEL", "FOLDER"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.torch_worker:
        _torch_worker(*args.torch_worker)
        return 0
    if not args.run:
        parser.error("RUN is required")

    import keras

    from keras_mvit2.export import inspect_tflite, run_tflite, to_tflite
    from keras_mvit2.export.calibration import load_labelled_images

    with open(os.path.join(args.run, "run.json")) as f:
        run = json.load(f)
    size = int(run["recipe"]["image_size"])
    folder = os.path.join(args.work, f"test_{args.test_images}")
    if not os.path.isdir(folder):
        write_photos(folder, args.test_images, split="test")
    test = load_labelled_images(folder, image_size=(size, size), shuffle=False)
    if list(test.class_names) != list(run["class_names"]):
        raise SystemExit(f"the run's classes {run['class_names']} are not Fashion-MNIST's")
    calibration = load_labelled_images(run["data"]["train"], image_size=(size, size),
                                       limit=args.calibration, seed=0).images
    model_path = os.path.join(args.run, "model_ema.keras")
    model = keras.saving.load_model(model_path)
    reference = np.asarray(model.predict(test.images, batch_size=32, verbose=0))
    keras_top1 = float(np.mean(reference.argmax(1) == test.labels))

    with tempfile.TemporaryDirectory() as work:
        np.savez(os.path.join(work, "calibration.npz"), x=calibration)
        paths = {key: os.path.join(work, f"{key}.tflite") for key in KEYS}
        to_tflite(model, paths["tensorflow_float32"])
        to_tflite(model, paths["tensorflow_int8"], quantization="int8",
                  representative_data=calibration)
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--torch-worker",
                               os.path.abspath(model_path), work],
                              env=dict(os.environ, KERAS_BACKEND="torch"),
                              capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr[-4000:], file=sys.stderr)
            return 1
        with open(os.path.join(work, "torch_errors.json")) as f:
            errors = json.load(f)
        files = {key: {"error": error} for key, error in errors.items()}
        paths = {key: path for key, path in paths.items() if key not in errors}
        latency = _interleaved_latency(paths, test.images, args.rounds)
        for key, path in paths.items():
            predicted = run_tflite(path, test.images, num_threads=2).argmax(1)
            top1 = float(np.mean(predicted == test.labels))
            report = inspect_tflite(path)
            files[key] = {
                "top1": top1, "drop_points": 100 * (keras_top1 - top1),
                "agreement": float(np.mean(predicted == reference.argmax(1))),
                "latency_ms_1_thread": latency[key], "size_bytes": report.size_bytes,
                "op_histogram": dict(sorted(report.op_histogram.items())),
                "products": product_zero_points(path),
            }
    files = {key: files[key] for key in KEYS}
    name = os.path.basename(os.path.normpath(args.run))
    result = {"image_size": size, "test_images": len(test.labels),
              "calibration_images": len(calibration), "keras_top1": keras_top1,
              "timing_rounds": args.rounds, "files": files,
              "versions": {"keras": keras.__version__}}
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "torch_road_int8.json")
    results = {}
    if os.path.exists(json_path):
        with open(json_path) as f:
            results = json.load(f)
    results[name] = result
    with open(json_path, "w") as f:
        json.dump(results, f, indent=2)
    lines = write_table(results, args.out)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
