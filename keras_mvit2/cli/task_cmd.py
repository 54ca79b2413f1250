"""`mvit2 eval-task` and `mvit2 task-profile`, and the trainer behind
`mvit2 train --task segmentation|detection` (`add_train_arguments`, `train_task`): the
downstream tasks (segmentation with DeepLabv3 / PSPNet, detection with SSDLite) on
MobileViTv2.

Training runs on the pasted Fashion-MNIST set of `keras_mvit2.tasks.data` (real
Fashion-MNIST items on real scikit-image photos, built offline); the output folder
gets `model.keras`, `model.weights.h5`, `config.json` and `metrics.json` (loss
history, validation mIoU / COCO mAP and the trivial baselines), all written
atomically.
"""

from __future__ import annotations

import argparse
import json
import os

from keras_mvit2.backend import require_tensorflow
from keras_mvit2.cli.models_cmd import print_markdown
from keras_mvit2.utils.files import atomic_output, write_json

TASKS = ("segmentation", "detection")
HEADS = {"segmentation": ("deeplabv3", "pspnet"), "detection": ("ssdlite",)}


def register(sub) -> None:
    # The task layers (dilated blocks, ASPP/PSP layers) are registered for `.keras` loading
    # by `import keras_mvit2`, on every backend. These two commands need TensorFlow (the
    # tf.data validation set, the profiler's MAC counts): off the TensorFlow backend this
    # raises, and `mvit2` registers them to say so when they are run.
    require_tensorflow("mvit2 eval-task / task-profile (the task models' data and MAC counts)")

    p = sub.add_parser("eval-task", help="evaluate a trained task model (.keras) on the "
                       "pasted Fashion-MNIST validation set")
    p.add_argument("model", help="model.keras written by `mvit2 train --task ...`")
    p.add_argument("--val-images", type=int, default=128)
    p.add_argument("--seed", type=int, default=1,
                   help="validation-set seed (training uses its --seed + 1)")
    p.add_argument("--json", dest="json_path", help="also write the metrics to this file")
    p.set_defaults(handler=_eval)

    p = sub.add_parser("task-profile", help="parameters and MACs of the task models beside "
                       "the paper's Table 3 / Table 4")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    p.add_argument("--json", dest="json_path", help="also write the rows to this JSON file")
    p.set_defaults(handler=_profile)


def add_train_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The task-training options of `mvit2 train --task ...` (`--task` and `--output` are
    `mvit2 train`'s own)."""
    p.add_argument("--head", help="deeplabv3 (default) or pspnet for segmentation; ssdlite")
    p.add_argument("--width", type=float, default=0.5, help="width multiplier (default 0.5)")
    p.add_argument("--attention", default="separable",
                   help="attention of the backbone blocks (keras_mvit2.attention names)")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--output-stride", type=int, default=16, choices=(8, 16, 32),
                   help="segmentation output stride (default 16)")
    p.add_argument("--head-channels", type=int, default=64,
                   help="ASPP/PSP width, SSD projections (the paper: 512; default 64 here)")
    p.add_argument("--classes", type=int, nargs="+", default=[1, 7, 8], metavar="ID",
                   help="Fashion-MNIST classes to paste (default 1 7 8)")
    p.add_argument("--scale-range", type=float, nargs=2, default=[0.4, 0.8], metavar=("MIN", "MAX"),
                   help="pasted item side / image side (default 0.4 0.8)")
    p.add_argument("--objects-per-image", type=int, nargs=2, default=[1, 2],
                   metavar=("MIN", "MAX"), help="pasted items per image (default 1 2)")
    p.add_argument("--anchors", choices=("auto", "paper", "small"), default="auto",
                   help="SSD anchors: 'paper' (strides 16..256 + global, COCO config), "
                   "'small' (strides 8, 16, 32 + global, for inputs below 160 px); "
                   "default auto")
    p.add_argument("--val-images", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (AdamW)")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--ema", type=float, default=None, metavar="DECAY",
                   help="weight EMA decay (Table 11 uses EMA; off by default for short runs)")
    p.add_argument("--no-augment", action="store_true",
                   help="disable the Table 11 augmentations")
    p.add_argument("--train-images", type=int, default=512)
    p.add_argument("--backbone-weights",
                   help="backbone to start from: a classifier checkpoint (.pt/.pth/.safetensors/"
                        ".weights.h5) or a trained model's .keras (e.g. a segmenter's)")


