"""`mvit2 qat` (quantization-aware training on the shipped int8 graph), `mvit2 prune` and
`mvit2 cluster` (TFMOT, in a tf_keras worker process; see `keras_mvit2.quantize`).

These commands only parse arguments, call the library and print the result.
"""

from __future__ import annotations

import argparse
import functools

from keras_mvit2.cli.failure import CommandFailedError
from keras_mvit2.optimizer.qat_settings import QAT_BATCH_SIZE, QAT_LEARNING_RATE
from keras_mvit2.utils.files import atomic_output, write_json


def _common(p: argparse.ArgumentParser, *, lr: float, batch_size: int = 32) -> None:
    p.add_argument("model", help="trained Keras 3 model (.keras)")
    p.add_argument("--data", required=True,
                   help="fine-tuning data: 'fashion_mnist' or a folder of class sub-folders")
    p.add_argument("--validation-data",
                   help="labelled data for the accuracies: 'fashion_mnist' (test split) or a "
                        "folder")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=None,
                   help="batches per epoch (default: the whole data)")
    p.add_argument("--batch-size", type=int, default=batch_size)
    p.add_argument("--lr", type=float, default=lr, help=f"Adam learning rate (default {lr:g})")
    p.add_argument("--json", dest="json_path", help="also write the result to this JSON file")
    p.add_argument("--quiet", action="store_true", help="do not print the progress")


def register(sub) -> None:
    p = sub.add_parser(
        "qat", help="quantization-aware training of the int8 file -> the chosen .tflite",
        description="Trains the weights of the post-training full-int8 file's own graph with "
                    "its rounding, towards the Keras model's answers, on the --data images "
                    "less a share set aside first (--judge-fraction). Both files are then "
                    "judged on images neither trained or calibrated on (the set-aside ones "
                    "and --validation-data): the quantization-aware-trained file is written "
                    "only where McNemar's exact one-sided test gives p < 0.05 that it agrees "
                    "with the Keras model more often, its top-1 there is not lower and "
                    "nothing is lower on --validation-data; else the post-training file is. "
                    "A trained file that agrees no more often is written in at most 5 % of "
                    "runs.",
    )
    _common(p, lr=QAT_LEARNING_RATE, batch_size=QAT_BATCH_SIZE)
    p.add_argument("--output", "-o", default="model_int8.tflite", help="the .tflite to write")
    p.add_argument("--post-training-output",
                   help="also write the post-training int8 file here")
    p.add_argument("--qat-output", help="also write the quantization-aware-trained file here")
    p.add_argument("--io-dtype", choices=("int8", "uint8", "float32"), default="int8")
    p.add_argument("--representative-data",
                   help="calibration images (default: images of --data, never judged on)")
    p.add_argument("--judge-fraction", type=float, default=None, metavar="F",
                   help="share of the --data images set aside (seeded) to judge the two files "
                        "on, never trained on (default: a quarter, "
                        "keras_mvit2.quantize.qat.JUDGE_FRACTION)")
    p.set_defaults(handler=_qat)

    for name, help_text in (
        ("prune", "magnitude pruning (TFMOT) of the conv/dense kernels"),
        ("cluster", "weight clustering (TFMOT) of the conv/dense kernels"),
    ):
        p = sub.add_parser(name, help=help_text, description=help_text + ", on a tf_keras "
                           "twin in a worker process; writes a Keras 3 model.")
        _common(p, lr=1e-4 if name == "prune" else 1e-5)
        p.add_argument("--output", "-o", required=True, help="the Keras 3 .keras model to write")
        p.add_argument("--tflite", help="also export to this .tflite file and check its kernels")
        p.add_argument("--quantization", default="float32",
                       help="quantization of the --tflite export (default float32)")
        p.add_argument("--timeout", type=float, default=None,
                       help="worker time limit (seconds)")
        if name == "prune":
            p.add_argument("--sparsity", type=float, default=0.5, help="target sparsity")
            p.add_argument("--frequency", type=int, default=None,
                           help="steps between mask updates")
        else:
            p.add_argument("--clusters", type=int, default=16, help="values per kernel")
        p.set_defaults(handler=functools.partial(_prune_or_cluster, name))


