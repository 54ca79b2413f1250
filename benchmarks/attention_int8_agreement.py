"""How closely each attention's full-int8 file follows its trained Keras model: the files
`to_tflite` writes (with the float ops the attention declares, and integer-only where that
differs), on Fashion-MNIST test images none of them trained or calibrated on.

    python benchmarks/attention_int8_agreement.py [--attentions separable mha ...]
        [--size 64] [--train-images 30000] [--epochs 1] [--test-images 5000]
        [--seed 0] [--run-dir runs/attention_int8_agreement] [--out benchmarks/results]

For each attention, MobileViTV2-0.5 with it in every transformer layer is trained from
scratch at `--size` on the first `--train-images` Fashion-MNIST training images (one recipe,
`int8_fidelity.train`: AdamW, warm-up + cosine, label smoothing; nothing tuned per
attention) and saved in `--run-dir` (a second call loads it, so another checkout of the code
can convert the same trained models). Its files, calibrated on the 200 training images that
follow the trained ones:

- `int8`: `to_tflite(quantization="int8", io_dtype="int8")` with `allow_float_ops` where the
  attention declares float ops (`int8_float_ops`: RFA's SIN / COS, MHA's and Linformer's
  SOFTMAX islands), as `benchmarks/int8_speed.py` times it;
- `int8 integer-only`: the same without `allow_float_ops`, for the attentions that declare
  float ops (a conversion that refuses is recorded with its reason).

Each file runs in LiteRT on the first `--test-images` test images. Reported: Keras top-1,
each file's top-1, its agreement with Keras (same top class; 95 % Wilson interval) and the
relative logit error; between the two int8 files, the images where only one agrees with Keras
and the exact two-sided McNemar p (`scipy.stats.binomtest` on those discordant images).

Writes `attention_int8_agreement.json` and `.md` to `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

MECHANISMS = ("separable", "mha", "linformer", "rfa", "mobile_attention")
CALIBRATION_IMAGES = 200
FILES = ("int8", "int8 integer-only")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--attentions", nargs="+", default=list(MECHANISMS), choices=MECHANISMS)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--train-images", type=int, default=30_000)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--test-images", type=int, default=5_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-dir", default="runs/attention_int8_agreement")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    return p.parse_args(argv)


def build(attention: str, size: int):
    import keras_mvit2 as mv

    return mv.MobileViTV2(0.5, input_shape=(size, size, 3), classes=10,
                          classifier_activation=None, attention=attention)


def train(attention: str, args: argparse.Namespace):
    """The trained model of `attention` (`int8_fidelity.train`'s recipe), loaded if saved."""
    import int8_fidelity

    int8_fidelity.build = lambda arch, size: build(arch, size)  # the recipe, our network
    path = os.path.join(args.run_dir, f"{attention}_{args.size}_seed{args.seed}.keras")
    return int8_fidelity.train(attention, args.size, args.seed,
                               train_images=args.train_images, epochs=args.epochs, path=path)


def wilson(successes: int, n: int) -> tuple[float, float]:
    """The 95 % Wilson score interval of a proportion (`scipy.stats.binomtest`)."""
    from scipy.stats import binomtest

    interval = binomtest(successes, n).proportion_ci(0.95, method="wilson")
    return float(interval.low), float(interval.high)


def convert(model, path: str, calibration, allow_float_ops: bool) -> dict[str, Any]:
    from keras_mvit2.export import to_tflite

    try:
        report = to_tflite(model, path, quantization="int8", representative_data=calibration,
                           num_calibration_samples=len(calibration), io_dtype="int8",
                           allow_float_ops=allow_float_ops)
    except (ValueError, RuntimeError) as error:
        return {"error": f"{type(error).__name__}: {error}"}
    return {"float_ops": dict(report.float_ops)}


def evaluate(attention: str, args: argparse.Namespace, folder: str) -> dict[str, Any]:
    import int8_fidelity
    import keras

    from keras_mvit2.export.tflite.run import run_tflite
    from keras_mvit2.layers import attention_registry

    model = train(attention, args)
    calibration = keras.ops.convert_to_numpy(int8_fidelity.as_model_input(
        int8_fidelity.fashion_mnist("train", CALIBRATION_IMAGES, args.train_images)[0],
        args.size))
    images, labels = int8_fidelity.fashion_mnist("test", args.test_images)
    x = keras.ops.convert_to_numpy(int8_fidelity.as_model_input(images, args.size))
    reference = np.concatenate([keras.ops.convert_to_numpy(model(x[i:i + 250], training=False))
                                for i in range(0, len(x), 250)])
    ref = reference.argmax(1)
    row: dict[str, Any] = {"attention": attention,
                           "keras_top1": float(np.mean(ref == labels)), "files": {}}
    declares = bool(attention_registry.int8_float_ops(attention))
    agrees = {}
    for name in FILES:
        if name == "int8 integer-only" and not declares:
            continue
        path = os.path.join(folder, f"{attention}_{name.replace(' ', '_')}.tflite")
        facts = convert(model, path, calibration, allow_float_ops=(name == "int8" and declares))
        if "error" not in facts:
            out = run_tflite(path, x)
            pred = out.argmax(1)
            agrees[name] = pred == ref
            facts.update({
                "top1": float(np.mean(pred == labels)),
                "agreement": float(np.mean(agrees[name])),
                "agreement_interval": wilson(int(agrees[name].sum()), len(ref)),
                "logit_rel_error": float(np.sqrt(((out - reference) ** 2).mean()
                                                 / (reference ** 2).mean()))})
        row["files"][name] = facts
        print(f"{attention} {name}: {facts}", flush=True)
    if len(agrees) == 2:
        row["paired"] = paired(agrees)
    return row


def paired(agrees: dict[str, np.ndarray]) -> dict[str, Any]:
    """The two files' per-image agreement with Keras (`FILES` -> booleans): the images where
    only one agrees, and the exact two-sided McNemar p (a binomial test on those)."""
    from scipy.stats import binomtest

    only = {name: int(np.sum(agrees[name] & ~agrees[other]))
            for name, other in zip(FILES, FILES[::-1], strict=True)}
    discordant = sum(only.values())
    return {"only_agrees": only, "p_value": float(
        binomtest(only[FILES[0]], discordant, 0.5).pvalue) if discordant else 1.0}


def _code() -> str:
    """The commit of the code that ran, and whether the checkout had uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=HERE, text=True, capture_output=True,
                              check=True).stdout.strip()

    try:
        changed = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "--short", "HEAD") + (" with uncommitted changes" if changed
                                                      else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines = [
        "# Full int8 against Keras, every attention, on unseen images", "",
        f"`python benchmarks/attention_int8_agreement.py`: MobileViTV2-0.5 with each attention, "
        f"trained from scratch at {s['size']}x{s['size']} on the first {s['train_images']} "
        f"Fashion-MNIST training images ({s['epochs']} epoch(s), seed {s['seed']}, one recipe); "
        f"full-int8 files (int8 I/O) calibrated on the next {CALIBRATION_IMAGES}; measured on "
        f"the first {s['test_images']} test images. Agreement: the file's top class is Keras' "
        "(95 % Wilson interval). `int8`: with the float ops the attention declares; "
        "`int8 integer-only`: without them. Code " + result["code"] + ".", "",
        "| attention | file | float ops | Keras top-1 | int8 top-1 | agreement | "
        "logit rel. error |",
        "|---|---|---|---:|---:|---|---:|"]
    for row in result["rows"]:
        for name, f in row["files"].items():
            if "error" in f:
                lines.append(f"| {row['attention']} | {name} | | | | does not convert: "
                             f"{f['error'][:120]} | |")
                continue
            ops = ", ".join(f"{k} {v}" for k, v in sorted(f["float_ops"].items())) or "none"
            low, high = f["agreement_interval"]
            lines.append(
                f"| {row['attention']} | {name} | {ops} | {100 * row['keras_top1']:.1f} % | "
                f"{100 * f['top1']:.1f} % | {100 * f['agreement']:.1f} % "
                f"[{100 * low:.1f}, {100 * high:.1f}] | {f['logit_rel_error']:.3f} |")
    paired = [r for r in result["rows"] if "paired" in r]
    if paired:
        lines += ["", "The two int8 files of one model, image by image (exact two-sided "
                  "McNemar test on the images where only one agrees with Keras):", "",
                  "| attention | only `int8` agrees | only integer-only agrees | p |",
                  "|---|---:|---:|---:|"]
        for r in paired:
            only = r["paired"]["only_agrees"]
            lines.append(f"| {r['attention']} | {only[FILES[0]]} | {only[FILES[1]]} | "
                         f"{r['paired']['p_value']:.2f} |")
    lines += ["", f"Host: {result['cpu']}; {result['timestamp']}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import tempfile

    args = parse_args(argv)
    from keras_mvit2.latency.host_info import cpu_features

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for attention in args.attentions:
            rows.append(evaluate(attention, args, folder))
    result = {"command": "python benchmarks/attention_int8_agreement.py " + " ".join(
                  sys.argv[1:] if argv is None else argv),
              "settings": {k: getattr(args, k) for k in ("size", "train_images", "epochs",
                                                         "test_images", "seed")},
              "code": _code(), "cpu": cpu_features().get("model") or platform.processor(),
              "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, "attention_int8_agreement")
    for suffix, text in ((".json", json.dumps(result, indent=1)), (".md", markdown(result))):
        tmp = base + suffix + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, base + suffix)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
