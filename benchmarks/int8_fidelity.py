"""Full-int8 fidelity of MobileViTV2-0.5 against a MobileNetV2 control, by resolution.

    python benchmarks/int8_fidelity.py [--sizes 256 128 64] [--seeds 0 1 2]
        [--train-images 3000 --epochs 4] [--test-images 1000] [--work runs/int8_fidelity]
        [--out benchmarks/results]

One recipe for both networks, from scratch on Fashion-MNIST (the Debian package): the first
`--train-images` training images, bilinear-resized to the size and rounded to the uint8
grid (as decoded photos are), random horizontal flips, batch 32, AdamW (lr 2e-3, weight
decay 0.05, clip-norm 1) with 10 % linear warm-up and cosine decay, label smoothing 0.1,
`--epochs` epochs. The control is `keras.applications.MobileNetV2(alpha=0.5)` from scratch
with BatchNorm momentum 0.9 (keras.applications' 0.999 leaves the moving statistics
untrained after a few hundred steps), converted by the plain `tf.lite.TFLiteConverter` as
its users do (`from_keras_model`, `Optimize.DEFAULT`, the representative dataset,
`TFLITE_BUILTINS_INT8`). Each trained model is kept under `--work` (a second run reuses it)
and each measured row in the JSON (a second run skips it).

Per size and seed (three independent trainings), on `--test-images` held-out test images,
every file run in LiteRT (XNNPACK, as apps run it):

* ``mobilevitv2_050``: `keras_mvit2.export.to_tflite(quantization="int8")` with each
  activation range method (`keras_mvit2.export.tflite.activation_ranges`): ``minmax`` (the
  converter's global min / max, the export before this benchmark), ``p99.99`` and ``mse``,
  float I/O, and the default method with uint8 I/O; ``equalized``: the default method on the
  model with the attention output equalized (`keras_mvit2.export.equalize_attention`, a
  float-exact rewrite); ``default gn E[x^2] mean`` / ``... matmul``: the default method with
  each GroupNorm variance form (`VARIANCE_ROWS`; the matrix product is the int8 default);
  ``plain converter``: the plain `tf.lite.TFLiteConverter` with the control's settings
  (`control_int8`), which traces the Keras model's own call (`export_forms.KERAS`): the
  file a user gets who converts our model as TensorFlow's guides teach; ``qat``:
  `keras_mvit2.quantize.qat` (quantization-aware training on the shipped graph) with its
  defaults on the model's training images (`--qat-steps` steps of 8; a quarter of the
  images read is set aside first and never trained on), the choice judged on those
  set-aside images and `--qat-held-out` training images the model never saw (after the
  first `--train-images`), never on a calibration image: ``int8 qat post-training`` and
  ``int8 qat trained`` are its two files, ``int8 qat shipped`` the one `qat` wrote (the
  trained one only where the exact paired test chose it); a second table gives per training
  the choice (the judge images, p, the judged gain in agreement) beside what the test images
  say (the trained file's gain in agreement on them, and whether the shipped file agrees
  less often than the post-training file there), and the wall times;
* ``mobilenetv2_050``: the control, float and uint8 I/O.

`--networks` trains and measures only some networks (the others' rows stay as recorded); a
network trained anew (its `.keras` absent under `--work`) has its rows and files of the
size and seed made again.

Columns: float Keras top-1, int8 top-1, drop in points, argmax agreement with Keras, the
float model's median top-1 margin (softmax probability of the top class minus the second),
and latency at 1 thread (median of interleaved runs of every file of the size and seed,
with the float32 file of the same network as the peer: ``x float32``). The JSON also
records the median CPU time of the invoking thread (``latency_cpu_ms``, ``x_float32_cpu``),
which a busy host inflates less than the wall time, and the load average when the files were
timed (``timing_load_average``) and the CPU's model and the flags XNNPACK's kernels depend
on (``timing_cpu``: an AVX2-only host runs int8 no faster than float32,
`benchmarks/results/int8_speed_avx2/`). The table gives the median over the seeds of each figure.
Writes ``int8_fidelity.json`` and ``int8_fidelity.md`` to `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BATCH = 32
#: Ours and the control.
NETWORKS = ("mobilevitv2_050", "mobilenetv2_050")
LEARNING_RATE = 2e-3
WEIGHT_DECAY = 0.05
LABEL_SMOOTHING = 0.1


def fashion_mnist(split: str, count: int, offset: int = 0):
    """`count` Fashion-MNIST images (uint8 28x28) and labels from `offset` of `split`."""
    from keras_mvit2.data.files import load_fashion_mnist_arrays

    x, y = load_fashion_mnist_arrays(split)
    return x[offset:offset + count], y[offset:offset + count].astype("int64")


def as_model_input(images, size: int):
    """uint8 `(N, 28, 28)` -> float32 RGB `(N, size, size, 3)` in [0, 1] (bilinear), on the
    uint8 grid (k / 255) as a camera or decoded photo gives it: an int8 file's input
    quantization (scale 1/255) is then exact, not a source of error of its own."""
    import tensorflow as tf

    x = tf.convert_to_tensor(images)[..., None]
    x = tf.image.resize(tf.cast(x, "float32"), (size, size), method="bilinear")
    x = tf.round(tf.clip_by_value(x, 0.0, 255.0)) / 255.0
    return tf.image.grayscale_to_rgb(x)


def train_dataset(images, labels, size: int, seed: int):
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((images, labels))
    ds = ds.shuffle(len(images), seed=seed, reshuffle_each_iteration=True)

    def prepare(image, label):
        x = as_model_input(image[None], size)[0]
        x = tf.image.stateless_random_flip_left_right(
            x, tf.stack([tf.cast(seed, tf.int64), tf.cast(label, tf.int64)]))
        return x, tf.one_hot(label, 10)

    return ds.map(prepare, num_parallel_calls=tf.data.AUTOTUNE).batch(
        BATCH, drop_remainder=True).prefetch(2)


def build(arch: str, size: int):
    """The two networks of the benchmark, from scratch, 10 classes, logits."""
    import keras

    import keras_mvit2 as mv

    if arch == "mobilevitv2_050":
        return mv.MobileViTV2(0.5, input_shape=(size, size, 3), classes=10,
                              classifier_activation=None)
    if arch == "mobilenetv2_050":
        model = keras.applications.MobileNetV2(
            alpha=0.5, weights=None, input_shape=(size, size, 3), classes=10,
            classifier_activation=None)
        for layer in model.layers:  # 0.999 leaves the moving statistics untrained here
            if isinstance(layer, keras.layers.BatchNormalization):
                layer.momentum = 0.9
        return model
    raise ValueError(arch)


def train(arch: str, size: int, seed: int, *, train_images: int, epochs: int, path: str):
    """Trains `arch` at `size` with the one recipe (AdamW, warm-up + cosine, label
    smoothing) and saves it to `path` (kept: a second call loads it)."""
    import keras

    if os.path.exists(path):
        return keras.saving.load_model(path, compile=False)
    keras.utils.set_random_seed(seed)
    x, y = fashion_mnist("train", train_images, offset=0)
    steps = (len(x) // BATCH) * epochs
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0, decay_steps=steps - steps // 10, warmup_target=LEARNING_RATE,
        warmup_steps=steps // 10)
    optimizer = keras.optimizers.AdamW(schedule, weight_decay=WEIGHT_DECAY, clipnorm=1.0)
    model = build(arch, size)
    model.compile(optimizer=optimizer, loss=keras.losses.CategoricalCrossentropy(
        from_logits=True, label_smoothing=LABEL_SMOOTHING), metrics=["accuracy"])
    start = time.time()
    model.fit(train_dataset(x, y, size, seed), epochs=epochs, verbose=2)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    model.save(path)
    print(f"trained {arch} {size}px seed {seed} in {time.time() - start:.0f} s -> {path}",
          flush=True)
    return model


#: The activation range methods measured (the first is the export before this benchmark).
RANGE_METHODS = ("minmax", "p99.99", "mse")
#: The GroupNorm variance forms measured with the default range method: row name -> form
#: (`keras_mvit2.layers.export_forms.ExportForms.variance`; docs/int8.md section 6).
VARIANCE_ROWS = {"int8 default gn E[x^2] mean": "one_pass",
                 "int8 default gn E[x^2] matmul": "one_pass_matmul"}
CALIBRATION_IMAGES = 200
TIMING_RUNS = 60
#: The QAT rows' extra facts (kept in the JSON beside the measures).
QAT_FACTS = ("shipped", "reason", "qat_seconds", "train_seconds", "steps", "learning_rate",
             "judged_agreement_post_training", "judged_agreement_qat", "judged_only_post",
             "judged_only_qat", "p_value", "judge_images")


def control_int8(model, path: str, calibration, io_dtype: str) -> None:
    """The control's file, as MobileNetV2's users make it: the plain converter (also
    our model's ``int8 plain converter`` row, float I/O)."""
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([image[None]] for image in calibration)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if io_dtype != "float32":
        converter.inference_input_type = converter.inference_output_type = getattr(tf, io_dtype)
    with open(path, "wb") as f:
        f.write(converter.convert())


def control_float32(model, path: str) -> None:
    import tensorflow as tf

    with open(path, "wb") as f:
        f.write(tf.lite.TFLiteConverter.from_keras_model(model).convert())


def margins(logits):
    """Softmax probability of the top class minus the second's, per image."""
    import numpy as np

    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    top2 = np.sort(p, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def measure(path: str, images, labels, reference) -> dict:
    import numpy as np

    from keras_mvit2.export.tflite.run import run_tflite

    out = run_tflite(path, images)
    pred, ref = out.argmax(1), reference.argmax(1)
    return {
        "top1": float(np.mean(pred == labels)),
        "agreement": float(np.mean(pred == ref)),
        "drop_points": 100.0 * float(np.mean(ref == labels) - np.mean(pred == labels)),
        "logit_rel_error": float(
            np.sqrt(((out - reference) ** 2).mean() / (reference ** 2).mean())),
        "size_mb": os.path.getsize(path) / 1e6,
    }


def latencies(paths: dict[str, str]) -> dict[str, tuple[float, float]]:
    """`(wall, cpu)`: median ms at 1 thread (XNNPACK) of every file, timed interleaved in
    one run: wall-clock, and the CPU time of the invoking thread (the one interpreter thread
    runs in it), which leaves out the time other processes held the core."""
    import numpy as np

    from keras_mvit2.latency.litert_timing import make_interpreter, measure_interleaved

    interpreters = {key: make_interpreter(path, threads=1) for key, path in paths.items()}
    samples = measure_interleaved(interpreters, runs=TIMING_RUNS, warmup=5)
    return {key: (float(np.median(s.wall_ms)), float(np.median(s.cpu_ms)))
            for key, s in samples.items()}


def run_qat(model, size: int, folder: str, args, calibration) -> dict:
    """`keras_mvit2.quantize.qat` on the model (kept: a second call reads its facts, unless
    they were recorded before the judge images were set aside: no ``p_value``)."""
    import numpy as np

    from keras_mvit2.quantize import qat

    facts_path = os.path.join(folder, "mobilevitv2_050_qat.json")
    if os.path.exists(facts_path):
        with open(facts_path) as f:
            facts = json.load(f)
        if "p_value" in facts:
            return facts
    x, y = fashion_mnist("train", args.train_images)
    held_x, held_y = fashion_mnist("train", args.qat_held_out, offset=args.train_images)
    result = qat(model, (np.asarray(as_model_input(x, size)), y),
                 steps_per_epoch=args.qat_steps,
                 validation_data=(np.asarray(as_model_input(held_x, size)), held_y),
                 representative_data=calibration,
                 output_path=os.path.join(folder, "mobilevitv2_050_int8_qat_shipped.tflite"),
                 qat_path=os.path.join(folder, "mobilevitv2_050_int8_qat_trained.tflite"),
                 post_training_path=os.path.join(
                     folder, "mobilevitv2_050_int8_qat_post_training.tflite"),
                 io_dtype="float32")
    choice = result.choice
    facts = {"tflite_path": result.tflite_path, "qat_path": result.qat_path,
             "post_training_path": result.post_training_path,
             "shipped": result.shipped, "reason": result.reason,
             "qat_seconds": result.seconds, "train_seconds": result.train_seconds,
             "steps": result.steps, "learning_rate": result.learning_rate,
             "judged_agreement_post_training": choice.agreement_a,
             "judged_agreement_qat": choice.agreement_b,
             "judged_only_post": choice.only_a, "judged_only_qat": choice.only_b,
             "p_value": choice.p_value, "judge_images": result.split.to_dict()}
    with open(facts_path, "w") as f:
        json.dump(facts, f, indent=1)
    return dict(facts)


def run_size_seed(size: int, seed: int, args, results: dict) -> None:
    """Trains (or loads) both networks, converts and measures every row."""
    import numpy as np

    import keras_mvit2 as mv
    from keras_mvit2.layers import export_forms

    key = f"{size}/seed{seed}"
    done = results.setdefault(key, {})
    folder = os.path.join(args.work, f"{size}_seed{seed}")
    os.makedirs(folder, exist_ok=True)
    x_train, _ = fashion_mnist("train", args.train_images)
    calibration = np.asarray(as_model_input(x_train[:CALIBRATION_IMAGES], size))
    x, y = fashion_mnist("test", args.test_images)
    images = np.asarray(as_model_input(x, size))
    files: dict[str, str] = {}
    for arch in args.networks:
        path = os.path.join(args.work, f"{arch}_{size}_seed{seed}.keras")
        if not os.path.exists(path):  # a new training: the rows and files of the last go
            for row_key in [k for k in done if k.startswith(f"{arch} ")]:
                del done[row_key]
            for name in os.listdir(folder):
                if name.startswith(f"{arch}_") and name.endswith(".tflite"):
                    os.remove(os.path.join(folder, name))
        model = train(arch, size, seed, train_images=args.train_images, epochs=args.epochs,
                      path=path)
        reference = np.asarray(model.predict(images, batch_size=32, verbose=0))
        float_row = {"keras_top1": float(np.mean(reference.argmax(1) == y)),
                     "median_margin": float(np.median(margins(reference)))}
        f32 = os.path.join(folder, f"{arch}_float32.tflite")
        rows = {}
        if arch == "mobilevitv2_050":
            if not os.path.exists(f32):
                mv.export.to_tflite(model, f32)
            default = mv.export.tflite.quantization.TFLITE_QUANTIZATIONS["int8"].activation_ranges
            for method in RANGE_METHODS:
                rows[f"int8 {method}"] = dict(activation_ranges=method)
            rows["int8 default uint8"] = dict(activation_ranges=default, io_dtype="uint8")
            for name, variance in VARIANCE_ROWS.items():
                rows[name] = dict(activation_ranges=default, variance=variance)
            for name, options in rows.items():
                out = os.path.join(folder, f"{arch}_{name.replace(' ', '_')}.tflite")
                if not os.path.exists(out):
                    variance = options.pop("variance", None)  # None: the default int8 forms
                    forms = export_forms.ExportForms(variance=variance) if variance else None
                    mv.export.to_tflite(model, out, quantization="int8",
                                        representative_data=calibration, forms=forms,
                                        **options)
                rows[name] = out
            out = os.path.join(folder, f"{arch}_int8_equalized.tflite")
            if not os.path.exists(out):
                equalized, _ = mv.export.equalize_attention(model, calibration[:64])
                mv.export.to_tflite(equalized, out, quantization="int8",
                                    representative_data=calibration)
            rows["int8 default equalized"] = out
            out = os.path.join(folder, f"{arch}_int8_plain_converter.tflite")
            if not os.path.exists(out):  # the control's converter settings, our model
                control_int8(model, out, calibration, "float32")
            rows["int8 plain converter"] = out
            qat_facts = run_qat(model, size, folder, args, calibration)
            for row_key in [k for k in done if k.startswith(f"{arch} int8 qat")]:
                if "p_value" not in done[row_key]:  # judged before the set-aside images
                    del done[row_key]
            rows["int8 qat post-training"] = qat_facts.pop("post_training_path")
            rows["int8 qat trained"] = qat_facts.pop("qat_path")
            rows["int8 qat shipped"] = qat_facts.pop("tflite_path")
        else:
            if not os.path.exists(f32):
                control_float32(model, f32)
            for io in ("float32", "uint8"):
                out = os.path.join(folder, f"{arch}_int8_{io}.tflite")
                if not os.path.exists(out):
                    control_int8(model, out, calibration, io)
                rows[f"int8 plain converter{' uint8' if io == 'uint8' else ''}"] = out
        for name, out in rows.items():
            row_key = f"{arch} {name}"
            if row_key not in done:
                done[row_key] = {**float_row, **measure(out, images, y, reference)}
                if name.startswith("int8 qat"):
                    done[row_key].update(qat_facts)
                print(f"{key} {row_key}: {done[row_key]}", flush=True)
            files[row_key] = out
        files[f"{arch} float32"] = f32
    from keras_mvit2.latency.host_info import cpu_features

    load = [round(v, 2) for v in os.getloadavg()]
    cpu = cpu_features()  # XNNPACK picks its kernels by these flags: int8's speed depends on them
    timing = latencies(files)
    for row_key, row in done.items():
        if row_key in timing:
            wall, cpu_ms = timing[row_key]
            wall_f32, cpu_f32 = timing[f"{row_key.split()[0]} float32"]
            row.update(latency_ms=wall, x_float32=wall / wall_f32, latency_cpu_ms=cpu_ms,
                       x_float32_cpu=cpu_ms / cpu_f32, timing_load_average=load,
                       timing_cpu={"model": cpu["model"], "flags": cpu["flags"]})


def qat_run(rows: dict, seed: str) -> dict:
    """One training's QAT facts, and what the test images say of its choice: the trained
    and the shipped file's agreement with Keras against the post-training file's (points).
    Runs recorded before QAT's post-training file was kept use the ``int8 p99.99`` row: the
    same conversion (the same calibration images, ranges and I/O; the same logits)."""
    shipped = rows["mobilevitv2_050 int8 qat shipped"]
    post = rows.get("mobilevitv2_050 int8 qat post-training") or rows.get(
        "mobilevitv2_050 int8 p99.99")
    trained = rows["mobilevitv2_050 int8 qat trained"]
    run = {"seed": seed, **{f: shipped.get(f) for f in QAT_FACTS}}
    if shipped.get("judged_interval") is not None:  # recorded before the paired test
        run["judged_interval"] = shipped["judged_interval"]
    run["judged_gain_points"] = (
        None if shipped.get("judged_agreement_qat") is None else
        100 * (shipped["judged_agreement_qat"] - shipped["judged_agreement_post_training"]))
    run["test_agreement_post_training"] = None if post is None else post["agreement"]
    run["test_agreement_qat"] = trained["agreement"]
    run["test_agreement_shipped"] = shipped["agreement"]
    run["test_gain_points"] = (None if post is None
                               else 100 * (trained["agreement"] - post["agreement"]))
    run["shipped_below_post_training"] = (None if post is None
                                          else shipped["agreement"] < post["agreement"])
    return run


def summarize(results: dict, sizes, seeds) -> list[dict]:
    import numpy as np

    table = []
    for size in sizes:
        keys = [f"{size}/seed{seed}" for seed in seeds if f"{size}/seed{seed}" in results]
        names = sorted({row for k in keys for row in results[k]},
                       key=lambda n: (not n.startswith("mobilevit"), n))
        for name in names:
            runs = [results[k][name] for k in keys if name in results[k]]
            entry = {"size": size, "row": name, "seeds": len(runs)}
            if name.endswith("int8 qat shipped"):
                entry["runs"] = [qat_run(results[k], k.split("seed")[-1]) for k in keys
                                 if name in results[k]]
            for field in ("keras_top1", "top1", "drop_points", "agreement", "median_margin",
                          "logit_rel_error", "latency_ms", "x_float32", "size_mb"):
                values = [r[field] for r in runs if field in r]
                entry[field] = float(np.median(values)) if values else None
                entry[f"{field}_per_seed"] = values
            table.append(entry)
    return table


def qat_table(qat_rows: list[dict]) -> list[str]:
    """The QAT table's lines: per training, the choice beside what the test images say."""
    def pct(v):
        return "-" if v is None else f"{100 * v:.1f} %"

    def points(v):
        return "-" if v is None else f"{v:+.1f}"

    lines = [
        "Quantization-aware training (`keras_mvit2.quantize.qat`), per training: the judge "
        "images (held-out + set aside before training, none trained or calibrated on), the "
        "two files' agreement with Keras there, the exact one-sided paired test's p and the "
        "file written; then, on the test images, the trained file's gain in agreement over "
        "the post-training file and whether the shipped file agrees less often than the "
        "post-training file; the wall time of the whole call and of its training.",
        "",
        "| size | seed | judge images | judged: post-training | judged: QAT | judged gain "
        "(points) | p | shipped | test gain (points) | shipped below post-training on the "
        "test images | qat s | train s | steps |",
        "|---:|---:|---|---:|---:|---:|---:|---|---:|---|---:|---:|---:|",
    ]
    for e in qat_rows:
        for run in e["runs"]:
            judge = run.get("judge_images") or {}
            judged = (f"{judge['held_out']} + {judge['set_aside']}" if judge
                      else "held-out + shifted training images")
            below = run.get("shipped_below_post_training")
            p = "-" if run.get("p_value") is None else f"{run['p_value']:.2g}"
            lines.append(
                f"| {e['size']} | {run['seed']} | {judged} | "
                f"{pct(run['judged_agreement_post_training'])} | "
                f"{pct(run['judged_agreement_qat'])} | {points(run['judged_gain_points'])} | "
                f"{p} | "
                f"{run['shipped']} | {points(run['test_gain_points'])} | "
                f"{'-' if below is None else ('yes' if below else 'no')} | "
                f"{run['qat_seconds']:.0f} | {run['train_seconds']:.0f} | {run['steps']} |")
    return lines


def fidelity_rows(table: list[dict]) -> list[str]:
    """The main table (header and one row per size and file: medians over the seeds)."""
    def pct(v):
        return "-" if v is None else f"{100 * v:.1f} %"

    def num(v, digits=2):
        return "-" if v is None else f"{v:.{digits}f}"

    lines = ["| size | file | seeds | Keras top-1 | int8 top-1 | drop (points) | agreement | "
             "median margin | logit rel. error | ms (1 thread) | x float32 |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for e in table:
        lines.append(
            f"| {e['size']} | {e['row']} | {e['seeds']} | {pct(e['keras_top1'])} | "
            f"{pct(e['top1'])} | {e['drop_points']:+.1f} | {pct(e['agreement'])} | "
            f"{e['median_margin']:.2f} | {e['logit_rel_error']:.3f} | "
            f"{num(e['latency_ms'])} | {num(e['x_float32'])} |")
    return lines


def markdown(table: list[dict], args) -> str:
    lines = [
        "# Full-int8 fidelity: MobileViTV2-0.5 vs the MobileNetV2-0.5 control",
        "",
        f"`python benchmarks/int8_fidelity.py` ({args.train_images} Fashion-MNIST training "
        f"images, {args.epochs} epochs, {args.test_images} held-out test images; medians over "
        "the seeds, per-seed values in the JSON).",
        "",
        *fidelity_rows(table),
    ]
    qat_rows = [e for e in table if e["row"].endswith("int8 qat shipped")]
    if qat_rows:
        lines += ["", *qat_table(qat_rows)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 128, 64])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--train-images", type=int, default=3000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--test-images", type=int, default=1000)
    parser.add_argument("--work", default=os.path.join(ROOT, "runs", "int8_fidelity"))
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--networks", nargs="+", choices=NETWORKS, default=list(NETWORKS),
                        help="the networks to train (or load) and measure; the rows of the "
                             "others stay as recorded")
    parser.add_argument("--qat-steps", type=int, default=300,
                        help="the QAT row's training steps (batches of 8)")
    parser.add_argument("--qat-held-out", type=int, default=500,
                        help="training images after --train-images that the QAT choice is "
                             "judged on")
    parser.add_argument("--train-only", action="store_true",
                        help="train (or load) the models and stop")
    args = parser.parse_args(argv)
    if args.train_only:
        for size in args.sizes:
            for seed in args.seeds:
                for arch in args.networks:
                    train(arch, size, seed, train_images=args.train_images, epochs=args.epochs,
                          path=os.path.join(args.work, f"{arch}_{size}_seed{seed}.keras"))
        return 0
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "int8_fidelity.json")
    record = {}
    if os.path.exists(json_path):
        with open(json_path) as f:
            record = json.load(f)
    results = record.setdefault("runs", {})
    for size in args.sizes:
        for seed in args.seeds:
            start = time.time()
            run_size_seed(size, seed, args, results)
            print(f"{size}px seed {seed}: {time.time() - start:.0f} s", flush=True)
            record.update(
                command="python benchmarks/int8_fidelity.py", host=platform.node(),
                cpu_count=os.cpu_count(), load_average=list(os.getloadavg()),
                train_images=args.train_images, epochs=args.epochs,
                test_images=args.test_images, calibration_images=CALIBRATION_IMAGES,
                table=summarize(results, sorted({int(k.split("/")[0]) for k in results},
                                                reverse=True), range(10)),
            )
            from keras_mvit2.utils.files import atomic_output, write_text

            with atomic_output(json_path) as tmp, open(tmp, "w") as f:
                json.dump(record, f, indent=1)
            write_text(os.path.join(args.out, "int8_fidelity.md"), markdown(record["table"], args))
    print(markdown(record["table"], args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
