"""`MODEL_CARD.md` of a fine-tuning run, written from its `run.json` only.

The Hugging Face model-card layout (what `huggingface_hub.ModelCard` and KerasHub's
`upload_preset` read): YAML front matter (`library_name`, `license` (+ `license_name` /
`license_link` for `other`), `tags`, `datasets`, `base_model`, `pipeline_tag`, `metrics`,
`model-index` with the measured results), then sections: model details, source weights and
their licence, classes, training recipe, evaluation (per class, confusion-matrix image),
the phone files (size, agreement with Keras, host latency), how to use them, limits, provenance.
Every number comes from `run.json`, so the card and the record cannot disagree.
"""

from __future__ import annotations

import json
import os
from typing import Any

import yaml

from keras_mvit2.ship.phone_files import file_kind
from keras_mvit2.utils.files import write_text

__all__ = ["CARD_FILE", "front_matter", "render_model_card", "write_model_card"]

CARD_FILE = "MODEL_CARD.md"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f} %"


def _mb(size: int | None) -> str:
    return "-" if size is None else f"{size / 1e6:.2f} MB"


def _dataset_name(run: dict[str, Any]) -> str:
    train = (run.get("data") or {}).get("train") or "images"
    return os.path.basename(os.path.normpath(train)) or "images"


def front_matter(run: dict[str, Any]) -> dict[str, Any]:
    """The card's YAML metadata (Hugging Face conventions) from `run.json`."""
    weights = run.get("weights") or {}
    licence = weights.get("license")
    meta: dict[str, Any] = {"library_name": "keras"}
    if licence:
        meta["license"] = licence["id"]
        if licence["id"] == "other":
            meta["license_name"] = licence["name"]
            meta["license_link"] = licence["link"]
    else:
        meta["license"] = "unknown"
    meta["tags"] = ["image-classification", "keras", "keras_mvit2", "mobilevitv2", "tflite",
                    "coreml"]
    meta["datasets"] = [_dataset_name(run)]
    if weights.get("repo_id") and weights.get("kind") in ("tag", "preset", "hf"):
        meta["base_model"] = weights["repo_id"]
    meta["pipeline_tag"] = "image-classification"
    meta["metrics"] = ["accuracy"]
    evaluation = run.get("evaluation")
    if evaluation:
        metrics = [{"type": "accuracy", "value": round(float(evaluation["top1"]), 4),
                    "name": "Top-1 accuracy (Keras)"}]
        for record in run.get("exports") or []:
            if record.get("top1") is not None:
                metrics.append({"type": "accuracy", "value": round(float(record["top1"]), 4),
                                "name": f"Top-1 accuracy ({file_kind(record)})"})
        meta["model-index"] = [{"name": f"{run['model']}-{_dataset_name(run)}", "results": [{
            "task": {"type": "image-classification", "name": "Image Classification"},
            "dataset": {"name": _dataset_name(run), "type": "imagefolder",
                        "split": "validation"},
            "metrics": metrics}]}]
    return meta


def _weights_section(weights: dict[str, Any]) -> list[str]:
    if not weights or weights.get("kind") == "random":
        return ["Random initialization: no pretrained weights were used."]
    lines = ["| field | value |", "|---|---|",
             f"| given as | `{weights.get('value')}` ({weights.get('kind')}) |"]
    for key, label in (("tag", "published tag"), ("repo_id", "repository"),
                       ("trained_on", "pretrained on"), ("sha256", "SHA-256 of the file")):
        if weights.get(key):
            lines.append(f"| {label} | `{weights[key]}` |" if key == "sha256"
                         else f"| {label} | {weights[key]} |")
    if weights.get("top1") is not None:
        lines.append(f"| published ImageNet-1k top-1 | {weights['top1']:g} % |")
    licence = weights.get("license")
    lines.append("")
    if licence:
        lines.append(f"Licence of the source weights, as published: [{licence['name']}]"
                     f"({licence['link']}): {licence['summary']}. The fine-tuned weights are "
                     "a modification of them; check these terms before you ship.")
    else:
        lines.append("Licence of the source weights: not known to keras_mvit2 (a file of "
                     "your own); state it here before you publish the model.")
    return lines


def _classes_section(run: dict[str, Any]) -> list[str]:
    data = run.get("data") or {}
    evaluation = run.get("evaluation") or {}
    per_class_acc = evaluation.get("per_class_accuracy") or {}
    lines = ["| class | training images | held-out images | top-1 (Keras) |",
             "|---|---:|---:|---:|"]
    for name, counts in (data.get("per_class") or {}).items():
        held = counts.get("validation")
        lines.append(f"| {name} | {counts['train']} | {'-' if held is None else held} | "
                     f"{_pct(per_class_acc.get(name))} |")
    return lines


