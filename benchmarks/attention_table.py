"""The paper's Table 1 on Fashion-MNIST: each attention trained with one recipe, then
accuracy, cost and TFLite latency side by side.

    python benchmarks/attention_table.py [--epochs 1] [--image-size 64] [--threads 2]
        [--mechanisms separable mha linformer rfa mobile_attention]
        [--run-dir runs/attention_table] [--out benchmarks/results]

For each mechanism, MobileViTV2-0.5 with that attention in every transformer layer
(`model.attention`, the registry's default arguments) is trained from scratch with the
packaged `fashion_mnist` recipe (AdamW, lr 0.002 at batch 64, weight decay 0.05, cosine
to 1e-5 after a warm-up of a quarter epoch, label smoothing 0.1, EMA 0.999, mild random
resized crop and flip; float32 on CPU), the same seed, data, order and number of steps
for all; nothing is tuned per mechanism. Each epoch is split into `--curve-points`
equal parts (Keras "epochs" of `training.steps_per_epoch` steps) so that the loss curve
has points; the schedule depends only on the step. A run that diverges is recorded as
diverged, with its curve, and the others go on. Runs resume from their folders.

Then for each trained model: top-1 of the raw and the EMA weights on the 10,000 test
images, parameters, MACs, and TFLite latency, float32 and full int8 (int8 I/O,
calibrated on 32 training images), on 1 interpreter thread with XNNPACK, all files timed
interleaved in one run (`keras_mvit2.latency.host.measure_interleaved`), at the training
size and at 256x256. The 256x256 model is the same architecture built at 256 with the
trained weights copied layer by layer (Linformer's token projections depend on the
number of tokens and stay random there: the table says how many layers were not copied;
latency does not depend on the values).

Why 64x64: attention needs tokens to work with, and Fashion-MNIST's images are 28x28. At
64x64 the three attention stages see 8x8, 4x4 and 2x2 maps (16, 4 and 1 tokens of 4
pixels); at the packaged 48x48 the first has 9. 64 is also what fits: one epoch of each of
the five models takes about an hour on 2 shared CPU cores (separable ~250 images/s alone;
Linformer, with the paper's p = 256 projected tokens for the 16 it is given, is ~3x
slower; 96x96 would cost 2.3x). One epoch is short (the packaged 12-epoch recipe reaches
92.7 % at 48x48): the table compares the mechanisms after the same short training, not
their final accuracy. At 64 the attention is a small part of the cost; the 256x256
latency columns (256, 64 and 16 tokens) are where the mechanisms differ, as in the paper.

Writes `attention_table.json`, `attention_table.md` and `attention_table.png` (test
top-1 against int8 latency at 256x256, and the training loss curves).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MECHANISMS = ("separable", "mha", "linformer", "rfa", "mobile_attention")
MODEL = "mobilevitv2_050"
LATENCY_SIZE = 256
TRAIN_EXAMPLES = 60_000
PAPER_TABLE_1 = [  # MobileViT on ImageNet-1k, iPhone 12 (the paper's Table 1)
    {"attention": "Self-attention in Transformer (mha)", "ne_ms": 9.9, "cpu_ms": 78.6,
     "top1": 78.4},
    {"attention": "Self-attention in Linformer (linformer)", "ne_ms": 10.2, "cpu_ms": 83.2,
     "top1": 78.2},
    {"attention": "Separable self-attention (separable)", "ne_ms": 3.4, "cpu_ms": 38.6,
     "top1": 78.1},
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS))
    p.add_argument("--epochs", type=float, default=1.0, help="passes over the 60,000 images")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--curve-points", type=int, default=8, help="loss points per epoch")
    p.add_argument("--train-limit", type=int, default=None,
                   help="use the first N training images (a quick look; default: all)")
    p.add_argument("--test-limit", type=int, default=None,
                   help="evaluate on the first N test images (default: all 10,000)")
    p.add_argument("--threads", type=int, default=2, help="TensorFlow threads for training")
    p.add_argument("--runs", type=int, default=40, help="timed invokes per .tflite file")
    p.add_argument("--rounds", type=int, default=10, help="interleaving rounds")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--run-dir", default="runs/attention_table")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    return p.parse_args(argv)


# --------------------------------------------------------------------------------------
# Training


def recipe(mechanism: str, args: argparse.Namespace):
    """The packaged Fashion-MNIST recipe with `model.attention=mechanism`."""
    from keras_mvit2 import training

    examples = min(args.train_limit or TRAIN_EXAMPLES, TRAIN_EXAMPLES)
    steps_per_epoch = math.ceil(examples / args.batch_size)
    chunk = math.ceil(steps_per_epoch / args.curve_points)
    chunks = max(1, round(args.epochs * steps_per_epoch / chunk))
    overrides = [
        f"model.name={MODEL}", f"model.attention={mechanism}",
        f"model.image_size={args.image_size}", "model.num_classes=10",
        f"data.batch_size={args.batch_size}", f"optimizer.reference_batch_size={args.batch_size}",
        f"schedule.warmup_epochs={args.curve_points / 4}",
        f"training.epochs={chunks}", f"training.steps_per_epoch={chunk}",
        "training.validate_every=0", "training.seed=0", "data.seed=0",
        f"output.dir={os.path.join(args.run_dir, mechanism)}", "output.verbose=0",
        "output.tensorboard=false",
    ]
    if args.train_limit:
        overrides.append(f"data.train_limit={args.train_limit}")
    if args.test_limit:
        overrides.append(f"data.validation_limit={args.test_limit}")
    return training.load_config("fashion_mnist", overrides)


def train_one(mechanism: str, args: argparse.Namespace) -> dict[str, Any]:
    """Trains (or resumes) one mechanism; its record (diverged runs included)."""
    from keras_mvit2 import training
    from keras_mvit2.training.divergence import TrainingDivergedError
    from keras_mvit2.training.run_folder import STATE_FILE

    config = recipe(mechanism, args)
    start = time.perf_counter()
    cpu_start = time.process_time()
    record: dict[str, Any] = {"mechanism": mechanism, "config": config.to_dict()}
    try:
        result = training.train(config)
    except TrainingDivergedError as err:
        state_path = os.path.join(config.output.dir, "checkpoints", STATE_FILE)
        history = []
        if os.path.exists(state_path):
            history = json.loads(open(state_path).read()).get("history", [])
        record.update(status="diverged", error=str(err), history=history)
        return record
    record.update(
        status="trained",
        history=result.history,
        top1={name: m.top1 for name, m in result.metrics.items()},
        top5={name: m.top5 for name, m in result.metrics.items()},
        test_images=result.metrics["raw"].num_examples,
        attention=result.attention,
        images_per_second=training_throughput(result.history),
        wall_minutes=(time.perf_counter() - start) / 60,
        cpu_minutes=(time.process_time() - cpu_start) / 60,
        model_path=result.model_path,
        optimizer_steps=result.optimizer_step,
    )
    return record


def training_throughput(history: list[dict[str, Any]]) -> float:
    """Median images / second over the run's curve segments (each `fit` call's timed steps).

    Read from the run's history, not from this call's `TrainResult`: a run resumed after
    its last segment trains no step in this call (its own figure is NaN).
    """
    values = [h["images_per_second"] for h in history
              if np.isfinite(h.get("images_per_second", float("nan")))]
    return float(np.median(values)) if values else float("nan")


# --------------------------------------------------------------------------------------
# Cost and latency


def at_size(model, mechanism: str, size: int):
    """`(model at size x size, layers not copied)`: the trained weights, layer by layer."""
    from keras_mvit2.models import create_model

    if tuple(model.input_shape[1:3]) == (size, size):
        return model, []
    rebuilt = create_model(MODEL, input_shape=(size, size, 3), classes=10, attention=mechanism,
                           classifier_activation="softmax")
    skipped = []
    for layer in rebuilt.layers:
        source = model.get_layer(layer.name) if layer.weights else None
        if source is None:
            continue
        values = source.get_weights()
        if [v.shape for v in values] == [tuple(w.shape) for w in layer.weights]:
            layer.set_weights(values)
        else:
            skipped.append(layer.name)
    return rebuilt, skipped


def calibration_images(size: int, count: int = 32) -> np.ndarray:
    """The first `count` Fashion-MNIST training images as uint8 RGB `(count, size, size, 3)`."""
    import tensorflow as tf

    from keras_mvit2 import data as mvdata

    source = mvdata.fashion_mnist("train", limit=count)
    images = np.stack([x for x, _ in source.dataset.take(count)])
    rgb = tf.image.grayscale_to_rgb(tf.image.resize(tf.cast(images, tf.float32), (size, size)))
    return np.clip(np.round(rgb.numpy()), 0, 255).astype(np.uint8)


def measure_latency(records: list[dict[str, Any]], args: argparse.Namespace,
                    folder: str) -> None:
    """Adds params, MACs and interleaved TFLite latencies to the trained records."""
    import keras

    from keras_mvit2.latency.host import (
        _histogram_and_report,
        make_interpreter,
        make_result,
        measure_interleaved,
        tflite_model_entry,
    )
    from keras_mvit2.latency.models_table import convert_for_latency
    from keras_mvit2.profiling import profile

    sizes = sorted({args.image_size, LATENCY_SIZE})
    images = {size: calibration_images(size) for size in sizes}
    files: dict[tuple[str, int, str], str] = {}
    entries: dict[tuple[str, int, str], dict[str, Any]] = {}
    for record in records:
        if record["status"] != "trained":
            continue
        mechanism = record["mechanism"]
        trained = keras.saving.load_model(record["model_path"])
        record["cost"] = {}
        for size in sizes:
            model, not_copied = at_size(trained, mechanism, size)
            info = profile(model)
            record["cost"][str(size)] = {"params": info.params, "macs": info.macs,
                                         "layers_not_copied": not_copied}
            for precision in ("float32", "int8"):
                path = os.path.join(folder, f"{mechanism}_{size}_{precision}.tflite")
                print(f"{mechanism} @{size}: converting to {precision} ...", flush=True)
                try:
                    note = convert_for_latency(
                        model, path, precision, size, images=images[size],
                        images_note=f"{len(images[size])} Fashion-MNIST training images")
                except (RuntimeError, ValueError) as err:  # e.g. fails to run in LiteRT
                    reason = str(err).splitlines()[0][:300]
                    record.setdefault("failed", {})[f"{size} {precision}"] = reason
                    print(f"  failed: {reason}", flush=True)
                    continue
                key = (mechanism, size, precision)
                files[key] = path
                entries[key] = tflite_model_entry(path, name=mechanism, params=info.params,
                                                  macs=info.macs,
                                                  source=f"{MODEL} + {mechanism} @{size}")
                entries[key].update(precision=precision, notes=note)
    interpreters = {key: make_interpreter(path, threads=1) for key, path in files.items()}
    print(f"timing {len(interpreters)} files interleaved ...", flush=True)
    samples = measure_interleaved(interpreters, runs=args.runs, warmup=args.warmup,
                                  rounds=args.rounds)
    del interpreters
    by_mechanism = {r["mechanism"]: r for r in records}
    for key, path in files.items():
        histogram, extra = _histogram_and_report(path)
        result = make_result(entries[key], samples[key], warmup=args.warmup, threads=1,
                             xnnpack=True, peak_memory=None, op_histogram=histogram,
                             extra=extra)
        mechanism, size, precision = key
        by_mechanism[mechanism].setdefault("latency", {}).setdefault(str(size), {})[
            precision] = result.to_dict()


def median_ms(record: dict[str, Any], size: int, precision: str) -> float | None:
    """Median latency (thread CPU time, 1 thread) of one file of a record."""
    result = (record.get("latency") or {}).get(str(size), {}).get(precision)
    if result is None:
        return None
    cpu = (result["extra"].get("cpu_ms") or {}).get("median")
    return cpu if cpu is not None else result["latency_ms"]["median"]


# --------------------------------------------------------------------------------------
# Report


def markdown(table: dict[str, Any]) -> str:
    s = table["settings"]
    size = s["image_size"]
    lines = [
        f"MobileViTV2-0.5 with each attention, trained from scratch on Fashion-MNIST at "
        f"{size}x{size} with one recipe ({s['epochs']:g} epochs, {s['optimizer_steps']} steps of "
        f"{s['batch_size']}, the packaged `fashion_mnist` config); top-1 on the "
        f"{s['test_images']} test images. TFLite latency: median thread CPU time (ms) of "
        f"{s['runs']} invokes, 1 thread, XNNPACK, all files interleaved in one run; int8 = full "
        "integer with int8 I/O.",
        "",
        f"| attention | top-1 raw (%) | top-1 EMA (%) | params (M) | MACs @{size} (M) "
        f"| MACs @256 (M) | fp32 @{size} | int8 @{size} | fp32 @256 | int8 @256 "
        "| train img/s (median of segments) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    for r in table["records"]:
        if r["status"] != "trained":
            lines.append(f"| {r['mechanism']} | diverged | | | | | | | | | |")
            continue
        cost = r.get("cost", {})
        small, big = cost.get(str(size), {}), cost.get("256", {})
        lines.append(
            f"| {r['mechanism']} | {100 * r['top1']['raw']:.2f} | "
            f"{100 * r['top1'].get('ema', float('nan')):.2f} | "
            f"{small.get('params', 0) / 1e6:.3f} | {small.get('macs', 0) / 1e6:.1f} | "
            f"{big.get('macs', 0) / 1e6:.1f} | {ms(median_ms(r, size, 'float32'))} | "
            f"{ms(median_ms(r, size, 'int8'))} | {ms(median_ms(r, 256, 'float32'))} | "
            f"{ms(median_ms(r, 256, 'int8'))} | {r['images_per_second']:.0f} |")
    notes = [f"- {r['mechanism']}: {len(r['cost']['256']['layers_not_copied'])} layer(s) "
             "not copied at 256x256 (weights that depend on the token count; random there, "
             "latency only)"
             for r in table["records"]
             if r.get("cost") and r["cost"].get("256", {}).get("layers_not_copied")]
    notes += [f"- {r['mechanism']}: diverged ({r['error'].splitlines()[0]})"
              for r in table["records"] if r["status"] != "trained"]
    notes += [f"- {r['mechanism']} {what}: no latency, the conversion failed: {reason}"
              for r in table["records"] for what, reason in r.get("failed", {}).items()]
    if notes:
        lines += [""] + notes
    lines += ["", "The paper's Table 1 (MobileViT on ImageNet-1k, iPhone 12; not comparable "
              "in absolute terms):", "",
              "| attention | latency NE (ms) | latency CPU (ms) | top-1 (%) |",
              "|---|---:|---:|---:|"]
    lines += [f"| {p['attention']} | {p['ne_ms']} | {p['cpu_ms']} | {p['top1']} |"
              for p in PAPER_TABLE_1]
    env = table["environment"]
    lines += ["", f"{env['machine']}; TensorFlow {env['tensorflow']}, Keras {env['keras']}; "
              f"{env['training_threads']} TensorFlow threads for training."]
    return "\n".join(lines) + "\n"


def plot(table: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from keras_mvit2.utils.files import atomic_output

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in table["records"]:
        if r["status"] == "trained" and median_ms(r, 256, "int8") is not None:
            x, y = median_ms(r, 256, "int8"), 100 * r["top1"]["raw"]
            left.scatter([x], [y], s=50)
            left.annotate(r["mechanism"], (x, y), fontsize=8, xytext=(4, 3),
                          textcoords="offset points")
        steps = [h["step"] for h in r.get("history", [])]
        losses = [h["loss"] for h in r.get("history", [])]
        if steps:
            right.plot(steps, losses, marker=".", label=r["mechanism"])
    size = table["settings"]["image_size"]
    left.set_xlabel("TFLite full-int8 latency at 256x256 (ms, 1 thread, median CPU time)")
    left.set_ylabel(f"Fashion-MNIST test top-1 (%), trained at {size}x{size}")
    left.grid(True, alpha=0.3)
    right.set_xlabel("optimizer step")
    right.set_ylabel("training loss (label smoothing 0.1)")
    right.grid(True, alpha=0.3)
    right.legend()
    fig.suptitle(f"MobileViTV2-0.5, one recipe, five attentions; {table['environment']['machine']}",
                 fontsize=8)
    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    import keras

    from keras_mvit2.latency.attention_sweep import machine_label
    from keras_mvit2.latency.host import host_device, litert_runtime
    from keras_mvit2.layers import attention_registry
    from keras_mvit2.utils.files import atomic_output, write_json

    mechanisms = [attention_registry.canonical_name(m) for m in args.mechanisms]
    records = []
    for mechanism in mechanisms:
        print(f"== {mechanism}: training ...", flush=True)
        record = train_one(mechanism, args)
        if record["status"] == "trained":
            print(f"   top-1 raw {100 * record['top1']['raw']:.2f} %, "
                  f"{record['wall_minutes']:.1f} min", flush=True)
        else:
            print(f"   diverged: {record['error'].splitlines()[0]}", flush=True)
        records.append(record)
    with tempfile.TemporaryDirectory(prefix="attention_table_") as folder:
        measure_latency(records, args, folder)
    trained = [r for r in records if r["status"] == "trained"]
    settings = {**{k: v for k, v in vars(args).items() if k not in ("out", "run_dir")},
                "model": MODEL, "latency_size": LATENCY_SIZE,
                "optimizer_steps": trained[0]["optimizer_steps"] if trained else None,
                "test_images": trained[0]["test_images"] if trained else None}
    table = {
        "settings": settings,
        "environment": {"machine": machine_label(host_device(), litert_runtime(1, True)),
                        "tensorflow": tf.__version__, "keras": keras.__version__,
                        "training_threads": args.threads, "python": sys.version.split()[0]},
        "records": records,
        "paper_table_1": PAPER_TABLE_1,
    }
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "attention_table.json"), table)
    text = markdown(table)
    with atomic_output(os.path.join(args.out, "attention_table.md")) as tmp, open(tmp, "w") as f:
        f.write(text)
    plot(table, os.path.join(args.out, "attention_table.png"))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
