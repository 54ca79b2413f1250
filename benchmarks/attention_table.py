"""The paper's Table 1 on Fashion-MNIST, with error bars: each attention trained with one
recipe and several seeds, then accuracy (mean +- std, the paired interval to separable),
cost and TFLite latency (float32 and full int8, 1 and 2 threads) side by side.

    python benchmarks/attention_table.py [--phase both|train|latency|report]
        [--seeds 0 1 2] [--epochs 1] [--image-size 64] [--threads 2]
        [--mechanisms separable mha linformer rfa mobile_attention]
        [--latency-threads 1 2] [--run-dir runs/attention_table] [--out benchmarks/results]

Phases (`--phase`, default `both`: train, then latency):

- `train`: for each seed and each mechanism (seed by seed, so that a whole seed is done
  first), MobileViTV2-0.5 with that attention in every transformer layer
  (`model.attention`, the registry's default arguments) is trained from scratch with the
  packaged `fashion_mnist` recipe (AdamW, lr 0.002 at batch 64, weight decay 0.05, cosine
  to 1e-5 after a warm-up of a quarter epoch, label smoothing 0.1, EMA 0.999, mild random
  resized crop and flip; float32 on CPU); nothing is tuned per mechanism. Seed `s` sets
  `training.seed=s` (the initial weights) and `data.seed=1000*s` (the data order and the
  augmentation): the trainer gives its epoch `e` the data seed `data.seed + e`, so seeds
  1000 apart never share an epoch's data (with `data.seed=s` seed 1's epochs would be seed
  0's shifted by one). Seed 0 is the recipe of the earlier one-seed table. Same seed = same
  data order and initial seed for every mechanism: the differences to separable are
  paired by seed. Each epoch is split into `--curve-points` equal parts (Keras "epochs" of
  `training.steps_per_epoch` steps) so that the loss curve has points and a killed run
  loses at most one part; the schedule depends only on the step. Each run trains in
  `<run-dir>/seed<s>/<mechanism>/` (resumed from its checkpoints when killed) and its
  record is written to `<run-dir>/seed<s>/<mechanism>.json` as soon as it finishes: a
  later call reuses it and skips the run (a record trained with other settings is
  refused). A run that diverges is recorded as diverged, with its curve, and the others go
  on.
- `latency`: parameters, MACs and TFLite latency of each mechanism, float32 and full
  int8 (int8 I/O, calibrated on 32 Fashion-MNIST training images), at the training size
  and at 256x256, on 1 and 2 interpreter threads with XNNPACK, all files and thread
  counts timed interleaved in one run (`keras_mvit2.latency.host.measure_interleaved`).
  The models are the trained ones (the lowest trained seed); a mechanism with no trained
  model yet is timed with randomly initialised weights and the table says so (latency
  does not depend on the values; only int8's calibration ranges do). The 256x256 model is
  the same architecture built at 256 with the weights copied layer by layer (Linformer's
  token projections depend on the number of tokens and stay random there). A file that
  fails to convert or to run is recorded with the reason. The CPU model and its flags
  that matter to XNNPACK are recorded.
- `report`: only rewrites the JSON, table and plot from the records (both other phases
  end with it). The latency of an earlier `latency` phase is read back from
  `--out/attention_table.json`.

Accuracy: top-1 of the raw and the EMA weights on the 10,000 test images; per mechanism
mean +- standard deviation over the seeds (n - 1 in the denominator), and the 95 %
interval of its difference to separable: a Student t interval on the per-seed
differences (paired by seed), mean +- t(0.975, n - 1) * sd / sqrt(n). Latency: median of
the timed invokes (1 thread: the invoking thread's CPU time; 2 threads: wall-clock time,
the other thread's work being part of it) with a distribution-free 95 % interval of the
median (order statistics, `scipy.stats.quantile_test`; from this run's samples only).
The paper's claims are judged from these intervals (generated text).

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
top-1 against int8 latency at 256x256, and the training loss curves) to `--out`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MECHANISMS = ("separable", "mha", "linformer", "rfa", "mobile_attention")
REFERENCE = "separable"
MODEL = "mobilevitv2_050"
LATENCY_SIZE = 256
PRECISIONS = ("float32", "int8")
TRAIN_EXAMPLES = 60_000
#: Seed `s` trains with `data.seed = DATA_SEED_STRIDE * s` (see the module docstring).
DATA_SEED_STRIDE = 1000
CONFIDENCE = 0.95
#: The paper's gap (points of top-1) between separable and MHA: 78.1 against 78.4.
CLAIM_BAND = 0.3
#: The table's format; `--phase train` / `report` read the latency back only from it.
FORMAT = "keras_mvit2.attention_table/2"
PAPER_TABLE_1 = [  # MobileViT on ImageNet-1k, iPhone 12 (the paper's Table 1)
    {"attention": "Self-attention in Transformer (mha)", "ne_ms": 9.9, "cpu_ms": 78.6,
     "top1": 78.4},
    {"attention": "Self-attention in Linformer (linformer)", "ne_ms": 10.2, "cpu_ms": 83.2,
     "top1": 78.2},
    {"attention": "Separable self-attention (separable)", "ne_ms": 3.4, "cpu_ms": 38.6,
     "top1": 78.1},
]
#: The attentions whose accuracy the paper compares with separable's (Table 1).
PAPER_ACCURACY_PEERS = ("mha", "linformer")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phase", choices=("both", "train", "latency", "report"), default="both",
                   help="train the runs, time the files, both (default), or only rewrite "
                        "the report from the records")
    p.add_argument("--mechanisms", nargs="+", default=list(MECHANISMS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2],
                   help="training.seed = s and data.seed = 1000 * s for each seed s")
    p.add_argument("--epochs", type=float, default=1.0, help="passes over the 60,000 images")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--curve-points", type=int, default=8, help="loss points per epoch")
    p.add_argument("--train-limit", type=int, default=None,
                   help="use the first N training images (a quick look; default: all)")
    p.add_argument("--test-limit", type=int, default=None,
                   help="evaluate on the first N test images (default: all 10,000)")
    p.add_argument("--threads", type=int, default=2, help="TensorFlow threads for training")
    p.add_argument("--latency-threads", nargs="+", type=int, default=[1, 2],
                   help="interpreter threads to time each .tflite file with")
    p.add_argument("--runs", type=int, default=60, help="timed invokes per file and thread count")
    p.add_argument("--rounds", type=int, default=10, help="interleaving rounds")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--run-dir", default="runs/attention_table")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    if len(set(args.seeds)) != len(args.seeds) or min(args.seeds) < 0:
        p.error(f"--seeds must be distinct non-negative integers. Received: {args.seeds}")
    if min(args.latency_threads) < 1:
        p.error(f"--latency-threads must be >= 1. Received: {args.latency_threads}")
    if args.epochs <= 0 or args.curve_points < 1:
        p.error(f"--epochs must be > 0 and --curve-points >= 1. Received: "
                f"--epochs {args.epochs} --curve-points {args.curve_points}")
    return args


# --------------------------------------------------------------------------------------
# Training


def run_folder(run_dir: str, seed: int, mechanism: str) -> str:
    """The training folder of one run."""
    return os.path.join(run_dir, f"seed{seed}", mechanism)


def record_path(run_dir: str, seed: int, mechanism: str) -> str:
    """The record of one finished run (beside its folder)."""
    return os.path.join(run_dir, f"seed{seed}", f"{mechanism}.json")


def recipe(mechanism: str, seed: int, args: argparse.Namespace):
    """The packaged Fashion-MNIST recipe with `model.attention=mechanism` and `seed`."""
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
        "training.validate_every=0", f"training.seed={seed}",
        f"data.seed={DATA_SEED_STRIDE * seed}",
        f"output.dir={run_folder(args.run_dir, seed, mechanism)}", "output.verbose=2",
        "output.tensorboard=false",
    ]
    if args.train_limit:
        overrides.append(f"data.train_limit={args.train_limit}")
    if args.test_limit:
        overrides.append(f"data.validation_limit={args.test_limit}")
    return training.load_config("fashion_mnist", overrides)


def comparable(config_dict: dict[str, Any]) -> dict[str, Any]:
    """A run's config without its `output` section (where it was written, how verbosely:
    the earlier one-seed table trained with `output.verbose=0`, this one prints a line
    per curve point)."""
    return {k: v for k, v in config_dict.items() if k != "output"}


def load_record(path: str, config) -> dict[str, Any] | None:
    """The record of a finished run, or None; refuses one trained with other settings."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        record = json.load(f)
    wanted = json.loads(json.dumps(comparable(config.to_dict())))  # tuples -> lists
    if comparable(record["config"]) != wanted:
        changed = sorted(f"{section}.{key}" for section, values in wanted.items()
                         for key, value in values.items()
                         if record["config"].get(section, {}).get(key) != value)
        raise ValueError(
            f"{path} holds a run trained with other settings ({', '.join(changed)}). Use "
            "another --run-dir, or remove that record and its run folder to train it again.")
    return record