def _augmentation(a: dict[str, Any]) -> str:
    """The augmentations that are on, in words (`AugmentConfig` fields)."""
    used = []
    if a.get("random_resized_crop"):
        lo, hi = a.get("rrc_scale", (0.08, 1.0))
        used.append(f"random resized crop (area {lo:g}-{hi:g})")
    if a.get("horizontal_flip"):
        used.append("horizontal flip")
    if a.get("rand_augment"):
        used.append(f"RandAugment ({a['rand_augment_ops']} ops, magnitude "
                    f"{a['rand_augment_magnitude']:g})")
    if a.get("random_erasing"):
        used.append(f"random erasing (p {a['random_erasing']:g})")
    if a.get("mixup_alpha"):
        used.append(f"MixUp (alpha {a['mixup_alpha']:g})")
    if a.get("cutmix_alpha"):
        used.append(f"CutMix (alpha {a['cutmix_alpha']:g})")
    return ", ".join(used) or "none"


def _recipe_section(recipe: dict[str, Any]) -> list[str]:
    trained = ("frozen backbone (classifier only)" if recipe["freeze_backbone"]
               else "all layers trained")
    return [
        f"- {recipe['epochs']} epoch(s), {recipe['optimizer']} (peak learning rate "
        f"{recipe['peak_lr']:.3g}, weight decay {recipe['weight_decay']:g}), "
        f"{recipe['schedule']} schedule with {recipe['warmup_epochs']:g} warm-up epoch(s), "
        f"global batch {recipe['global_batch_size']}, label smoothing "
        f"{recipe['label_smoothing']:g}, EMA {'on' if recipe['ema'] else 'off'}, "
        f"{trained}.",
        f"- Input {recipe['image_size']}x{recipe['image_size']} RGB in [0, 1]; "
        f"{recipe['precision']}; {_speed(recipe.get('images_per_second'))}.",
        f"- Augmentation: {_augmentation(recipe.get('augmentation') or {})}.",
    ]


def _speed(images_per_second: float | None) -> str:
    if images_per_second is None:
        return "training speed not recorded"
    return f"{images_per_second:.1f} training images/s"


def _files_in_words(run: dict[str, Any]) -> str:
    """`"TFLite int8, Core ML float16"`: the phone files written, by format and kind."""
    files = [file_kind(e) for e in run.get("exports") or [] if e.get("path")]
    return ", ".join(files) if files else "none written"


def _exports_section(run: dict[str, Any]) -> list[str]:
    exports = run.get("exports") or []
    if not exports:
        return ["No phone files were exported (`--export none`)."]
    lines = ["| file | format | size | top-1 | agreement with Keras | host latency (median) |",
             "|---|---|---:|---:|---:|---:|"]
    for r in exports:
        if r.get("path") is None:
            lines.append(f"| - | {r['format']} | - | - | - | {r.get('note') or 'skipped'} |")
            continue
        latency = r.get("latency")
        lat = "-" if not latency else (
            f"{latency['median_ms']:.2f} ms ({latency['runtime']}, 1 thread)")
        io = f", {r['io_dtype']} I/O" if r.get("io_dtype") else ""
        lines.append(f"| `{r['path']}` | {file_kind(r)}{io} | "
                     f"{_mb(r.get('size_bytes'))} | {_pct(r.get('top1'))} | "
                     f"{_pct(r.get('top1_agreement'))} | {lat} |")
    notes = sorted({r["note"] for r in exports if r.get("note")})
    lines += ["", *[f"Note: {n}" for n in notes]] if notes else []
    for r in exports:
        choice = _qat_choice(r)
        if choice:
            lines += ["", choice]
    return lines


def _qat_choice(record: dict[str, Any]) -> str | None:
    """Which int8 file shipped after quantization-aware training was tried, on how many
    images neither file trained or calibrated on, with the paired test's p-value."""
    facts = record.get("qat")
    if not facts:
        return None
    if facts.get("error"):
        return (f"Int8 file: the post-training file; quantization-aware training was tried "
                f"and failed ({facts['error'][:200]}).")
    judge = facts.get("judge_images") or {}
    which = ("the quantization-aware-trained file" if facts["shipped"] == "qat"
             else "the post-training file")
    why = facts.get("guard") or facts.get("reason")
    return (f"Int8 file: {which}, chosen on {facts['num_judged']} images neither file "
            f"trained or calibrated on ({judge.get('held_out', 0)} held-out, "
            f"{judge.get('set_aside', 0)} training images set aside before the training): "
            f"agreement with Keras {_pct(facts['agreement_post_training'])} (post-training) "
            f"and {_pct(facts['agreement_qat'])} (quantization-aware-trained), exact "
            f"one-sided paired test p = {facts['p_value']:.2g}; {why}. The rule: the "
            "quantization-aware-trained file ships only at p < 0.05 with a top-1 not lower "
            "there and no lower top-1 or agreement on the held-out images, so one that agrees "
            "no more often than the post-training file ships in at most 5 % of runs.")


