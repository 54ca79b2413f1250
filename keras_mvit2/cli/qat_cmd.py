"""`mvit2 qat`, `mvit2 prune` and `mvit2 cluster`: TFMOT on a trained Keras 3 model.

The TFMOT work runs in a tf_keras worker process (see `keras_mvit2.quantize`);
these commands only parse arguments, call the library and print the result.
"""

from __future__ import annotations

import argparse
import functools

from keras_mvit2.cli.failure import CommandFailedError
from keras_mvit2.utils.files import atomic_output, write_json


def _common(p: argparse.ArgumentParser, *, lr: float) -> None:
    p.add_argument("model", help="trained Keras 3 model (.keras)")
    p.add_argument("--data", required=True,
                   help="fine-tuning data: 'fashion_mnist' or a folder of class sub-folders")
    p.add_argument("--validation-data",
                   help="labelled data for the accuracies: 'fashion_mnist' (test split) or a "
                        "folder")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=None,
                   help="batches per epoch (default: the whole data)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=lr, help=f"Adam learning rate (default {lr:g})")
    p.add_argument("--json", dest="json_path", help="also write the result to this JSON file")
    p.add_argument("--quiet", action="store_true", help="do not stream the worker's progress")
    p.add_argument("--timeout", type=float, default=None, help="worker time limit (seconds)")


def register(sub) -> None:
    p = sub.add_parser(
        "qat", help="quantization-aware training (TFMOT) -> full-integer .tflite",
        description="Fine-tunes a trained Keras 3 model with simulated int8 quantization "
                    "(TFMOT, on a tf_keras twin in a worker process) and exports a "
                    "full-integer TFLite model.",
    )
    _common(p, lr=1e-4)
    p.add_argument("--output", "-o", default="model_int8.tflite", help="the .tflite to write")
    p.add_argument("--io-dtype", choices=("int8", "uint8", "float32"), default="int8")
    p.add_argument("--representative-data",
                   help="calibration images (default: images of --data)")
    p.add_argument("--calibration-steps", type=int, default=16)
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
    result = _call_worker(
        "qat", args.model, args.data, epochs=args.epochs, steps_per_epoch=args.steps,
        learning_rate=args.lr, output_path=args.output,
        representative_data=args.representative_data, io_dtype=args.io_dtype,
        validation_data=args.validation_data, batch_size=args.batch_size,
        calibration_steps=args.calibration_steps, verbose=not args.quiet,
        timeout=args.timeout,
    )
    report = result.report
    print(f"wrote {result.tflite_path}: {report.size_bytes:,} bytes, {report.num_ops} ops, "
          f"{result.io_dtype} I/O, float ops: {result.float_ops or 'none'}")
    if result.float_accuracy is not None:
        print(f"top-1 on {result.num_validation} images: float {result.float_accuracy:.4f}, "
              f"QAT (fake-quant) {result.qat_accuracy:.4f}, int8 TFLite "
              f"{result.int8_accuracy:.4f} (drop {result.accuracy_drop:.2f} points)")
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
