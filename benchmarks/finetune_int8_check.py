"""A `mvit2 finetune` run's int8 files on a larger labelled test set than its held-out split.

    python benchmarks/finetune_int8_check.py RUN [--test-images 1000] [--work DIR]
        [--out benchmarks/results]

`mvit2 finetune` judges its int8 file (and whether its quantization-aware-trained file
replaces it) on the run's held-out images: 10 % of each class, 100 images for the 1,000
photos of `benchmarks/finetune_photos.py`, where one image is one top-1 point. This
benchmark runs the same files on `--test-images` Fashion-MNIST *test* images (written as PNG
files in class folders named as the run's classes, read back with the run's evaluation
transform, as the photos are): the Keras model (`RUN/model_ema.keras`) and every `.tflite`
in `RUN/phone/` (the shipped `model_int8.tflite`, and `model_int8_post_training.tflite`
where the run shipped its quantization-aware-trained file) and the trained file it did not
ship (`RUN/eval/model_qat_int8_not_shipped.tflite`), each in LiteRT. Reports top-1,
the drop against Keras in points, argmax agreement (also on the half of the images where
Keras' top-1 margin is largest: how much of the disagreement is low-margin images), and the
95 % interval (at most) of a top-1 difference measured on the run's own held-out images
(normal approximation of the paired disagreements), in `finetune_int8_check.json` / `.md`
under `--out`, one entry per run folder name. Each entry also keeps what the run itself
measured (``held_out``): the shipped file's top-1 and agreement with Keras on the held-out
images, and its quantization-aware training's choice (``qat``, from the run record:
`shipped` ``"qat"`` or ``"post_training"``, the judge images, `agreement_post_training` and
`agreement_qat` there, the paired test's `p_value`; null where it was not tried), and what
the test images say of that choice (``qat_on_test``: the post-training, the trained and the
shipped file's agreement with Keras, the trained file's gain over the post-training file in
points, and whether the shipped file agrees less often than the post-training file),
tabled under the files beside the judged gain.
"""

from __future__ import annotations

import argparse
import json
import math
import os

import numpy as np
from finetune_photos import (  # the benchmark's photos, here of the test split
    qat_cell,
    qat_facts,
    write_photos,
)

HERE = os.path.dirname(os.path.abspath(__file__))


def held_out_interval(agreement: float, held_out: int) -> float:
    """Half-width, in points, of the 95 % interval of a paired top-1 difference measured on
    `held_out` images when the two models disagree on a `1 - agreement` share of them (an
    upper bound: the variance of a paired difference is at most the disagreeing share)."""
    return 100 * 1.96 * math.sqrt((1 - agreement) / held_out)


def confident_cell(row: dict) -> str:
    """The agreement on the half of the test images with the larger Keras top-1 margin
    (blank for entries measured before it was recorded)."""
    value = row.get("agreement_confident_half")
    return "" if value is None else f"{100 * value:.1f} %"