def _usage_section(run: dict[str, Any]) -> list[str]:
    files = {r["target"]: r["path"] for r in run.get("exports") or [] if r.get("path")}
    lines = []
    if "tflite" in files:
        lines += ["Android / MediaPipe Tasks (the file carries the class names and the "
                  "standard TFLite metadata):", "", "```python",
                  "from mediapipe.tasks.python import BaseOptions, vision",
                  "classifier = vision.ImageClassifier.create_from_options(",
                  f"    vision.ImageClassifierOptions(base_options=BaseOptions("
                  f"model_asset_path=\"{files['tflite']}\")))", "```", ""]
    if "coreml" in files:
        lines += [f"iOS: add `{files['coreml']}` to an Xcode project; Vision's "
                  "`VNCoreMLRequest` returns the class names.", ""]
    model = (run.get("evaluation") or {}).get("model") or "model_ema.keras"
    lines += ["Keras:", "", "```python", "import keras, keras_mvit2",
              f"model = keras.saving.load_model(\"{model}\")  # RGB in [0, 1]", "```"]
    return lines


def render_model_card(run: dict[str, Any]) -> str:
    """The card's Markdown for the facts of `run.json` (a dict)."""
    evaluation = run.get("evaluation")
    recipe = run.get("recipe") or {}
    name = f"{run['model']}-{_dataset_name(run)}"
    classes = (run.get("data") or {}).get("class_names") or run.get("class_names") or []
    out = ["---", yaml.safe_dump(front_matter(run), sort_keys=False).rstrip(), "---", "",
           f"# Model card for {name}", "",
           f"A {run['model']} image classifier for {len(classes)} classes "
           f"({', '.join(classes[:12])}{', ...' if len(classes) > 12 else ''}), "
           f"fine-tuned with keras_mvit2 on the photos of `{_dataset_name(run)}`, with phone "
           f"files ({_files_in_words(run)}) that carry the class names.", "",
           "## Model details", "",
           f"- Architecture: {run['model']} (MobileViTv2, separable self-attention; "
           "Mehta & Rastegari 2022, https://arxiv.org/abs/2206.02680)",
           f"- Input: {recipe.get('image_size')}x{recipe.get('image_size')} RGB in [0, 1] "
           "(the files take pixels; the TFLite metadata says mean 0 / std 255)",
           f"- Classes: {run.get('num_classes', len(classes))}", "",
           "## Source weights", "", *_weights_section(run.get("weights") or {}), "",
           "## Classes and data", "", *_classes_section(run), "",
           "## Training recipe", "", *(_recipe_section(recipe) if recipe else ["-"]), "",
           "## Evaluation", ""]
    if evaluation:
        out += [f"On {evaluation['num_examples']} held-out images with `{evaluation['model']}`: "
                f"top-1 {_pct(evaluation['top1'])}, top-5 {_pct(evaluation['top5'])}.", "",
                f"![confusion matrix]({evaluation['confusion_matrix_image']})", ""]
    else:
        out += ["Not measured: the run had no held-out images.", ""]
    out += ["## Phone files", "", *_exports_section(run), "",
            "## How to use", "", *_usage_section(run), "",
            "## Limitations", "", *[f"- {line}" for line in run.get("limits") or []], "",
            "## Provenance", "",
            f"- Created {run.get('created')} with keras_mvit2 {run.get('keras_mvit2')} "
            f"(TensorFlow {run.get('tensorflow')}, Keras {run.get('keras')}).",
            "- Every figure above is copied from `run.json` in the run folder.", ""]
    return "\n".join(out)


def write_model_card(run_dir: str | os.PathLike) -> str:
    """Writes `run_dir/MODEL_CARD.md` (atomically) from `run_dir/run.json`; returns its path."""
    run_dir = os.fspath(run_dir)
    with open(os.path.join(run_dir, "run.json")) as f:
        run = json.load(f)
    path = os.path.join(run_dir, CARD_FILE)
    write_text(path, render_model_card(run))
    return path
