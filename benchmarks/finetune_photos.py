"""`mvit2 finetune` on a folder of photos, timed: the whole command, as a user runs it.

    python benchmarks/finetune_photos.py [--images 1000] [--epochs N] [--max-drop P]
        [--reexport] [--only standin|random] [--tag TAG] [--work /tmp/finetune_photos]
        [--out benchmarks/results]

Writes `--images` Fashion-MNIST training images (the first of each class, 10 classes) to
disk as PNG files in class folders, then runs, each in a fresh process and timed,

    mvit2 finetune PHOTOS --model mobilevitv2_050 --weights imagenet -o RUN   # stand-in hub
    mvit2 finetune PHOTOS --model mobilevitv2_050 --weights none -o RUN       # random init

at the default settings (the packaged `finetune_small_data` recipe at the checkpoint's
256x256; `--epochs` shortens the run). `--weights imagenet` is
downloaded from the loopback stand-in of the Hugging Face hub of the tests
(tests/hub_standin.py), which serves a timm checkpoint with random weights made by
tests/torch_oracle.py (torch, in a subprocess): it exercises the download, port and
fine-tuning path, but these are not the real ImageNet weights, so its accuracy says nothing
about them. Records wall time, top-1 on the held-out images, the shipped `.tflite` file's
kind, top-1 and agreement with Keras, whether the run's quantization-aware training was
tried and which file it shipped (``qat``: `shipped` ``"qat"`` or ``"post_training"``, the
judge images (held-out + training images set aside before training, `judge_images`,
`judged_on`), the two files' agreement with Keras there, the exact paired test's `p_value`
and why, `reason` / `guard`), sizes and the load average, in `finetune_photos.json` / `.md`
(what the two files do on 1,000 unseen test images: `finetune_int8_check.py RUN`); each
run is kept there under its name (`standin`, `random`, `standin_max_drop_1`, ...), so runs
made one at a time add up. With `--max-drop`
the command runs again on a copy of the trained run folder (run it without `--max-drop`
first): the folder is complete, so it only evaluates and exports, and its wall time is that
of re-exporting without retraining.
`--reexport` does the same at the default settings (runs `standin_reexport`, ...): the
phone files of the trained models made again by the current export code.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TESTS = os.path.join(ROOT, "tests")
MODEL = "mobilevitv2_050"
REPO = f"timm/{MODEL}.cvnets_in1k"


def write_photos(folder: str, count: int, split: str = "train") -> dict[str, int]:
    """The first `count // 10` images of each Fashion-MNIST class of `split`, as RGB PNGs
    in class folders (``/`` in a class name written ``-``)."""
    import numpy as np
    from PIL import Image

    from keras_mvit2.data.files import FASHION_MNIST_CLASSES, load_fashion_mnist_arrays

    x, y = load_fashion_mnist_arrays(split)
    per_class = count // len(FASHION_MNIST_CLASSES)
    written: dict[str, int] = {}
    for label, name in enumerate(FASHION_MNIST_CLASSES):
        safe = name.replace("/", "-")
        os.makedirs(os.path.join(folder, safe), exist_ok=True)
        for i, index in enumerate(np.flatnonzero(y == label)[:per_class]):
            Image.fromarray(x[index]).convert("RGB").save(
                os.path.join(folder, safe, f"{i:05d}.png"))
        written[safe] = per_class
    return written


def run_on_test_photos(run: str, photos: str, test_images: int, work: str):
    """A run folder's Keras model (`model_ema.keras`) on `test_images` Fashion-MNIST *test*
    images written as photos under `work` (read back as the run reads its photos), and its
    training `photos` read the same way.

    Returns `(model, test, train, reference, keras_top1)`: `test` / `train` are
    `load_labelled_images` results (the photos shuffled, seed 0), `reference` the model's
    outputs on the test images and `keras_top1` its top-1 there.
    """
    import keras
    import numpy as np

    from keras_mvit2.export.calibration import load_labelled_images

    folder = os.path.join(work, f"test_{test_images}")
    if not os.path.isdir(folder):
        write_photos(folder, test_images, split="test")
    with open(os.path.join(run, "run.json")) as f:
        size = int(json.load(f)["recipe"]["image_size"])
    model = keras.saving.load_model(os.path.join(run, "model_ema.keras"))
    test = load_labelled_images(folder, image_size=(size, size), shuffle=False)
    train = load_labelled_images(photos, image_size=(size, size), shuffle=True, seed=0)
    reference = np.asarray(model.predict(test.images, batch_size=32, verbose=0))
    return model, test, train, reference, float(np.mean(reference.argmax(1) == test.labels))


def file_figures(out, reference, labels, keras_top1: float) -> dict:
    """An exported file's outputs `out` against Keras' `reference` on images with `labels`:
    top-1, drop in points, argmax agreement and the output's relative error."""
    import numpy as np

    top1 = float(np.mean(out.argmax(1) == labels))
    return {"top1": top1, "drop_points": round(100 * (keras_top1 - top1), 1),
            "agreement": float(np.mean(out.argmax(1) == reference.argmax(1))),
            "output_relative_error": float(np.sqrt(((out - reference) ** 2).mean()
                                                   / (reference ** 2).mean()))}


