"""`mvit2 finetune`: a folder of photos in, a labelled phone model out, in one command.

    mvit2 finetune photos/ --model mobilevitv2_050 --weights imagenet -o run

trains with the packaged small-data recipe (`finetune_small_data`; `--config` and `--set`
override it), starting from published weights (a tag, a KerasHub preset name, an `hf://`
id) or a file, then exports a full-int8 `.tflite` and a Core ML package with the folder's
class names, validates both on the held-out images, writes `MODEL_CARD.md` and prints a
summary table (`keras_mvit2.ship.finetune_to_phone`).

Overrides apply in this order: the config (`--config`, default `finetune_small_data`),
DATA_DIR (`--data`), `--model`, the input size (`--image-size`; without it and without
`--config`, the checkpoint's size), `--epochs`, `--val`, then `--set`, then `--output` /
`--strategy`.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from keras_mvit2.cli.train_cmd import (
    DEFAULT_VALIDATION_FRACTION,
    _print_plan,
    _set_data,
    _with_overrides,
)

#: The recipe used without `--config`.
DEFAULT_CONFIG = "finetune_small_data"
EXPORT_CHOICES = ("tflite", "coreml")


def register(sub: argparse._SubParsersAction) -> None:
    from keras_mvit2.optimizer.qat_settings import QAT_EPOCHS, QAT_LEARNING_RATE, QAT_MAX_STEPS

    p = sub.add_parser(
        "finetune",
        help="fine-tune on a folder of photos and export labelled phone models",
        description="Fine-tune MobileViTv2 on a folder of photos (one sub-folder per class) "
        "from published weights or a file, then export a full-int8 .tflite (MediaPipe / "
        "LiteRT) and a Core ML package with the class names, validate them on held-out "
        "images and write MODEL_CARD.md. With no --config, the packaged small-data recipe "
        f"({DEFAULT_CONFIG}) is used.",
    )
    p.add_argument("data_dir", nargs="?", metavar="DATA_DIR",
                   help="folder of class sub-folders of photos (with train/ and val/ "
                   "sub-folders those are the splits)")
    p.add_argument("--data", metavar="DIR", help="the same as DATA_DIR")
    p.add_argument("--model", help="registered model (default: the weights' model, else "
                   "the recipe's), e.g. mobilevitv2_050")
    p.add_argument("--weights", default="imagenet", metavar="W",
                   help="what to start from: a published tag (imagenet, imagenet22k_ft_in1k, "
                   "... see `mvit2 weights`), a KerasHub preset name "
                   "(mobilevitv2_050_imagenet), an hf://<owner>/<repo> id, a checkpoint file "
                   "(.pt, .pth, .bin, .safetensors, .weights.h5, or an earlier run's .keras) "
                   "or none (random initialization). Default: imagenet")
    p.add_argument("--config", metavar="CFG",
                   help=f"a packaged config name or a YAML file (default {DEFAULT_CONFIG})")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="override a config field (repeatable; YAML values)")
    p.add_argument("--image-size", type=int, metavar="N",
                   help="input side (default: the checkpoint's, e.g. 256)")
    p.add_argument("--epochs", type=int, metavar="N", help="epochs (the recipe's: 30)")
    p.add_argument("--freeze-backbone", action="store_true",
                   help="train only the classifier (the BatchNorms keep their statistics)")
    p.add_argument("--val", metavar="DIR|FRACTION",
                   help="held-out images: a folder of the same classes, or the fraction of "
                   f"DATA_DIR to hold out (default {DEFAULT_VALIDATION_FRACTION}; 0: none)")
    p.add_argument("--export", default=",".join(EXPORT_CHOICES), metavar="LIST",
                   help="phone files: tflite, coreml, both (default tflite,coreml) or none")
    p.add_argument("--io-dtype", choices=("float32", "uint8"), default="float32",
                   help="the int8 .tflite's input/output type (default float32: pixels / 255 "
                   "in, probabilities out; uint8: camera pixels in)")
    p.add_argument("--max-drop", type=float, metavar="POINTS",
                   help="instead of int8 / fp16, ship per target the smallest file whose "
                   "top-1 drop against Keras on the held-out images is at most POINTS and "
                   "that is not slower than float32 on this host (mvit2 optimize's search "
                   "and default objective; exits 1 if a target has none)")
    p.add_argument("--qat-steps", type=int, default=QAT_MAX_STEPS, metavar="N",
                   help="where the int8 .tflite agrees with Keras on fewer than 99 %% of the "
                   "held-out images (or, with --max-drop, no post-training int8 file is "
                   "within it), try a quantization-aware-trained int8 file, towards the Keras "
                   "model's own answers on the training images less a quarter set aside; it "
                   "replaces the int8 file only where an exact paired test on the held-out "
                   "and set-aside images chooses it (p < 0.05) and its top-1 and agreement "
                   "on the held-out images are not lower: at most N steps a pass (default "
                   f"{QAT_MAX_STEPS}; 0: never)")
    p.add_argument("--qat-epochs", type=int, default=QAT_EPOCHS, metavar="E",
                   help=f"its passes over the training images (default {QAT_EPOCHS})")
    p.add_argument("--qat-lr", type=float, default=QAT_LEARNING_RATE, metavar="LR",
                   help=f"its Adam learning rate (default {QAT_LEARNING_RATE:g})")
    p.add_argument("-o", "--output", metavar="RUN",
                   help="run folder (a folder holding a run resumes it)")
    p.add_argument("--strategy", choices=("default", "mirrored", "multi_worker", "tpu"),
                   help="distribution strategy (config training.strategy)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in the output folder even if its length or "
                   "schedule changed (as `mvit2 train --resume`)")
    p.set_defaults(handler=_finetune)


def _exports(value: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    if names == ("none",):
        return ()
    unknown = [n for n in names if n not in EXPORT_CHOICES]
    if unknown or not names:
        raise ValueError(f"--export takes tflite, coreml, tflite,coreml or none. "
                         f"Received: --export {value!r}")
    return names


def _val_fields(value: str) -> dict[str, Any]:
    try:
        fraction = float(value)
    except ValueError:
        fraction = None
    if fraction is not None:
        if not 0.0 <= fraction < 1.0:
            raise ValueError(f"--val takes a fraction in [0, 1) or a folder. Received: {value}")
        return {"validation": None, "validation_fraction": fraction}
    if not os.path.isdir(value):
        raise FileNotFoundError(f"--val: folder not found: {value!r} (pass a folder of the "
                                "same class sub-folders, or a fraction such as 0.2)")
    return {"validation": value, "validation_fraction": 0.0}


def _model_name(args: argparse.Namespace, config_model: str) -> str:
    if args.model:
        return args.model
    from keras_mvit2.models.mobilevitv2.mobilevitv2_presets import find_preset

    entry = find_preset(args.weights or "")
    return entry.model if entry is not None else config_model


def build_config(args: argparse.Namespace):
    """`(TrainConfig, WeightsSource)` of the command line (resolving, and downloading,
    the weights: the input size may come from them)."""
    from keras_mvit2 import training
    from keras_mvit2.models.weights_source import resolve_weights_source

    data_dir = args.data_dir or args.data
    if args.data_dir and args.data and args.data_dir != args.data:
        raise ValueError("Give the photos once: DATA_DIR or --data, not both.")
    config = training.load_config(args.config or DEFAULT_CONFIG)
    if not data_dir and not args.config:
        raise ValueError("mvit2 finetune needs DATA_DIR: a folder with one sub-folder of "
                         "photos per class (e.g. photos/cats/*.jpg, photos/dogs/*.jpg).")
    d = config.to_dict()
    if data_dir:
        _set_data(d, data_dir, config.data)
    d["model"]["name"] = _model_name(args, config.model.name)
    try:
        source = resolve_weights_source(args.weights, d["model"]["name"])
    except FileNotFoundError as err:
        raise FileNotFoundError(f"--weights: file not found: {args.weights!r}. Pass an "
                                "ml-cvnets .pt, a timm .pth/.bin/.safetensors, a Keras "
                                ".weights.h5 or .keras, a published tag (imagenet), a KerasHub "
                                "preset name or an hf:// id.") from err
    if args.image_size is not None:
        d["model"]["image_size"] = args.image_size
    elif not args.config and source.input_size:
        d["model"]["image_size"] = source.input_size
    if args.epochs is not None:
        d["training"]["epochs"] = args.epochs
    if args.val is not None:
        d["data"].update(_val_fields(args.val))
    return _with_overrides(d, args), source


def _finetune(args: argparse.Namespace) -> int:
    from rich.markup import escape

    from keras_mvit2.demo import print_steps
    from keras_mvit2.ship import finetune_to_phone
    from keras_mvit2.utils.console import output_console

    targets = _exports(args.export)
    config, source = build_config(args)
    console = output_console()
    result = finetune_to_phone(
        config, source, freeze_backbone=args.freeze_backbone, export=targets,
        io_dtype=args.io_dtype, max_drop=args.max_drop, qat_steps=args.qat_steps,
        qat_learning_rate=args.qat_lr, qat_epochs=args.qat_epochs, replan=args.resume,
        on_plan=_print_plan,
        log=lambda line: console.print(escape(line), highlight=False, soft_wrap=True))
    title = (f"mvit2 finetune: {config.model.name} on {len(result.data.class_names)} classes, "
             f"{result.seconds:.0f} s")
    print_steps(title, result.steps, result.run_dir, "run.json: all figures", console)
    labels = {"model": "Keras model",
              "tflite": "TFLite" if args.max_drop is not None else "int8 TFLite",
              "coreml": "Core ML",
              "confusion_matrix": "confusion matrix", "model_card": "model card",
              "run_json": "figures"}
    for key, label in labels.items():
        path = result.paths.get(key)
        if path:
            console.print(f"{label + ':':18} {escape(path)}", highlight=False,
                          soft_wrap=True)  # a path stays on one line in a log
    over = [r["note"] for r in result.exports if (r.get("note") or "").startswith("over budget")]
    if over:
        from keras_mvit2.cli.failure import CommandFailedError

        raise CommandFailedError(" ".join(over), status=1)
    return 0
