"""`mvit2 train` and `mvit2 eval`: the training library on the command line.

- `train --config CFG [--data DIR] [--set key=value ...] [--output DIR] [--strategy S]
  [--resume]` runs `keras_mvit2.training.train` and prints the final metrics and where the
  models, checkpoints and TensorBoard logs went. Before training, one line says what
  happens with the run folder (`keras_mvit2.training.run_folder`): a new run, resuming at
  epoch k of n, already complete (evaluating only), or refused (another model, or another
  length or schedule: `--resume` continues it with the learning rate re-planned, another
  folder or `--set output.resume=false` starts over);
  `train --task segmentation|detection ...` trains a downstream task model instead
  (`keras_mvit2.cli.task_cmd.train_task`).
- `finetune`: `keras_mvit2.cli.finetune_cmd` (photos in, phone files out).
- `eval MODEL --data DIR|fashion_mnist`: top-1 / top-5, per-class accuracy, a
  confusion-matrix PNG and a JSON report (`training.write_eval_report`).

Overrides apply in this order: the config file, then `--data`, then `--set`, then
`--output` / `--strategy`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import TYPE_CHECKING, Any

from keras_mvit2.cli import task_cmd

if TYPE_CHECKING:
    from keras_mvit2.training import DataConfig, EvalResult, RunPlan, TrainConfig, TrainResult

CLASSIFICATION = "classification"
#: `--data` value that selects the built-in Fashion-MNIST source instead of a folder.
FASHION_MNIST = "fashion_mnist"
#: Default validation fraction held out of a `--data` folder without train/ and val/.
DEFAULT_VALIDATION_FRACTION = 0.1


def _task_defaults() -> dict[str, Any]:
    """`{dest: default}` of the task-only options (`task_cmd.add_train_arguments`)."""
    probe = argparse.ArgumentParser(add_help=False)
    task_cmd.add_train_arguments(probe)
    return vars(probe.parse_args([]))


def _add_config_arguments(p: argparse.ArgumentParser, *, config_required: bool) -> None:
    p.add_argument("--config", required=config_required, metavar="CFG",
                   help="a packaged config name (e.g. fashion_mnist, finetune_small_data) "
                   "or a YAML file")
    p.add_argument("--data", metavar="DIR",
                   help="train on this image folder (one sub-folder per class; with train/ "
                   "and val/ sub-folders those are the splits, otherwise "
                   f"{DEFAULT_VALIDATION_FRACTION:.0%}% is held out for validation) or "
                   f"'{FASHION_MNIST}', instead of the config's data")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE",
                   help="override a config field, e.g. --set training.epochs=3 (repeatable; "
                   "values are YAML)")
    p.add_argument("-o", "--output", metavar="DIR",
                   help="run folder (config output.dir); a folder holding a run resumes it")
    p.add_argument("--strategy", choices=("default", "mirrored", "multi_worker", "tpu"),
                   help="distribution strategy (config training.strategy); multi_worker "
                   "reads TF_CONFIG")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in the output folder even if its length or schedule "
                   "changed (training.epochs, steps, batch, learning rates): the learning rate "
                   "is re-planned from its current step to the new end. Without it such a run "
                   "is refused; --set output.resume=false starts over instead")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a classifier from a config (or a segmentation / detection model)",
        description="Train a classifier with the MobileViTv2 recipe from a packaged config or "
        "a YAML file, resuming the run folder if it holds a run. With --task "
        "segmentation|detection, train a downstream task model on the pasted "
        "Fashion-MNIST set instead (options below).",
    )
    p.add_argument("--task", choices=(CLASSIFICATION, *task_cmd.TASKS), default=CLASSIFICATION)
    _add_config_arguments(p, config_required=False)
    task_cmd.add_train_arguments(p.add_argument_group(
        "segmentation / detection (--task segmentation|detection only)"))
    p.set_defaults(handler=_train)

    p = sub.add_parser(
        "eval",
        help="top-1/top-5, per-class accuracy and confusion matrix of a classifier",
        description="Evaluate a classifier (.keras, or a run folder of mvit2 train) on an "
        "image folder or the Fashion-MNIST test set; writes eval.json and "
        "confusion_matrix.png.",
    )
    p.add_argument("model", help="a .keras classifier, or a run folder of `mvit2 train` "
                   "(its model_ema.keras, else model.keras)")
    p.add_argument("--data", required=True, metavar="DIR",
                   help=f"an image folder (one sub-folder per class) or '{FASHION_MNIST}' "
                   "(its test set)")
    p.add_argument("--image-size", type=int,
                   help="input size (default: the model's fixed size; any size for any "
                   "model: one trained at another size is evaluated with the same weights)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--crop-ratio", type=float,
                   help="center crop after resizing to size / ratio (default: the run's "
                   "data.crop_ratio, else 1.0 for Fashion-MNIST and 0.875 for folders)")
    p.add_argument("-o", "--output", metavar="DIR",
                   help="report folder (default: eval/ beside the model)")
    p.set_defaults(handler=_eval)


# --------------------------------------------------------------------------------------
# Config from the command line
# --------------------------------------------------------------------------------------


def _data_section(path: str, current: DataConfig) -> dict[str, Any]:
    """The `data` fields that `--data` sets."""
    if path == FASHION_MNIST:
        return {"source": "fashion_mnist", "train": None, "validation": None,
                "validation_split": current.validation_split or "test"}
    if not os.path.exists(path):
        raise FileNotFoundError(f"--data: image folder not found: {path!r}")
    if not os.path.isdir(path):
        raise NotADirectoryError(f"--data must be a folder of class sub-folders or "
                                 f"'{FASHION_MNIST}'. Received: {path!r}")
    train_dir = os.path.join(path, "train")
    for name in ("val", "validation"):
        val_dir = os.path.join(path, name)
        if os.path.isdir(train_dir) and os.path.isdir(val_dir):
            return {"source": "image_folder", "train": train_dir, "validation": val_dir,
                    "validation_fraction": 0.0}
    return {"source": "image_folder", "train": path, "validation": None,
            "validation_fraction": current.validation_fraction or DEFAULT_VALIDATION_FRACTION}


def _set_data(d: dict[str, Any], path: str, current: DataConfig) -> None:
    """Points the config dict `d` at `--data` (the folder's classes size the classifier)."""
    d["data"].update(_data_section(path, current))
    d["model"]["num_classes"] = None


def _with_overrides(d: dict[str, Any], args: argparse.Namespace) -> TrainConfig:
    """The `TrainConfig` of the config dict `d` with `--set`, then `--output` / `--strategy`."""
    from keras_mvit2 import training

    overrides = list(args.overrides)
    if args.output:
        overrides.append(f"output.dir={json.dumps(args.output)}")
    if args.strategy:
        overrides.append(f"training.strategy={args.strategy}")
    return training.load_config(d, overrides)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The `TrainConfig` of `--config`, `--data`, `--set`, `--output`, `--strategy`."""
    from keras_mvit2 import training

    config = training.load_config(args.config)
    d = config.to_dict()
    if args.data:
        _set_data(d, args.data, config.data)
    return _with_overrides(d, args)


# --------------------------------------------------------------------------------------
# Printing
# --------------------------------------------------------------------------------------


def print_metrics(results: dict[str, EvalResult], title: str) -> None:
    """Prints `{column name: EvalResult}` as one rich table (top-1, top-5, per class)."""
    from rich.markup import escape
    from rich.table import Table

    from keras_mvit2.utils.console import output_console

    table = Table("metric", *results, title=title)
    columns = list(results.values())
    table.add_row("top-1 (%)", *(f"{100 * r.top1:.2f}" for r in columns))
    table.add_row("top-5 (%)", *(f"{100 * r.top5:.2f}" for r in columns))
    table.add_row("images", *(str(r.num_examples) for r in columns), end_section=True)
    for i, name in enumerate(columns[0].class_names):
        table.add_row(escape(name), *(
            "-" if math.isnan(r.per_class_accuracy[i])  # a class without examples
            else f"{100 * r.per_class_accuracy[i]:.2f}" for r in columns))
    output_console().print(table)


def _print_plan(plan: RunPlan) -> None:
    """The line of what happens with the run folder, before training (always shown), after
    its notes (a batch lowered to fit a small training set)."""
    for line in (*plan.notes, plan.line):
        print(line, flush=True)


def _attention_label(names: list[str]) -> str:
    return ", ".join(names) or "none"


def _print_run(result: TrainResult) -> None:
    if result.metrics:
        print_metrics({"raw": result.metrics["raw"],
                       **({"EMA": result.metrics["ema"]} if "ema" in result.metrics else {})},
                      title=f"validation accuracy (%) after {len(result.history)} epoch(s), "
                            f"attention: {_attention_label(result.attention)}")
    else:
        print("No validation data (set data.validation, data.validation_fraction or "
              "data.validation_split): no metrics.")
    out = result.output_dir
    rows = [("run folder", out), ("model", result.model_path),
            ("EMA model", result.ema_model_path),
            ("checkpoints", result.checkpoint_path and os.path.dirname(result.checkpoint_path)),
            ("metrics", os.path.join(out, "metrics.json"))]
    tensorboard = os.path.join(out, "tensorboard")
    if os.path.isdir(tensorboard):
        rows.append(("TensorBoard", f"{tensorboard}  (tensorboard --logdir {tensorboard})"))
    for name, value in rows:
        if value:
            print(f"{name + ':':13} {value}")
    print(f"{result.images_per_second:.1f} images/s, global batch {result.global_batch_size}, "
          f"{result.num_replicas} replica(s), {result.precision}")


# --------------------------------------------------------------------------------------
# Handlers
# --------------------------------------------------------------------------------------


def _train(args: argparse.Namespace) -> int:
    defaults = _task_defaults()
    if args.task != CLASSIFICATION:
        given = [flag for flag, value in (("--config", args.config), ("--data", args.data),
                                          ("--set", args.overrides),
                                          ("--strategy", args.strategy),
                                          ("--resume", args.resume)) if value]
        if given:
            raise ValueError(f"{', '.join(given)} configure(s) classification training; "
                             f"--task {args.task} takes the options of its group in "
                             "`mvit2 train --help`.")
        return task_cmd.train_task(args)
    changed = ["--" + dest.replace("_", "-") for dest, default in defaults.items()
               if getattr(args, dest) != default]
    if changed:
        raise ValueError(f"{', '.join(changed)} only appl(ies) to --task segmentation|"
                         "detection; classification takes its settings from the config "
                         "(e.g. --set data.batch_size=32 --set model.image_size=128).")
    if not args.config:
        raise ValueError("mvit2 train needs --config CFG (a YAML file or a packaged config: "
                         "see keras_mvit2.training.packaged_configs()), e.g. "
                         "--config fashion_mnist.")
    from keras_mvit2 import training

    _print_run(training.train(config_from_args(args), replan=args.resume,
                              on_plan=_print_plan))
    return 0


def _resolve_model(path: str) -> str:
    if os.path.isdir(path):
        for name in ("model_ema.keras", "model.keras"):
            candidate = os.path.join(path, name)
            if os.path.exists(candidate):
                return candidate
        raise FileNotFoundError(
            f"No model_ema.keras or model.keras in {path!r}: pass a .keras file or the run "
            "folder of a finished `mvit2 train` (it writes them when training ends).")
    if not os.path.exists(path):
        raise FileNotFoundError(f"Model not found: {path!r}")
    if not path.endswith(".keras"):
        raise ValueError(f"MODEL must be a .keras file or a run folder. Received: {path!r}")
    return path


def _read_run(model_path: str) -> tuple[dict, dict]:
    """`(config.yaml, run.json)` of the run folder holding `model_path` (empty if none)."""
    from keras_mvit2.training.config import load_yaml

    folder = os.path.dirname(os.path.abspath(model_path))
    config, run = {}, {}
    if os.path.exists(os.path.join(folder, "config.yaml")):
        with open(os.path.join(folder, "config.yaml")) as f:
            config = load_yaml(f.read()) or {}
    if os.path.exists(os.path.join(folder, "run.json")):
        with open(os.path.join(folder, "run.json")) as f:
            run = json.load(f)
    return config, run


def _eval(args: argparse.Namespace) -> int:
    model_path = _resolve_model(args.model)
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1. Received: {args.batch_size}")
    if args.crop_ratio is not None and not 0.0 < args.crop_ratio <= 1.0:
        raise ValueError(f"--crop-ratio must be in (0, 1]. Received: {args.crop_ratio}")
    from keras_mvit2 import data as mvdata
    from keras_mvit2 import training
    from keras_mvit2.models.input_size import with_dynamic_size
    from keras_mvit2.utils.model_files import load_keras_model

    if args.data == FASHION_MNIST:
        source, default_crop = mvdata.fashion_mnist("test"), 1.0
    else:
        source, default_crop = mvdata.image_folder(args.data), 0.875
    config, run = _read_run(model_path)
    class_names = list(source.class_names)
    trained = run.get("class_names")
    if trained and trained[:len(class_names)] != class_names:
        raise ValueError(
            f"The classes of {args.data!r} ({class_names}) are not those the model was "
            f"trained on ({trained}, from run.json); evaluate on data with the same classes.")
    model = load_keras_model(model_path, compile=True)
    outputs = int(model.output_shape[-1])
    if trained and len(trained) == outputs:
        class_names = list(trained)
    elif outputs != len(class_names):
        raise ValueError(f"{model_path!r} has {outputs} outputs but {args.data!r} has "
                         f"{len(class_names)} classes ({class_names}).")
    size = model.input_shape[1]
    if args.image_size is not None and size is not None and args.image_size != size:
        # A model trained at one size, evaluated at another: the same layers and weights
        # for any size (the blocks take their patch grid from each batch).
        model = with_dynamic_size(model)
        size = None
    size = size or args.image_size
    if size is None:
        raise ValueError(f"{model_path!r} has no fixed input size: pass --image-size N.")
    crop = args.crop_ratio or (config.get("data") or {}).get("crop_ratio") or default_crop
    dataset = mvdata.make_eval_dataset(source, image_size=size, batch_size=args.batch_size,
                                       num_classes=outputs, crop_ratio=crop)
    result = training.evaluate(model, dataset, class_names)
    output = args.output or os.path.join(os.path.dirname(os.path.abspath(model_path)), "eval")
    from keras_mvit2.layers.attention_registry import names_in

    attention = names_in(model)
    info = {"model": os.path.abspath(model_path), "attention": attention, "data": args.data,
            "image_size": size, "crop_ratio": crop, "skipped_images": source.skipped.count}
    paths = training.write_eval_report(result, output, info=info)
    print_metrics({os.path.basename(model_path): result},
                  title=f"accuracy (%) on {args.data} ({size}x{size}), attention: "
                        f"{_attention_label(attention)}")
    if source.skipped.count:
        print(source.skipped.report())
    print(f"report:           {paths['json']}")
    print(f"confusion matrix: {paths['confusion_matrix']}")
    return 0