def standin_checkpoint(work: str) -> bytes:
    """A timm `model.safetensors` of MODEL with random weights (tests/torch_oracle.py)."""
    subprocess.run([sys.executable, os.path.join(TESTS, "torch_oracle.py"), "--out-dir", work,
                    "--models", MODEL, "--sizes", "32x32", "--block-sizes", "8x8",
                    "--batch", "1"], check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(work, f"{MODEL}.safetensors"), "rb") as f:
        return f.read()


def run_command(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Runs `mvit2 ARGS` in a fresh process; returns (wall seconds, mean load average)."""
    start = time.monotonic()
    load0 = os.getloadavg()[0]
    code = subprocess.call([sys.executable, "-c", "from keras_mvit2.cli import main; "
                            "raise SystemExit(main())", *args], env=env)
    if code:
        raise SystemExit(f"mvit2 {' '.join(args)} failed with status {code}")
    return time.monotonic() - start, (load0 + os.getloadavg()[0]) / 2


def qat_facts(export: dict) -> dict | None:
    """What the run's quantization-aware training of its int8 file did, from the export
    record's ``qat`` facts (`keras_mvit2.ship.phone_files`): `shipped` (``"qat"`` or
    ``"post_training"``; None where it failed: `error`), the judge images (`num_judged`,
    `judge_images`, `judged_on`), the post-training and the QAT file's agreement with Keras
    there, the paired test's `p_value`, `reason` / `guard`, and where a trained file that was
    not shipped is kept (`not_shipped_path`). None where it was not tried (the post-training
    file agreed well enough). Records made before the judge images were set aside lack the
    judge sizes and p (None)."""
    facts = export.get("qat")
    if not facts or all(value is None for value in facts.values()):
        return None
    shipped = facts.get("shipped")
    if isinstance(shipped, bool):  # runs of the earlier QAT recorded a bool
        shipped = "qat" if shipped else "post_training"
    return {"shipped": None if facts.get("error") else shipped,
            **{key: facts.get(key) for key in (
                "agreement_post_training", "agreement_qat", "num_judged", "judge_images",
                "judged_on", "p_value", "reason", "guard", "not_shipped_path", "error")}}


def qat_cell(qat: dict | None) -> str:
    """A table cell of `qat_facts`: the file shipped, and where judged on the images set
    aside, both agreements there and p."""
    if not qat:
        return "not tried"
    if qat.get("error"):
        return "failed"
    details = ""
    if qat.get("agreement_qat") is not None:
        details = (f" ({100 * qat['agreement_post_training']:.1f} % / "
                   f"{100 * qat['agreement_qat']:.1f} %")
        details += (")" if qat.get("p_value") is None else
                    f" on {qat['num_judged']}, p = {qat['p_value']:.2g})")
    return f"{qat['shipped'] or '?'}{details}"


def figures(run_dir: str) -> dict:
    """The run's figures, from its run.json."""
    from keras_mvit2.ship.phone_files import export_warnings  # the command's own rule

    with open(os.path.join(run_dir, "run.json")) as f:
        run = json.load(f)
    exports = {r["target"]: r for r in run["exports"]}
    tflite, coreml = exports["tflite"], exports.get("coreml") or {}
    return {
        "top1": run["evaluation"]["top1"], "top5": run["evaluation"]["top5"],
        "held_out_images": run["evaluation"]["num_examples"],
        "tflite_quantization": tflite["quantization"], "tflite_top1": tflite["top1"],
        "tflite_agreement": tflite["top1_agreement"], "tflite_size_bytes": tflite["size_bytes"],
        "qat": qat_facts(tflite),
        "tflite_latency_ms": (tflite.get("latency") or {}).get("median_ms"),
        "coreml_quantization": coreml.get("quantization"),
        "coreml_size_bytes": coreml.get("size_bytes"),
        "warnings": export_warnings(run["exports"]),
        "epochs": run["recipe"]["epochs"], "image_size": run["recipe"]["image_size"],
        "images_per_second": run["recipe"]["images_per_second"],
        "weights": {k: run["weights"].get(k) for k in ("kind", "value", "repo_id", "sha256")},
    }


