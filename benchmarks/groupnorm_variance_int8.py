"""The GroupNorm variance's int8 form on a `mvit2 finetune` run's model, post-training int8.

    python benchmarks/groupnorm_variance_int8.py RUN PHOTOS [--forms one_pass,one_pass_matmul]
        [--test-images 1000] [--work DIR] [--out benchmarks/results]

RUN is a run folder of `benchmarks/finetune_photos.py` (its `model_ema.keras`), PHOTOS the
photo folder it trained on. For each variance form of `keras_mvit2.layers.export_forms`
(``one_pass``: MEAN of ``x * x``, the default; ``one_pass_matmul``: ``E[x^2]`` as one
BATCH_MATMUL per sample), the model is exported as the default int8 file
(`to_tflite(quantization="int8")`, 200 of the photos for calibration) inside
``to_tflite(..., forms=ExportForms(variance=...))``
and run in LiteRT on `--test-images` Fashion-MNIST *test*
images written as PNG files in class folders: top-1, drop against Keras in points, argmax
agreement, the output's relative error, op count. Results: `groupnorm_variance_int8.json` /
`.md` under `--out`, one entry per run folder name.
"""

from __future__ import annotations

import argparse
import json
import os

from finetune_photos import file_figures, run_on_test_photos

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run")
    parser.add_argument("photos")
    parser.add_argument("--forms", default="one_pass,one_pass_matmul")
    parser.add_argument("--test-images", type=int, default=1000)
    parser.add_argument("--work", default="/tmp/groupnorm_variance_int8")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args()
    from keras_mvit2.export import to_tflite
    from keras_mvit2.export.tflite.run import run_tflite
    from keras_mvit2.layers.export_forms import ExportForms

    model, test, train, reference, keras_top1 = run_on_test_photos(
        args.run, args.photos, args.test_images, args.work)

    results_path = os.path.join(args.out, "groupnorm_variance_int8.json")
    results = json.load(open(results_path)) if os.path.exists(results_path) else {}
    entry = results.setdefault(os.path.basename(os.path.normpath(args.run)), {})
    entry["keras_top1"] = keras_top1
    for form in args.forms.split(","):
        path = os.path.join(args.work, f"{form}.tflite")
        report = to_tflite(model, path, quantization="int8",
                           representative_data=train.images[:200],
                           forms=ExportForms(variance=form))
        out = run_tflite(path, test.images)
        entry[form] = {
            **file_figures(out, reference, test.labels, keras_top1),
            "ops": sum(report.op_histogram.values()),
            "batch_matmul_ops": report.op_histogram.get("BATCH_MATMUL", 0),
        }
        print(form, entry[form], flush=True)
        os.makedirs(args.out, exist_ok=True)
        with open(results_path, "w") as f:
            json.dump(results, f, indent=2)
    lines = ["| run (Keras top-1) | variance form | int8 top-1 | drop | agreement | output error |",
             "|---|---|---:|---:|---:|---:|"]
    for run, figures in results.items():
        for form, r in figures.items():
            if form == "keras_top1":
                continue
            lines.append(f"| {run} ({100 * figures['keras_top1']:.1f} %) | {form} | "
                         f"{100 * r['top1']:.1f} % | {r['drop_points']:+.1f} | "
                         f"{100 * r['agreement']:.1f} % | {r['output_relative_error']:.3f} |")
    with open(os.path.join(args.out, "groupnorm_variance_int8.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