def table(record: dict) -> list[str]:
    """The Markdown tables of `record` (`finetune_int8_check.json`: run name -> entry)."""
    lines = ["| run | file | test images | top-1 | drop (points) | agreement | agreement, "
             "margin above the median | 95 % interval on the held-out images |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for run_name, entry in record.items():
        for name, row in entry["test"].items():
            if name == "keras":
                confidence = (f" (median top-1 probability {row['median_top1_probability']:.2f}"
                              f", margin {row['median_margin']:.2f})"
                              if "median_margin" in row else "")
                lines.append(f"| {run_name} | Keras{confidence} | {entry['test_images']} | "
                             f"{100 * row['top1']:.1f} % | | | | |")
                continue
            lines.append(f"| {run_name} | {name} | {entry['test_images']} | "
                         f"{100 * row['top1']:.1f} % | {row['drop_points']:+.1f} | "
                         f"{100 * row['agreement']:.1f} % | {confident_cell(row)} | "
                         f"±{row['held_out_interval_points']:.1f} on "
                         f"{entry['held_out_images']} |")
    lines += ["", "What each run's quantization-aware training chose, on its judge images "
              "(held-out + training images set aside before training), beside what the test "
              "images say of it (agreement with Keras):", "",
              "| run | held-out images | shipped file: top-1 (Keras) | its agreement | judge "
              "images | judged: post-training / QAT | judged gain (points) | p | file shipped "
              "| test: post-training / QAT | test gain (points) | shipped below post-training "
              "on the test images |",
              "|---|---:|---:|---:|---|---|---:|---:|---|---|---:|---|"]
    for run_name, entry in record.items():
        seen = entry["held_out"]
        qat = qat_facts(seen)  # records of the earlier QAT have no agreements: blank cells
        shipped = qat_cell(qat).split(" (")[0]
        judge = (qat or {}).get("judge_images")
        judged = (f"{judge['held_out']} + {judge['set_aside']}" if judge else
                  "" if not qat else "held-out + shifted training images")
        pair = ""
        gain = ""
        if qat and qat.get("agreement_qat") is not None:
            pair = (f"{100 * qat['agreement_post_training']:.1f} / "
                    f"{100 * qat['agreement_qat']:.1f} %")
            gain = f"{100 * (qat['agreement_qat'] - qat['agreement_post_training']):+.1f}"
        p = "" if not qat or qat.get("p_value") is None else f"{qat['p_value']:.2g}"
        test = entry.get("qat_on_test") or {}
        test_pair = ("" if test.get("agreement_qat") is None else
                     f"{100 * test['agreement_post_training']:.1f} / "
                     f"{100 * test['agreement_qat']:.1f} %")
        test_gain = ("" if test.get("gain_points") is None else f"{test['gain_points']:+.1f}")
        below = test.get("shipped_below_post_training")
        shipped_top1 = seen.get("shipped_top1")
        agreement = seen.get("shipped_agreement")
        lines.append(f"| {run_name} | {entry['held_out_images']} | "
                     f"{'' if shipped_top1 is None else f'{100 * shipped_top1:.1f} %'} "
                     f"({100 * seen['keras_top1']:.1f} %) | "
                     f"{'' if agreement is None else f'{100 * agreement:.1f} %'} | {judged} | "
                     f"{pair} | {gain} | {p} | {shipped} | {test_pair} | {test_gain} | "
                     f"{'' if below is None else ('yes' if below else 'no')} |")
    return lines


def qat_on_test(rows: dict, qat: dict | None) -> dict | None:
    """What the test images (`rows`: file name -> figures) say of the run's QAT choice: the
    post-training, trained and shipped files' agreement with Keras, the trained file's gain
    (points) and whether the shipped file agrees less often than the post-training one; None
    where QAT was not tried or failed. The trained file of a run that did not ship it is
    there only for runs that kept it (the run record's `not_shipped_path`)."""
    if not qat or qat.get("shipped") is None:
        return None
    shipped = rows.get("model_int8.tflite")
    if qat["shipped"] == "qat":
        post, trained = rows.get("model_int8_post_training.tflite"), shipped
    else:
        kept = qat.get("not_shipped_path")
        post, trained = shipped, rows.get(os.path.basename(kept)) if kept else None
    if post is None or shipped is None:
        return None
    return {"agreement_post_training": post["agreement"],
            "agreement_qat": None if trained is None else trained["agreement"],
            "agreement_shipped": shipped["agreement"],
            "gain_points": (None if trained is None
                            else 100 * (trained["agreement"] - post["agreement"])),
            "shipped_below_post_training": shipped["agreement"] < post["agreement"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a `mvit2 finetune` run folder on Fashion-MNIST photos")
    parser.add_argument("--test-images", type=int, default=1000)
    parser.add_argument("--work", default="/tmp/finetune_int8_check")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args()

    import keras

    from keras_mvit2.export.calibration import load_labelled_images
    from keras_mvit2.export.tflite.run import run_tflite

    with open(os.path.join(args.run, "run.json")) as f:
        run = json.load(f)
    class_names = list(run["class_names"])
    size = int(run["recipe"]["image_size"])
    held_out = int(run["evaluation"]["num_examples"])
    folder = os.path.join(args.work, f"test_{args.test_images}")
    if not os.path.isdir(folder):
        write_photos(folder, args.test_images, split="test")
    test = load_labelled_images(folder, image_size=(size, size), shuffle=False)
    if list(test.class_names) != class_names:
        raise SystemExit(f"the run's classes {class_names} are not Fashion-MNIST's "
                         f"({list(test.class_names)})")
    model = keras.saving.load_model(os.path.join(args.run, "model_ema.keras"))
    reference = np.asarray(model.predict(test.images, batch_size=32, verbose=0))
    keras_top1 = float(np.mean(reference.argmax(1) == test.labels))
    exports = {e["target"]: e for e in run["exports"]}
    ranked = np.sort(reference, axis=1)
    margin = ranked[:, -1] - ranked[:, -2]
    confident = margin >= np.median(margin)  # the half of the images Keras is surest of
    rows = {"keras": {"top1": keras_top1,  # how confident the float model is
                      "median_top1_probability": float(np.median(ranked[:, -1])),
                      "median_margin": float(np.median(margin))}}
    phone = os.path.join(args.run, "phone")
    files = {name: os.path.join(phone, name) for name in sorted(os.listdir(phone))
             if name.endswith(".tflite")}
    kept = (qat_facts(exports.get("tflite", {})) or {}).get("not_shipped_path")
    if kept and os.path.exists(os.path.join(args.run, kept)):  # the trained file not shipped
        files[os.path.basename(kept)] = os.path.join(args.run, kept)
    for name, path in files.items():
        predicted = run_tflite(path, test.images, num_threads=2).argmax(1)
        agreement = float(np.mean(predicted == reference.argmax(1)))
        top1 = float(np.mean(predicted == test.labels))
        rows[name] = {"top1": top1, "drop_points": 100 * (keras_top1 - top1),
                      "agreement": agreement,
                      "agreement_confident_half": float(np.mean(
                          predicted[confident] == reference.argmax(1)[confident])),
                      "held_out_interval_points": held_out_interval(agreement, held_out)}
        print(name, rows[name], flush=True)
    record = {}
    path = os.path.join(args.out, "finetune_int8_check.json")
    if os.path.exists(path):
        with open(path) as f:
            record = json.load(f)
    tflite = exports.get("tflite", {})
    record[os.path.basename(os.path.normpath(args.run))] = {
        "command": f"python benchmarks/finetune_int8_check.py {args.run} "
                   f"--test-images {args.test_images}",
        "test_images": len(test.images), "held_out_images": held_out,
        "held_out": {"keras_top1": run["evaluation"]["top1"],
                     "shipped_top1": tflite.get("top1"),
                     "shipped_agreement": tflite.get("top1_agreement"),
                     "qat": qat_facts(tflite)},
        "test": rows, "qat_on_test": qat_on_test(rows, qat_facts(tflite))}
    os.makedirs(args.out, exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f, indent=2)
    lines = table(record)
    with open(os.path.join(args.out, "finetune_int8_check.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