def table(results: dict) -> list[str]:
    """The Markdown table of `results` (runs recorded before the QAT choice was: a blank
    QAT cell)."""
    lines = ["| run | epochs | wall time | top-1 (Keras) | .tflite | its top-1 | agreement | "
             "QAT: file shipped (agreement post-training / QAT on the judge images, p) | "
             "size |",
             "|---|---:|---:|---:|---|---:|---:|---|---:|"]
    for name, r in results["runs"].items():
        qat = qat_cell(r["qat"]) if "qat" in r else ""
        lines.append(f"| {name} | {r['epochs']} | {r['wall_s'] / 60:.1f} min | "
                     f"{100 * r['top1']:.1f} % | {r['tflite_quantization']} | "
                     f"{100 * r['tflite_top1']:.1f} % | {100 * r['tflite_agreement']:.1f} % | "
                     f"{qat} | {r['tflite_size_bytes'] / 1e6:.2f} MB |")
    return lines + ["", "Agreement: the shipped file's top-1 agreement with Keras on the "
                    "held-out images; QAT's two are on the images it judged the two files on "
                    "(the held-out images and training images set aside before training: "
                    "`judged_on` in the JSON; runs recorded before the images were set aside "
                    "judged on the held-out and the shifted training images, without p)."]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--epochs", type=int, help="default: the recipe's (30)")
    parser.add_argument("--work", default="/tmp/finetune_photos")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--only", choices=("standin", "random"),
                        help="run one of the two commands")
    parser.add_argument("--max-drop", type=float,
                        help="pass --max-drop to the commands (the optimizer's files)")
    parser.add_argument("--tag", help="append _TAG to the run names (e.g. a date: runs of "
                        "another day kept beside these)")
    parser.add_argument("--reexport", action="store_true",
                        help="run the commands again on copies of the trained run folders: "
                             "the current export code's phone files, no retraining")
    args = parser.parse_args()
    sys.path.insert(0, TESTS)
    from hub_standin import HubStandIn

    photos = os.path.join(args.work, "photos")
    if not os.path.isdir(photos):
        write_photos(photos, args.images)
    server = HubStandIn()
    server.serve(REPO, "model.safetensors", standin_checkpoint(args.work))
    env = {**os.environ, "HF_ENDPOINT": server.url, "HF_HOME": os.path.join(args.work, "hf"),
           "HF_HUB_DISABLE_PROGRESS_BARS": "1", "PYTHONPATH": ROOT}
    env.pop("HF_HUB_OFFLINE", None)
    extra = [] if args.epochs is None else ["--epochs", str(args.epochs)]
    suffix = ""
    if args.max_drop is not None:
        extra += ["--max-drop", f"{args.max_drop:g}"]
        suffix = f"_max_drop_{args.max_drop:g}"
    elif args.reexport:
        suffix = "_reexport"
    results_path = os.path.join(args.out, "finetune_photos.json")
    results = {"images": args.images, "cpus": os.cpu_count(), "runs": {}}
    if os.path.exists(results_path):  # runs made earlier, one at a time, are kept
        with open(results_path) as f:
            earlier = json.load(f)
        if earlier.get("images") == args.images:
            results["runs"] = earlier["runs"]
    for base, weights in (("standin", "imagenet"), ("random", "none")):
        if args.only and args.only != base:
            continue
        if args.tag:
            base += f"_{args.tag}"
        name = base + suffix
        run_dir = os.path.join(args.work, f"run_{name}")
        start_over = ["--set", "output.resume=false"]
        if suffix:  # the same command again on a copy of the trained run: exports only
            trained = os.path.join(args.work, f"run_{base}")
            if not os.path.exists(os.path.join(trained, "run.json")):
                raise SystemExit(f"{suffix[1:]} re-exports the trained {trained}: run the "
                                 f"benchmark without --max-drop / --reexport first.")
            shutil.rmtree(run_dir, ignore_errors=True)
            shutil.copytree(trained, run_dir)
            start_over = []
        command = ["finetune", photos, "--model", MODEL, "--weights", weights, "-o", run_dir,
                   *start_over, *extra]
        seconds, load = run_command(command, env)
        results["runs"][name] = {"command": "mvit2 " + " ".join(command), "wall_s": seconds,
                                 "load_average": load, "trained": not suffix,
                                 **figures(run_dir)}
        print(f"{name}: {seconds / 60:.1f} min", flush=True)
    server.stop()
    os.makedirs(args.out, exist_ok=True)
    with open(results_path, "w") as f:
        json.dump(results, f, indent=2)
    lines = table(results)
    with open(os.path.join(args.out, "finetune_photos.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