def _write_json(path: str | None, data) -> None:
    if path:
        write_json(path, data)


def _call_worker(name: str, *args, **kwargs):
    """`keras_mvit2.quantize.<name>(...)`; a failure of its worker is the command's own."""
    from keras_mvit2 import quantize

    try:
        return getattr(quantize, name)(*args, **kwargs)
    except quantize.QuantizationWorkerError as err:
        raise CommandFailedError(str(err)) from None


def _qat(args: argparse.Namespace) -> int:
    from keras_mvit2.quantize import qat

    result = qat(
        args.model, args.data, epochs=args.epochs, steps_per_epoch=args.steps,
        learning_rate=args.lr, batch_size=args.batch_size,
        output_path=args.output, post_training_path=args.post_training_output,
        qat_path=args.qat_output, representative_data=args.representative_data,
        io_dtype=args.io_dtype, validation_data=args.validation_data,
        verbose=not args.quiet,
        **({} if args.judge_fraction is None else {"judge_fraction": args.judge_fraction}),
    )
    report, choice = result.report, result.choice
    kind = "quantization-aware-trained" if result.shipped == "qat" else "post-training"
    print(f"wrote {result.tflite_path} (the {kind} file): {report.size_bytes:,} bytes, "
          f"{report.num_ops} ops, {result.io_dtype} I/O")
    print(f"judged on {choice.num_images} images neither file trained or calibrated on "
          f"({result.judged_on}): agreement with Keras post-training "
          f"{100 * choice.agreement_a:.1f} %, quantization-aware-trained "
          f"{100 * choice.agreement_b:.1f} %; only one of them agrees on {choice.only_a} "
          f"(post-training) and {choice.only_b} (trained) images: exact one-sided paired test "
          f"p = {choice.p_value:.2g}")
    print(f"the {kind} file was written: {result.reason}")
    if result.float_accuracy is not None:
        print(f"top-1 on {result.num_validation} held-out images: Keras "
              f"{result.float_accuracy:.4f}, the file {result.int8_accuracy:.4f} (drop "
              f"{result.accuracy_drop:.2f} points)")
    _write_json(args.json_path, result.to_dict())
    return 0


def _save_and_report(command: str, args, result) -> int:
    with atomic_output(args.output) as tmp:
        result.model.save(tmp)
    stat = "sparsity" if result.method == "prune" else "distinct values"
    values = list(result.kernels.values())
    done = "pruned" if command == "prune" else "clustered"
    print(f"wrote {args.output}: {len(values)} kernels {done}, {stat} "
          f"min {min(values):.3g} / max {max(values):.3g}")
    if result.float_accuracy_before is not None:
        print(f"top-1: before {result.float_accuracy_before:.4f}, "
              f"after {result.float_accuracy_after:.4f}")
    if result.tflite_path:
        key = "sparsity" if result.method == "prune" else "max_unique_per_channel"
        checked = [k for k in result.exported_kernels if k["op"] != "DEPTHWISE_CONV_2D"]
        print(f"wrote {result.tflite_path}: {len(checked)} conv/FC kernels, {key} "
              f"min {min(k[key] for k in checked):.3g} / max {max(k[key] for k in checked):.3g}")
    _write_json(args.json_path, result.to_dict())
    return 0


def _prune_or_cluster(command: str, args: argparse.Namespace) -> int:
    own = ({"target_sparsity": args.sparsity, "frequency": args.frequency}
           if command == "prune" else {"num_clusters": args.clusters})
    result = _call_worker(
        command, args.model, args.data, epochs=args.epochs, steps_per_epoch=args.steps,
        learning_rate=args.lr, batch_size=args.batch_size, output_path=args.tflite,
        quantization=args.quantization, validation_data=args.validation_data,
        verbose=not args.quiet, timeout=args.timeout, **own,
    )
    return _save_and_report(command, args, result)
