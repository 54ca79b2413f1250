"""Quantization-aware training settings on a `mvit2 finetune` run's model, one file each.

    python benchmarks/qat_variants.py RUN PHOTOS [--variants default,lr0,...]
        [--train-images 900] [--test-images 1000] [--work DIR] [--out benchmarks/results]

RUN is a run folder of `benchmarks/finetune_photos.py` (its `model_ema.keras`), PHOTOS the
photo folder it trained on. Each variant runs `keras_mvit2.quantize.qat` (the post-training
int8 file's own graph trained with its rounding towards the float graph's answers, then
converted again) on `--train-images` of the photos (900), of which it sets a quarter aside
before training and
judges the two files on those and on the other photos (as `mvit2 finetune`'s held-out
images), at the `qat_int8` candidate's settings (`keras_mvit2.optimizer.qat_settings`: 3
passes, Adam 1e-6, batch 8; 200 calibration images) with one setting changed. It measures
the quantization-aware-trained file (`qat_path`, whichever `qat` shipped) and the
post-training file in LiteRT on `--test-images` Fashion-MNIST *test* images written as PNG
files in the run's class folders (as `benchmarks/finetune_int8_check.py` does): top-1, drop
against Keras in points, argmax agreement, the output's relative error and the trained
file's gain in agreement over the post-training file; and records `qat`'s own choice
(`shipped`, the post-training and the QAT file's agreement with Keras on the judge images,
the exact paired test's p) and the mean distillation loss of each pass. The training is
seeded: the same variant gives the same file. Entries of earlier runs of the benchmark (the
TFMOT QAT, its variants ``no_function_quant`` ...) stay in the results, tabled with their
agreement on their training batches per pass.

Variants: ``default`` (the candidate's settings), ``lr0`` (learning rate 0: the
post-training file itself, the baseline of the others), ``epochs1`` and ``epochs6`` (1 and 6
passes), ``lr3e-5`` and ``lr3e-4`` (Adam's learning rate), ``batch32`` (32 images a step,
a quarter of the steps).
Results go to `qat_variants.json` / `.md` under `--out`, one entry per run folder name.
"""

from __future__ import annotations

import argparse
import json
import os
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = {
    "default": {},
    "lr0": {"learning_rate": 0.0},
    "epochs1": {"epochs": 1},
    "epochs6": {"epochs": 6},
    "lr3e-5": {"learning_rate": 3e-5},
    "lr3e-4": {"learning_rate": 3e-4},
    "batch32": {"batch_size": 32},
}
TRAIN_IMAGES = 900
CALIBRATION_IMAGES = 200


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a run folder of benchmarks/finetune_photos.py")
    parser.add_argument("photos", help="the photo folder it trained on")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, of {', '.join(VARIANTS)} (default: all)")
    parser.add_argument("--train-images", type=int, default=TRAIN_IMAGES,
                        help="photos QAT may train on (a quarter set aside); the rest are "
                             "held out")
    parser.add_argument("--test-images", type=int, default=1000)
    parser.add_argument("--work", default="/tmp/qat_variants")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    args.variants = args.variants.split(",")
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    return args


def table(results: dict) -> list[str]:
    """The Markdown table of `results` (entries of earlier runs of the benchmark, made with
    the earlier TFMOT QAT, have no choice: blank cells)."""
    lines = ["| run (Keras top-1) | variant | top-1 | drop | agreement | output error | "
             "test gain over post-training (points) | "
             "shipped (agreement post-training / QAT on the judge images, p) | "
             "per pass |", "|---|---|---:|---:|---:|---:|---:|---|---|"]
    for run, figures in results.items():
        for name, r in figures.items():
            if name == "keras_top1":
                continue
            choice = r.get("choice")
            p = "" if not choice or choice.get("p_value") is None else (
                f", p = {choice['p_value']:.2g}")
            shipped = (f"{r['shipped']} ({100 * choice['agreement_a']:.1f} % / "
                       f"{100 * choice['agreement_b']:.1f} %{p})" if choice else "")
            gain = "" if r.get("test_gain_points") is None else f"{r['test_gain_points']:+.1f}"
            if "loss_per_pass" in r:
                per_pass = "distillation loss " + ", ".join(
                    f"{v:.4f}" for v in r["loss_per_pass"])
            else:  # the earlier QAT: its agreement with the float model on its batches
                per_pass = ", ".join(f"{v:.2f}" for v in r.get("train_agreement_per_pass", []))
                per_pass = f"agreement on its training batches {per_pass}" if per_pass else ""
            lines.append(f"| {run} ({100 * figures['keras_top1']:.1f} %) | {name} | "
                         f"{100 * r['top1']:.1f} % | {r['drop_points']:+.1f} | "
                         f"{100 * r['agreement']:.1f} % | {r['output_relative_error']:.3f} | "
                         f"{gain} | {shipped} | {per_pass} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from finetune_photos import file_figures, run_on_test_photos

    from keras_mvit2.export.tflite.run import run_tflite
    from keras_mvit2.optimizer.qat_settings import (
        QAT_BATCH_SIZE,
        QAT_EPOCHS,
        QAT_LEARNING_RATE,
    )
    from keras_mvit2.quantize.qat import qat

    model, test, train, reference, keras_top1 = run_on_test_photos(
        args.run, args.photos, args.test_images, args.work)
    count = args.train_images
    x, y = train.images[:count], train.labels[:count]
    held_out = (train.images[count:], train.labels[count:])
    if not len(held_out[0]):
        raise SystemExit(f"{args.photos} has {len(train.images)} photos: the choice needs "
                         f"more than the {count} QAT may train on (--train-images)")

    results_path = os.path.join(args.out, "qat_variants.json")
    results = json.load(open(results_path)) if os.path.exists(results_path) else {}
    entry = results.setdefault(os.path.basename(os.path.normpath(args.run)), {})
    entry["keras_top1"] = keras_top1
    for name in args.variants:
        settings = {"epochs": QAT_EPOCHS, "learning_rate": QAT_LEARNING_RATE,
                    "batch_size": QAT_BATCH_SIZE, **VARIANTS[name]}
        trained_path = os.path.join(args.work, f"{name}_qat.tflite")
        post_path = os.path.join(args.work, f"{name}_post_training.tflite")
        start = time.monotonic()
        calibration = x[:CALIBRATION_IMAGES]
        result = qat(model, (x, y), output_path=os.path.join(args.work, f"{name}.tflite"),
                     qat_path=trained_path, post_training_path=post_path,
                     representative_data=calibration,
                     num_calibration_samples=len(calibration), io_dtype="float32",
                     validation_data=held_out, verbose=False, **settings)
        figures = file_figures(run_tflite(trained_path, test.images), reference, test.labels,
                               keras_top1)
        post = file_figures(run_tflite(post_path, test.images), reference, test.labels,
                            keras_top1)
        entry[name] = {
            "settings": settings, **figures,
            "test_gain_points": 100 * (figures["agreement"] - post["agreement"]),
            "post_training": post, "shipped": result.shipped, "reason": result.reason,
            "judged_on": result.judged_on, "judge_images": result.split.to_dict(),
            "choice": result.choice.to_dict(),
            "loss_per_pass": [round(h["loss"], 6) for h in result.history],
            "train_seconds": round(result.train_seconds),
            "seconds": round(time.monotonic() - start),
        }
        print(name, entry[name], flush=True)
        os.makedirs(args.out, exist_ok=True)
        with open(results_path, "w") as f:
            json.dump(results, f, indent=2)
    lines = table(results)
    with open(os.path.join(args.out, "qat_variants.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