def training_environment(args: argparse.Namespace) -> dict[str, Any]:
    import keras
    import tensorflow as tf

    from keras_mvit2.latency.host import host_device

    def git(*command: str) -> str | None:
        try:
            return subprocess.run(["git", *command], cwd=HERE, text=True, capture_output=True,
                                  check=True).stdout.rstrip()
        except (OSError, subprocess.CalledProcessError):
            return None

    device = host_device()
    changed = git("status", "--porcelain", "--", os.path.join(os.path.dirname(HERE),
                                                               "keras_mvit2"))
    return {"cpu": device["cpu"], "cores": device["cores"], "tensorflow": tf.__version__,
            "keras": keras.__version__, "training_threads": args.threads,
            "python": sys.version.split()[0], "git_commit": git("rev-parse", "--short", "HEAD"),
            "uncommitted_package_files": sorted(line[3:] for line in (changed or "").splitlines())}


def train_one(mechanism: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """Trains (or resumes) one run; its record (diverged runs included)."""
    from keras_mvit2 import training
    from keras_mvit2.training.divergence import TrainingDivergedError
    from keras_mvit2.training.run_folder import STATE_FILE

    config = recipe(mechanism, seed, args)
    start = time.perf_counter()
    record: dict[str, Any] = {"mechanism": mechanism, "seed": seed,
                              "config": config.to_dict(),
                              "environment": training_environment(args)}
    try:
        result = training.train(config)
    except TrainingDivergedError as err:
        state_path = os.path.join(config.output.dir, "checkpoints", STATE_FILE)
        history = []
        if os.path.exists(state_path):
            with open(state_path) as f:
                history = json.load(f).get("history", [])
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
        resumed_at_epoch=result.initial_epoch,
        train_minutes=sum(h.get("seconds", 0.0) for h in result.history) / 60,
        wall_minutes=(time.perf_counter() - start) / 60,
        model_path=os.path.abspath(result.model_path),
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


def train_phase(mechanisms: Sequence[str], args: argparse.Namespace) -> None:
    """Trains every (seed, mechanism) run without a record, seed by seed."""
    from keras_mvit2.utils.files import write_json

    for seed in args.seeds:
        for mechanism in mechanisms:
            path = record_path(args.run_dir, seed, mechanism)
            if load_record(path, recipe(mechanism, seed, args)) is not None:
                print(f"== seed {seed}, {mechanism}: done ({path})", flush=True)
                continue
            print(f"== seed {seed}, {mechanism}: training ...", flush=True)
            record = train_one(mechanism, seed, args)
            write_json(path, record)
            if record["status"] == "trained":
                resumed = (f", resumed after curve point {record['resumed_at_epoch']}"
                           if record["resumed_at_epoch"] else "")
                print(f"   top-1 raw {100 * record['top1']['raw']:.2f} %, EMA "
                      f"{100 * record['top1']['ema']:.2f} %; {record['train_minutes']:.1f} "
                      f"min of training, {record['wall_minutes']:.1f} min in this call"
                      f"{resumed}", flush=True)
            else:
                print(f"   diverged: {record['error'].splitlines()[0]}", flush=True)


def load_records(mechanisms: Sequence[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The records of the finished runs in `--run-dir` (seed by seed; missing ones left out)."""
    records = []
    for seed in args.seeds:
        for mechanism in mechanisms:
            record = load_record(record_path(args.run_dir, seed, mechanism),
                                 recipe(mechanism, seed, args))
            if record is not None:
                records.append(record)
    return records


# --------------------------------------------------------------------------------------
# Statistics


def seed_statistics(values: Mapping[int, float]) -> dict[str, Any]:
    """`n`, `mean` and `std` (n - 1 in the denominator; None below 2) of per-seed values."""
    seeds = sorted(values)
    x = np.array([values[s] for s in seeds], dtype=float)
    return {"n": len(x), "seeds": seeds, "values": [float(v) for v in x],
            "mean": float(x.mean()) if len(x) else None,
            "std": float(x.std(ddof=1)) if len(x) > 1 else None}


def paired_interval(a: Mapping[int, float], b: Mapping[int, float],
                    confidence: float = CONFIDENCE) -> dict[str, Any]:
    """The `confidence` interval of the mean of `a - b` over the seeds both have.

    A Student t interval on the per-seed differences: mean +- t((1 + confidence) / 2,
    n - 1) * sd / sqrt(n), sd with n - 1 in the denominator. `low` / `high` are None with
    fewer than 2 paired seeds.
    """
    from scipy import stats

    seeds = sorted(set(a) & set(b))
    d = np.array([a[s] - b[s] for s in seeds], dtype=float)
    n = len(d)
    out: dict[str, Any] = {
        "n": n, "seeds": seeds, "differences": [float(v) for v in d],
        "mean": float(d.mean()) if n else None, "std": float(d.std(ddof=1)) if n > 1 else None,
        "confidence": confidence, "t": None, "low": None, "high": None,
        "method": f"Student t interval on the {n} per-seed differences (paired by seed): "
                  f"mean +- t({(1 + confidence) / 2:g}, n - 1) * sd / sqrt(n)",
    }
    if n > 1:
        t = float(stats.t.ppf((1 + confidence) / 2, n - 1))
        half = t * out["std"] / math.sqrt(n)
        out.update(t=t, low=out["mean"] - half, high=out["mean"] + half)
    return out


def median_interval(samples: Sequence[float],
                    confidence: float = CONFIDENCE) -> tuple[float | None, float | None]:
    """Distribution-free `confidence` interval of the median: two order statistics
    (`scipy.stats.quantile_test`); an end is None when there are too few samples."""
    from scipy import stats

    x = np.asarray(samples, dtype=float)
    ci = stats.quantile_test(x, q=float(np.median(x)), p=0.5).confidence_interval(confidence)
    low, high = float(ci.low), float(ci.high)
    return (None if math.isnan(low) else low), (None if math.isnan(high) else high)


def summarize(records: Sequence[dict[str, Any]],
              mechanisms: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per mechanism: trained and diverged seeds, top-1 (points) per seed, mean and std,
    and the paired interval of its difference to separable (raw and EMA)."""
    top1: dict[str, dict[str, dict[int, float]]] = {
        m: {"raw": {}, "ema": {}} for m in mechanisms}
    diverged: dict[str, list[int]] = {m: [] for m in mechanisms}
    for r in records:
        if r["mechanism"] not in top1:
            continue
        if r["status"] != "trained":
            diverged[r["mechanism"]].append(r["seed"])
            continue
        for weights in ("raw", "ema"):
            if weights in r["top1"]:
                top1[r["mechanism"]][weights][r["seed"]] = 100 * r["top1"][weights]
    summary = {}
    for m in mechanisms:
        summary[m] = {"diverged_seeds": diverged[m],
                      "top1": {w: seed_statistics(top1[m][w]) for w in ("raw", "ema")}}
        if m != REFERENCE and REFERENCE in top1:
            summary[m]["minus_separable"] = {
                w: paired_interval(top1[m][w], top1[REFERENCE][w]) for w in ("raw", "ema")}
    return summary


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


def base_model(mechanism: str, records: Sequence[dict[str, Any]], image_size: int):
    """`(model at the training size, what its weights are)`: the lowest trained seed's,
    else a random initialisation (seed 0)."""
    import keras

    from keras_mvit2.models import create_model

    for r in sorted(records, key=lambda r: r["seed"]):
        if (r["mechanism"] == mechanism and r["status"] == "trained"
                and os.path.exists(r["model_path"])):
            return keras.saving.load_model(r["model_path"]), f"trained, seed {r['seed']}"
    keras.utils.set_random_seed(0)
    model = create_model(MODEL, input_shape=(image_size, image_size, 3), classes=10,
                         attention=mechanism, classifier_activation="softmax")
    return model, "random initialisation (no trained model yet)"


def latency_phase(mechanisms: Sequence[str], records: Sequence[dict[str, Any]],
                  args: argparse.Namespace, folder: str) -> dict[str, Any]:
    """Params, MACs and interleaved TFLite latencies of every mechanism, size, precision
    and thread count (see the module docstring)."""
    from keras_mvit2.latency.attention_sweep import machine_label
    from keras_mvit2.latency.host import (
        _histogram_and_report,
        host_device,
        litert_runtime,
        make_interpreter,
        make_result,
        measure_interleaved,
        tflite_model_entry,
    )
    from keras_mvit2.latency.models_table import convert_for_latency
    from keras_mvit2.profiling import profile

    sizes = sorted({args.image_size, LATENCY_SIZE})
    images = {size: calibration_images(size) for size in sizes}
    per: dict[str, dict[str, Any]] = {}
    files: dict[tuple[str, int, str], str] = {}
    entries: dict[tuple[str, int, str], dict[str, Any]] = {}
    for mechanism in mechanisms:
        trained, weights = base_model(mechanism, records, args.image_size)
        entry = per[mechanism] = {"weights": weights, "cost": {}, "failed": {}, "files": {}}
        for size in sizes:
            model, not_copied = at_size(trained, mechanism, size)
            info = profile(model)
            entry["cost"][str(size)] = {"params": info.params, "macs": info.macs,
                                        "layers_not_copied": not_copied}
            for precision in PRECISIONS:
                path = os.path.join(folder, f"{mechanism}_{size}_{precision}.tflite")
                print(f"{mechanism} @{size}: converting to {precision} ...", flush=True)
                try:
                    note = convert_for_latency(
                        model, path, precision, size, images=images[size],
                        images_note=f"{len(images[size])} Fashion-MNIST training images")
                except (RuntimeError, ValueError) as err:  # e.g. fails to run in LiteRT
                    reason = str(err).splitlines()[0][:300]
                    entry["failed"][f"{size} {precision}"] = reason
                    print(f"  failed: {reason}", flush=True)
                    continue
                key = (mechanism, size, precision)
                files[key] = path
                entries[key] = tflite_model_entry(path, name=mechanism, params=info.params,
                                                  macs=info.macs,
                                                  source=f"{MODEL} + {mechanism} @{size}")
                entries[key].update(precision=precision, notes=note)
    interpreters = {}
    for (mechanism, size, precision), path in files.items():
        for threads in args.latency_threads:
            try:
                interpreters[(mechanism, size, precision, threads)] = make_interpreter(
                    path, threads=threads)
            except (RuntimeError, ValueError) as err:
                per[mechanism]["failed"][f"{size} {precision} {threads} threads"] = (
                    str(err).splitlines()[0][:300])
    print(f"timing {len(interpreters)} interpreters interleaved ...", flush=True)
    samples = measure_interleaved(interpreters, runs=args.runs, warmup=args.warmup,
                                  rounds=args.rounds)
    del interpreters
    reports = {path: _histogram_and_report(path) for path in files.values()}
    for (mechanism, size, precision, threads), timed in samples.items():
        histogram, extra = reports[files[(mechanism, size, precision)]]
        clock, values = (("cpu", timed.cpu_ms) if threads == 1 else ("wall", timed.wall_ms))
        low, high = median_interval(values)
        extra = {**extra, "clock": clock, "median_ms": float(np.median(values)),
                 "median_interval_ms": [low, high]}
        result = make_result(entries[(mechanism, size, precision)], timed, warmup=args.warmup,
                             threads=threads, xnnpack=True, peak_memory=None,
                             op_histogram=histogram, extra=extra)
        per[mechanism]["files"].setdefault(str(size), {}).setdefault(str(threads), {})[
            precision] = result.to_dict()
    from keras_mvit2.latency.host_info import _timestamp, cpu_features

    return {
        "machine": machine_label(host_device(), {
            **litert_runtime(1, True), "threads": ", ".join(map(str, args.latency_threads))}),
        "cpu": cpu_features(), "cores": os.cpu_count(), "timestamp": _timestamp(),
        "settings": {"sizes": sizes, "threads": list(args.latency_threads), "runs": args.runs,
                     "rounds": args.rounds, "warmup": args.warmup, "xnnpack": True},
        "mechanisms": per,
    }


def file_latency(latency: dict[str, Any] | None, mechanism: str, size: int, threads: int,
                 precision: str) -> dict[str, Any] | None:
    """`{"median", "low", "high", "clock"}` (ms) of one timed file, or None."""
    if not latency:
        return None
    result = ((latency["mechanisms"].get(mechanism) or {}).get("files", {})
              .get(str(size), {}).get(str(threads), {}).get(precision))
    if result is None:
        return None
    extra = result["extra"]
    low, high = extra["median_interval_ms"]
    return {"median": extra["median_ms"], "low": low, "high": high, "clock": extra["clock"]}


def int8_ratio(latency: dict[str, Any] | None, mechanism: str, size: int,
               threads: int) -> float | None:
    """int8 median / float32 median of one mechanism, size and thread count."""
    fp32 = file_latency(latency, mechanism, size, threads, "float32")
    int8 = file_latency(latency, mechanism, size, threads, "int8")
    if fp32 is None or int8 is None:
        return None
    return int8["median"] / fp32["median"]


# --------------------------------------------------------------------------------------
# The paper's claims


def band_verdict(low: float | None, high: float | None, band: float) -> str:
    """Whether `other - separable <= band` (separable loses at most `band` points):
    `holds` when the interval's upper end is within it, `does not hold` when its lower end
    is beyond it, else `cannot be told apart`."""
    if low is None or high is None:
        return "not measured"
    if high <= band:
        return "holds"
    if low > band:
        return "does not hold"
    return "cannot be told apart"


def sign_verdict(low: float | None, high: float | None) -> str:
    """`higher` / `lower` when the interval of a difference excludes 0, else `cannot be
    told apart`."""
    if low is None or high is None:
        return "not measured"
    if low > 0:
        return "higher"
    if high < 0:
        return "lower"
    return "cannot be told apart"


def fastest_verdict(reference: dict[str, Any] | None,
                    others: Mapping[str, dict[str, Any] | None]) -> str:
    """Whether `reference`'s median is the lowest, from the medians' intervals: `holds`
    when its interval lies below every other's, `does not hold` when another's lies below
    its own, else `cannot be told apart`."""
    timed = {m: v for m, v in others.items() if v is not None}
    if reference is None or not timed:
        return "not measured"
    if any(v["high"] is None or v["low"] is None for v in [reference, *timed.values()]):
        return "cannot be told apart"
    if all(reference["high"] < v["low"] for v in timed.values()):
        return "holds"
    if any(v["high"] < reference["low"] for v in timed.values()):
        return "does not hold"
    return "cannot be told apart"


def _points(value: float) -> str:
    return f"{value:+.2f}"


def _interval(d: dict[str, Any]) -> str:
    if d["low"] is None:
        return f"{_points(d['mean'])} (n = {d['n']}, no interval)" if d["n"] else "-"
    return f"{_points(d['mean'])} [{_points(d['low'])}, {_points(d['high'])}]"


def claims(summary: dict[str, dict[str, Any]],
           latency: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The paper's Table 1 claims, judged from the intervals: separable within
    `CLAIM_BAND` points of MHA's (and Linformer's) top-1; which attentions' top-1 differs
    from separable's; separable the fastest (per precision, size and thread count)."""
    out = []
    for peer in PAPER_ACCURACY_PEERS:
        if peer not in summary or "minus_separable" not in summary[peer]:
            continue
        paper = {p["attention"].split("(")[-1].rstrip(")"): p["top1"] for p in PAPER_TABLE_1}
        parts, verdicts = [], {}
        for weights in ("raw", "ema"):
            d = summary[peer]["minus_separable"][weights]
            verdicts[weights] = band_verdict(d["low"], d["high"], CLAIM_BAND)
            parts.append(f"top-1 {weights}: {verdicts[weights]} ({peer} - separable = "
                         f"{_interval(d)} points, n = {d['n']})")
        out.append({
            "claim": f"separable loses at most {CLAIM_BAND:g} points of top-1 to {peer} "
                     f"(paper: {paper[REFERENCE]} against {paper[peer]})",
            "verdict": verdicts, "evidence": "; ".join(parts)})
    for weights in ("raw", "ema"):
        verdicts = {m: sign_verdict(s["minus_separable"][weights]["low"],
                                    s["minus_separable"][weights]["high"])
                    for m, s in summary.items() if "minus_separable" in s}
        if not verdicts:
            continue
        groups = {v: sorted(m for m, x in verdicts.items() if x == v)
                  for v in ("higher", "lower", "cannot be told apart", "not measured")}
        text = "; ".join(f"{label}: {', '.join(groups[v])}" for v, label in (
            ("higher", "more accurate than separable"),
            ("lower", "less accurate than separable"),
            ("cannot be told apart", "cannot be told apart from separable"),
            ("not measured", "fewer than 2 paired seeds")) if groups[v])
        out.append({"claim": f"top-1 {weights} differs from separable's (95 % interval of "
                             "the paired difference excludes 0)",
                    "verdict": verdicts, "evidence": text})
    if latency:
        settings = latency["settings"]
        others = [m for m in latency["mechanisms"] if m != REFERENCE]
        for precision in PRECISIONS:
            for size in sorted(settings["sizes"], reverse=True):
                verdicts, parts = {}, []
                for threads in settings["threads"]:
                    ref = file_latency(latency, REFERENCE, size, threads, precision)
                    peers = {m: file_latency(latency, m, size, threads, precision)
                             for m in others}
                    verdict = fastest_verdict(ref, peers)
                    verdicts[str(threads)] = verdict
                    timed = {m: v for m, v in peers.items() if v is not None}
                    detail = ""
                    if ref is not None and timed:
                        nearest = min(timed, key=lambda m: timed[m]["median"])
                        detail = (f" (separable {ref['median']:.2f} ms, fastest other "
                                  f"{nearest} {timed[nearest]['median']:.2f} ms)")
                    missing = sorted(m for m, v in peers.items() if v is None)
                    if missing:
                        detail += f" [not timed: {', '.join(missing)}]"
                    parts.append(f"{threads} thread(s): {verdict}{detail}")
                out.append({"claim": f"separable is the fastest, {precision} at {size}x{size}",
                            "verdict": verdicts, "evidence": "; ".join(parts)})
    return out


# --------------------------------------------------------------------------------------
# Report


def build_table(mechanisms: Sequence[str], records: list[dict[str, Any]],
                latency: dict[str, Any] | None, args: argparse.Namespace) -> dict[str, Any]:
    trained = [r for r in records if r["status"] == "trained"]
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "run_dir", "phase")}
    settings.update(mechanisms=list(mechanisms), model=MODEL, latency_size=LATENCY_SIZE,
                    data_seed_stride=DATA_SEED_STRIDE, claim_band_points=CLAIM_BAND,
                    confidence=CONFIDENCE,
                    optimizer_steps=trained[0]["optimizer_steps"] if trained else None,
                    test_images=trained[0]["test_images"] if trained else None)
    summary = summarize(records, mechanisms)
    return {"format": FORMAT, "settings": settings, "summary": summary, "records": records,
            "latency": latency, "claims": claims(summary, latency),
            "paper_table_1": PAPER_TABLE_1}


def _ms(value: dict[str, Any] | None) -> str:
    return "-" if value is None else f"{value['median']:.2f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _mean_std(stats: dict[str, Any]) -> str:
    if not stats["n"]:
        return "-"
    if stats["std"] is None:
        return f"{stats['mean']:.2f}"
    return f"{stats['mean']:.2f} +- {stats['std']:.2f}"


def run_minutes(record: dict[str, Any], batch_size: int) -> float:
    """A run's training minutes at its median throughput: its images over its median
    images / second, so that a run paused or resumed (its curve segments' wall time includes
    the pause) counts like one that ran through."""
    return record["optimizer_steps"] * batch_size / record["images_per_second"] / 60


def markdown(table: dict[str, Any]) -> str:
    s = table["settings"]
    size = s["image_size"]
    summary, latency = table["summary"], table["latency"]
    steps = s["optimizer_steps"] if s["optimizer_steps"] is not None else "?"
    lines = [
        f"MobileViTV2-0.5 with each attention, trained from scratch on Fashion-MNIST at "
        f"{size}x{size} with one recipe ({s['epochs']:g} epoch(s), {steps} steps of "
        f"{s['batch_size']}, the packaged `fashion_mnist` config, nothing tuned per "
        f"attention), seeds {', '.join(map(str, s['seeds']))} (`training.seed = s`, "
        f"`data.seed = {s['data_seed_stride']} s`; the same seeds for every attention); "
        f"top-1 on the {s['test_images'] or '?'} test images. Mean +- standard deviation "
        "over the seeds; `- separable`: the difference to separable in points with its "
        f"{100 * s['confidence']:g} % interval, a Student t interval on the per-seed "
        "differences (paired by seed), mean +- t(0.975, n - 1) sd / sqrt(n).",
        "",
        f"| attention | seeds | top-1 raw (%) | top-1 EMA (%) | raw - separable | "
        f"EMA - separable | raw per seed | params (M) | MACs @{size} (M) | MACs @256 (M) "
        "| train min / run¹ | img/s |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    runs = {(r["mechanism"], r["seed"]): r for r in table["records"]}
    for m in s["mechanisms"]:
        stats = summary[m]
        raw, ema = stats["top1"]["raw"], stats["top1"]["ema"]
        mine = [runs[(m, seed)] for seed in s["seeds"] if (m, seed) in runs
                and runs[(m, seed)]["status"] == "trained"]
        diff = stats.get("minus_separable")
        cost = ((latency or {}).get("mechanisms", {}).get(m) or {}).get("cost", {})
        small, big = cost.get(str(size)), cost.get("256")
        seeds = f"{raw['n']}" + (f" ({len(stats['diverged_seeds'])} diverged)"
                                 if stats["diverged_seeds"] else "")
        if not raw["n"] and not stats["diverged_seeds"]:
            seeds = "0 (not trained yet)"
        cells = [
            m, seeds, _mean_std(raw), _mean_std(ema),
            _interval(diff["raw"]) if diff else "reference",
            _interval(diff["ema"]) if diff else "reference",
            ", ".join(f"{v:.2f}" for v in raw["values"]) or "-",
            _number(small["params"] / 1e6 if small else None, 3),
            _number(small["macs"] / 1e6 if small else None, 1),
            _number(big["macs"] / 1e6 if big else None, 1),
            _number(np.median([run_minutes(r, s["batch_size"]) for r in mine])
                    if mine else None, 1),
            _number(np.median([r["images_per_second"] for r in mine]) if mine else None, 0),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"- {r['mechanism']} seed {r['seed']}: diverged "
             f"({r['error'].splitlines()[0]})"
             for r in table["records"] if r["status"] != "trained"]
    missing = [f"{m} seed {seed}" for seed in s["seeds"] for m in s["mechanisms"]
               if (m, seed) not in runs]
    if missing:
        notes.append(f"- not trained yet: {', '.join(missing)}")
    notes.insert(0, "- ¹ median over the seeds of each run's optimizer steps x batch size / "
                 "its median images / second (the curve segments' own wall time would count "
                 "a pause of the run)")
    lines += [""] + notes

    lines += [""]
    if latency is None:
        lines += ["Latency: not measured yet (`--phase latency`)."]
    else:
        ls = latency["settings"]
        threads = ls["threads"]
        lines += [
            f"TFLite latency (ms): median of {ls['runs']} invokes per file and thread count, "
            "XNNPACK, all files and thread counts interleaved in one run; 1 thread: the "
            "invoking thread's CPU time, more threads: wall-clock time. int8 = full "
            "integer with int8 I/O; int8 / fp32 = the ratio of the medians (below 1: int8 "
            "is faster).",
            "",
            "| attention | size | weights | " + " | ".join(
                f"fp32 {t}t | int8 {t}t | int8 / fp32 {t}t" for t in threads) + " |",
            "|---|---:|---|" + "---:|---:|---:|" * len(threads),
        ]
        for m in s["mechanisms"]:
            entry = latency["mechanisms"].get(m)
            if entry is None:
                continue
            for sz in ls["sizes"]:
                cells = []
                for t in threads:
                    cells += [_ms(file_latency(latency, m, sz, t, "float32")),
                              _ms(file_latency(latency, m, sz, t, "int8")),
                              _ratio(int8_ratio(latency, m, sz, t))]
                weights = "trained" if entry["weights"].startswith("trained") else "random"
                lines.append(f"| {m} | {sz} | {weights} | " + " | ".join(cells) + " |")
        lnotes = [f"- {m}: weights {e['weights']}" for m, e in latency["mechanisms"].items()
                  if not e["weights"].startswith("trained")]
        lnotes += [f"- {m}: {len(e['cost']['256']['layers_not_copied'])} layer(s) not copied "
                   "at 256x256 (weights that depend on the token count; random there, "
                   "latency only)"
                   for m, e in latency["mechanisms"].items()
                   if e["cost"].get("256", {}).get("layers_not_copied")]
        lnotes += [f"- {m} {what}: no latency, {reason}"
                   for m, e in latency["mechanisms"].items()
                   for what, reason in e["failed"].items()]
        if lnotes:
            lines += [""] + lnotes

    lines += ["", "Plot (`attention_table.png`): mean top-1 with error bars of 1 standard "
              "deviation over the seeds against the full-int8 latency at 256x256 on the "
              "fewest threads timed (hollow markers: float32), and the training loss of "
              "every run."]
    lines += ["", "What the paper's claims say here (generated from the intervals above; "
              f"accuracy: the {100 * s['confidence']:g} % paired t intervals, a claim of at "
              f"most {s['claim_band_points']:g} points judged by the interval's end; speed: "
              "the 95 % distribution-free intervals of the medians, which hold for this "
              "run on this machine only):", ""]
    for c in table["claims"]:
        lines.append(f"- {c['claim']}: {c['evidence']}")
    lines += ["", "The paper's Table 1 (MobileViT on ImageNet-1k, iPhone 12; not comparable "
              "in absolute terms):", "",
              "| attention | latency NE (ms) | latency CPU (ms) | top-1 (%) |",
              "|---|---:|---:|---:|"]
    lines += [f"| {p['attention']} | {p['ne_ms']} | {p['cpu_ms']} | {p['top1']} |"
              for p in table["paper_table_1"]]
    environments = [r["environment"] for r in table["records"] if "environment" in r]
    lines += [""]
    for line in sorted({f"Training: {env['cpu']}, {env['cores']} cores; TensorFlow "
                        f"{env['tensorflow']}, Keras {env['keras']}; "
                        f"{env['training_threads']} TensorFlow threads" for env in environments}):
        commits = sorted({(env.get("git_commit") or "?") + (
            " with uncommitted changes" if env.get("uncommitted_package_files") else "")
            for env in environments})
        lines.append(f"{line}; code at {', '.join(commits)}.")
    if latency is not None:
        cpu = latency["cpu"]
        lines.append(f"Latency: {latency['machine']}, measured {latency['timestamp']}; CPU "
                     f"{cpu['model']}, flags that matter to XNNPACK: "
                     f"{', '.join(cpu['flags']) or 'none found'} (checked: "
                     f"{', '.join(cpu['flags_checked'])}).")
    return "\n".join(lines) + "\n"


def plot(table: dict[str, Any], path: str) -> None:
    """Top-1 (mean, error bars = std over the seeds) against the int8 latency at 256x256
    (1 thread; a hollow marker at float32's), and the training loss curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from keras_mvit2.utils.files import atomic_output

    s, summary, latency = table["settings"], table["summary"], table["latency"]
    threads = min(latency["settings"]["threads"]) if latency else 1
    colors = {m: f"C{i}" for i, m in enumerate(s["mechanisms"])}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    for m in s["mechanisms"]:
        raw = summary[m]["top1"]["raw"]
        if not raw["n"]:
            continue
        y, err = raw["mean"], raw["std"] or 0.0
        int8 = file_latency(latency, m, LATENCY_SIZE, threads, "int8")
        fp32 = file_latency(latency, m, LATENCY_SIZE, threads, "float32")
        if fp32 is not None:
            left.scatter([fp32["median"]], [y], s=45, facecolors="none",
                         edgecolors=colors[m])
        if int8 is not None:
            left.errorbar([int8["median"]], [y], yerr=[err], fmt="o", capsize=4,
                          color=colors[m])
            if fp32 is not None:
                left.plot([fp32["median"], int8["median"]], [y, y], ls=":", color=colors[m])
        anchor = int8 or fp32
        if anchor is not None:
            label = f"{m} (n={raw['n']})" + ("" if int8 else ", no int8 file")
            left.annotate(label, (anchor["median"], y), fontsize=8, xytext=(4, 4),
                          textcoords="offset points", color=colors[m])
    if latency is None:
        left.text(0.5, 0.5, "latency not measured yet", transform=left.transAxes,
                  ha="center")
    left.set_xlabel(f"TFLite latency at 256x256 (ms, median, {threads} thread(s)); "
                    "filled: full int8, hollow: float32")
    left.set_ylabel(f"Fashion-MNIST test top-1 (%), trained at {s['image_size']}x"
                    f"{s['image_size']}\nmean over seeds, error bar = 1 std")
    left.grid(True, alpha=0.3)
    labelled = set()
    for r in table["records"]:
        steps = [h["step"] for h in r.get("history", [])]
        losses = [h["loss"] for h in r.get("history", [])]
        if steps:
            m = r["mechanism"]
            right.plot(steps, losses, marker=".", lw=1, alpha=0.8, color=colors.get(m),
                       label=None if m in labelled else m)
            labelled.add(m)
    right.set_xlabel("optimizer step")
    right.set_ylabel("training loss (label smoothing 0.1), one line per seed")
    right.grid(True, alpha=0.3)
    if labelled:
        right.legend()
    machine = latency["machine"] if latency else ""
    fig.suptitle(f"MobileViTV2-0.5, one recipe, {len(s['mechanisms'])} attentions, seeds "
                 f"{', '.join(map(str, s['seeds']))}; {machine}", fontsize=8)
    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def earlier_latency(out: str) -> dict[str, Any] | None:
    """The latency section of the table in `out` written by an earlier run, if any."""
    path = os.path.join(out, "attention_table.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        table = json.load(f)
    return table.get("latency") if table.get("format") == FORMAT else None


def write_report(table: dict[str, Any], out: str) -> str:
    from keras_mvit2.utils.files import write_json, write_text

    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, "attention_table.json"), table)
    text = markdown(table)
    write_text(os.path.join(out, "attention_table.md"), text)
    plot(table, os.path.join(out, "attention_table.png"))
    return text


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)

    from keras_mvit2.layers import attention_registry

    mechanisms = [attention_registry.canonical_name(m) for m in args.mechanisms]
    if args.phase in ("both", "train"):
        train_phase(mechanisms, args)
    records = load_records(mechanisms, args)
    if args.phase in ("both", "latency"):
        with tempfile.TemporaryDirectory(prefix="attention_table_") as folder:
            latency = latency_phase(mechanisms, records, args, folder)
    else:
        latency = earlier_latency(args.out)
    print(write_report(build_table(mechanisms, records, latency, args), args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