#: SSD anchors for small inputs (the maps of strides 64..256 are 1x1 below 160 px).
SMALL_ANCHORS = {"output_strides": [8, 16, 32, -1], "aspect_ratios": [[2], [2, 3], [2, 3], [2]],
                 "min_scale": 0.15, "max_scale": 0.9}


def _anchor_config(args):
    from keras_mvit2.tasks.detection import AnchorConfig

    choice = getattr(args, "anchors", "auto")
    if choice == "auto":
        choice = "small" if args.image_size < 160 else "paper"
    if choice == "paper":
        return AnchorConfig()
    return AnchorConfig.from_dict({**AnchorConfig().to_dict(), **SMALL_ANCHORS})


def _dataset_options(config) -> dict:
    """The pasted-dataset arguments of a run (argparse namespace or config.json dict)."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    return {"classes": tuple(get("classes", (1, 7, 8))),
            "scale_range": tuple(get("scale_range", (0.4, 0.8))),
            "objects_per_image": tuple(get("objects_per_image", (1, 2)))}


def _head(args) -> str:
    head = args.head or HEADS[args.task][0]
    if head not in HEADS[args.task]:
        raise ValueError(f"--head for {args.task} must be one of {HEADS[args.task]}. "
                         f"Received: {head!r}")
    return head


def _build(args, num_classes: int):
    from keras_mvit2.tasks.detection import SSDLite
    from keras_mvit2.tasks.segmentation import DeepLabV3, PSPNet

    head = _head(args)
    shape = (args.image_size, args.image_size, 3)
    common = {"input_shape": shape, "classes": num_classes, "attention": args.attention,
              "backbone_weights": getattr(args, "backbone_weights", None)}
    if head == "deeplabv3":
        return DeepLabV3(args.width, output_stride=args.output_stride,
                         aspp_channels=args.head_channels, **common)
    if head == "pspnet":
        return PSPNet(args.width, output_stride=args.output_stride,
                      psp_channels=args.head_channels, **common)
    c = args.head_channels
    anchors = _anchor_config(args)
    levels = len(anchors.output_strides)
    return SSDLite(args.width, anchor_config=anchors,
                   proj_channels=(c,) * (levels - 1) + (max(c // 2, 8),), **common)


def train_task(args: argparse.Namespace) -> int:
    """Trains a task model for parsed `args` (`mvit2 train --task ...`, see
    `add_train_arguments`; `args.task` and `args.output` are set); returns 0."""
    import keras

    from keras_mvit2.tasks import data as td
    from keras_mvit2.tasks import train as tt
    from keras_mvit2.utils.progress import EpochProgress, progress_verbose

    if not args.output:
        raise ValueError(f"--task {args.task} needs an output folder: add -o DIR.")
    if args.steps < 1 or args.batch_size < 1 or args.train_images < args.batch_size:
        raise ValueError("Need --steps >= 1, --batch-size >= 1 and --train-images >= "
                         "--batch-size.")
    _head(args)
    keras.utils.set_random_seed(args.seed)
    segmentation = args.task == "segmentation"
    options = _dataset_options(args)
    train = td.pasted_fashion_mnist(args.train_images, args.image_size, split="train",
                                    ignore_borders=segmentation, seed=args.seed, **options)
    val = td.pasted_fashion_mnist(args.val_images, args.image_size, split="val",
                                  seed=args.seed + 1, **options)
    num_classes = train.num_classes
    model = _build(args, num_classes)
    config = tt.TaskOptimizerConfig(
        "adamw", args.lr, args.lr / 10, args.weight_decay, args.warmup_steps, args.lr / 10,
        10.0, args.ema)
    optimizer = tt.task_optimizer(config, args.steps)
    epochs = max(1, min(10, args.steps // 25))
    per_epoch = max(1, args.steps // epochs)
    if segmentation:
        dataset = td.segmentation_dataset(
            train.images, train.masks, args.batch_size, training=True,
            augment=None if args.no_augment else td.SegmentationAugment(), seed=args.seed)
        tt.compile_segmentation(model, num_classes, optimizer)
    else:
        dataset = td.detection_dataset(
            train.images, train.boxes, train.labels, model.anchors, args.batch_size,
            training=True, config=model.anchor_config,
            augment=None if args.no_augment else td.DetectionAugment(), seed=args.seed)
        tt.compile_detection(model, optimizer)
    # The bar on a terminal, one plain line per epoch in a log file or a pipe.
    verbose = progress_verbose(1)
    history = model.fit(dataset, epochs=epochs, steps_per_epoch=per_epoch, verbose=verbose,
                        callbacks=[EpochProgress(epochs, verbose)])
    metrics = {"loss": [float(v) for v in history.history["loss"]],
               **_evaluate(model, args.task, val)}
    os.makedirs(args.output, exist_ok=True)
    with atomic_output(os.path.join(args.output, "model.keras")) as tmp:
        model.save(tmp)
    with atomic_output(os.path.join(args.output, "model.weights.h5")) as tmp:
        model.save_weights(tmp)
    run_config = {k: v for k, v in vars(args).items()
                  if k != "handler" and not k.startswith("_")}
    run_config["class_names"] = list(train.class_names)
    if not segmentation:
        run_config["anchor_config"] = model.anchor_config.to_dict()
    write_json(os.path.join(args.output, "config.json"), run_config)
    write_json(os.path.join(args.output, "metrics.json"), metrics)
    print(json.dumps({k: v for k, v in metrics.items() if k != "confusion_matrix"}, indent=2))
    return 0


def _evaluate(model, task: str, val) -> dict:
    import numpy as np

    from keras_mvit2.tasks import train as tt
    from keras_mvit2.tasks.detection import anchors_for_model

    if task == "segmentation":
        result = tt.evaluate_segmentation(model, val.images, val.masks, val.num_classes)
        background = np.zeros(val.masks.shape, np.int64)
        from keras_mvit2.tasks.segmentation import confusion_matrix, mean_iou

        result["baseline_all_background_miou"] = mean_iou(
            confusion_matrix(val.masks, background, val.num_classes, val.ignore_index))
        return result
    ground_truth = [val.objects(i) for i in range(len(val))]
    anchors = anchors_for_model(model)
    result = tt.evaluate_detection(model, val.images, ground_truth, anchors,
                                   getattr(model, "anchor_config", None))
    result["baseline_center_box_map"] = tt.center_box_baseline(ground_truth)["map"]
    result["baseline_random_box_map"] = tt.random_box_baseline(ground_truth)["map"]
    return result


def _eval(args: argparse.Namespace) -> int:
    import keras_mvit2.tasks  # noqa: F401 (registers the task layers for loading)
    from keras_mvit2.tasks import data as td
    from keras_mvit2.utils.model_files import check_file_format, load_keras_model

    if not os.path.exists(args.model):
        raise FileNotFoundError(f"Model file not found: {args.model!r}")
    check_file_format(args.model)
    config_path = os.path.join(os.path.dirname(os.path.abspath(args.model)), "config.json")
    if not os.path.exists(config_path):
        raise FileNotFoundError(
            f"{config_path!r} not found: eval-task reads the task and classes from the "
            "config.json that `mvit2 train --task ...` writes beside model.keras."
        )
    with open(config_path) as f:
        config = json.load(f)
    model = load_keras_model(args.model, compile=True)
    if config["task"] == "detection":
        from keras_mvit2.tasks.detection import AnchorConfig

        model.anchor_config = AnchorConfig.from_dict(config["anchor_config"])
    val = td.pasted_fashion_mnist(args.val_images, int(model.input_shape[1]), split="val",
                                  seed=args.seed, **_dataset_options(config))
    metrics = _evaluate(model, config["task"], val)
    shown = {k: v for k, v in metrics.items() if k != "confusion_matrix"}
    print(json.dumps(shown, indent=2))
    if args.json_path:
        write_json(args.json_path, metrics)
    return 0


def _profile(args: argparse.Namespace) -> int:
    from keras_mvit2.tasks.paper_tables import paper_comparison

    rows = paper_comparison()
    headers = ("model", "input", "params (ours)", "params (paper)", "diff",
               "GMACs (ours)", "GMACs (paper)", "diff", "GMACs executed")
    table = [
        (r["model"], r["input"], f"{r['params'] / 1e6:.3f} M", f"{r['paper_params_m']} M",
         f"{100 * r['params_rel_diff']:+.2f} %", f"{r['gmacs']:.2f}", f"{r['paper_gmacs']}",
         f"{100 * r['macs_rel_diff']:+.1f} %", f"{r['executed_gmacs']:.2f}")
        for r in rows
    ]
    if args.markdown:
        print_markdown(headers, table)
    else:
        for row in [headers, *table]:
            print("  ".join(f"{c:>14}" for c in row))
    if args.json_path:
        write_json(args.json_path, rows)
    return 0
