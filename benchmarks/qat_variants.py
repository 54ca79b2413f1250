"""Quantization-aware training settings on a `mvit2 finetune` run's model, one file each.

    python benchmarks/qat_variants.py RUN PHOTOS [--variants default,no_function_quant,...]
        [--test-images 1000] [--work DIR] [--out benchmarks/results]

RUN is a run folder of `benchmarks/finetune_photos.py` (its `model_ema.keras`), PHOTOS the
photo folder it trained on. Each variant runs `keras_mvit2.quantize.qat` on 900 of the
photos (distilled towards the model's probabilities, batch 8, 200 calibration images, as
`mvit2 finetune`'s `qat_int8` candidate) with one setting changed, and measures the file in
LiteRT on `--test-images` Fashion-MNIST *test* images written as PNG files in the run's class
folders (as `benchmarks/finetune_int8_check.py` does): top-1, drop against Keras in points,
argmax agreement, the output's relative error, and the QAT model's own agreement with the
float model on its training batches after each pass (dropout on: a lower bound). The
training is seeded: the same variant gives the same file.

Variants: ``default`` (3 passes at Adam 1e-4, function outputs fake-quantized),
``no_function_quant`` (`fake_quantize_functions=False`), ``epochs6``, ``lr3e-4``.
Results go to `qat_variants.json` / `.md` under `--out`, one entry per run folder name.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from finetune_photos import file_figures, run_on_test_photos

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = {
    "default": {},
    "no_function_quant": {"fake_quantize_functions": False},
    "epochs6": {"epochs": 6},
    "lr3e-4": {"learning_rate": 3e-4},
}
TRAIN_IMAGES = 900


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run")
    parser.add_argument("photos")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--test-images", type=int, default=1000)
    parser.add_argument("--work", default="/tmp/qat_variants")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args()
    from keras_mvit2.export.tflite.run import run_tflite
    from keras_mvit2.quantize.qat import qat

    names = args.variants.split(",")
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    model, test, train, reference, keras_top1 = run_on_test_photos(
        args.run, args.photos, args.test_images, args.work)
    x, y = train.images[:TRAIN_IMAGES], train.labels[:TRAIN_IMAGES]

    results_path = os.path.join(args.out, "qat_variants.json")
    results = json.load(open(results_path)) if os.path.exists(results_path) else {}
    entry = results.setdefault(os.path.basename(os.path.normpath(args.run)), {})
    entry["keras_top1"] = keras_top1
    for name in names:
        settings = {"epochs": 3, "learning_rate": 1e-4, **VARIANTS[name]}
        path = os.path.join(args.work, f"{name}.tflite")
        start = time.monotonic()
        result = qat(model, (x, y), distill=True, output_path=path, representative_data=x[:200],
                     io_dtype="float32", batch_size=8, num_calibration_samples=200,
                     verbose=False, **settings)
        out = run_tflite(path, test.images)
        entry[name] = {
            "settings": settings, **file_figures(out, reference, test.labels, keras_top1),
            "train_agreement_per_pass": [round(h["accuracy"], 3) for h in result.history],
            "seconds": round(time.monotonic() - start),
        }
        print(name, entry[name], flush=True)
        os.makedirs(args.out, exist_ok=True)
        with open(results_path, "w") as f:
            json.dump(results, f, indent=2)
    lines = ["| run (Keras top-1) | variant | top-1 | drop | agreement | output error | "
             "agreement on its training batches, per pass |", "|---|---|---:|---:|---:|---:|---|"]
    for run, figures in results.items():
        for name, r in figures.items():
            if name == "keras_top1":
                continue
            lines.append(f"| {run} ({100 * figures['keras_top1']:.1f} %) | {name} | "
                         f"{100 * r['top1']:.1f} % | {r['drop_points']:+.1f} | "
                         f"{100 * r['agreement']:.1f} % | {r['output_relative_error']:.3f} | "
                         f"{', '.join(f'{a:.2f}' for a in r['train_agreement_per_pass'])} |")
    with open(os.path.join(args.out, "qat_variants.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
