"""The export step of `finetune_to_phone` on every Keras backend: `export_run_files`.

The phone files are written by TensorFlow's converters (the int8 `.tflite` with its
calibration and quantization-aware training, the Core ML package): on the TensorFlow backend
the step runs here; on JAX and PyTorch, where the model was trained, it runs in a child
process on the TensorFlow backend (``python -m keras_mvit2.ship.export_step JOB``), which
loads the run's `.keras` model (a `.keras` file loads on every backend with the same
outputs), re-reads the folder's splits from the run's config and writes the same files and
records. The parent never imports TensorFlow (beside PyTorch it would crash a convolution);
the child's progress lines are passed on to `log` as they come (the child process runs
through `keras_mvit2.backend.child`, as the TFMOT worker of `keras_mvit2.quantize` does).

The int8 file comes from the TensorFlow road on every backend: it agrees with Keras more
often than the PyTorch road's (docs/int8.md, "Through the PyTorch road").
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from keras_mvit2.backend import keras_backend_name
from keras_mvit2.backend.child import failure_result, run_child, write_result

__all__ = ["MAX_VALIDATION_IMAGES", "ExportOptions", "export_run_files"]

#: Held-out images used at most to validate the exports.
MAX_VALIDATION_IMAGES = 2000
#: Exceptions of the child re-raised as themselves (the command line's bad-input errors).
_PASSED_ON = ("ValueError", "FileNotFoundError", "ImportError", "OSError")


@dataclasses.dataclass(frozen=True)
class ExportOptions:
    """What the export step writes and how (`finetune_to_phone`'s arguments of the same
    names; the QAT ones as `keras_mvit2.optimizer.qat_settings.qat_settings` takes them)."""

    targets: tuple[str, ...]
    io_dtype: str
    num_calibration: int
    bench_runs: int
    max_drop: float | None
    qat_steps: int
    qat_learning_rate: float
    qat_epochs: int


def export_run_files(config: Any, model_path: str, run_dir: str, options: ExportOptions,
                     log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Writes, validates and times the run's phone files (`_export_phone_files`) from its
    saved Keras model, on the TensorFlow backend wherever Keras runs.

    Args:
        config: the run's `TrainConfig` (its image folder and split give the calibration
            and held-out images).
        model_path: the `.keras` model to export (the run's EMA or last model).
        run_dir: the run folder (`phone/` is written there).
        options: the targets, I/O type, calibration, timing and QAT options.
        log: called with progress lines (None: quiet).

    Returns:
        The records of `_export_phone_files` (JSON values).

    Raises:
        ValueError, FileNotFoundError, ImportError, OSError: bad input, raised in the child
            (off TensorFlow) and passed on with its message.
        RuntimeError: the child failed otherwise (its last traceback lines are said).
    """
    if keras_backend_name() == "tensorflow":
        return _export_here(config.to_dict(), model_path, run_dir, options, log)
    return _export_in_child(config.to_dict(), model_path, run_dir,
                            dataclasses.asdict(options), log)


def _export_here(config: dict[str, Any], model_path: str, run_dir: str,
                 options: ExportOptions, log: Callable[[str], None] | None
                 ) -> list[dict[str, Any]]:
    import keras

    from keras_mvit2 import training
    from keras_mvit2.optimizer.qat_settings import qat_settings
    from keras_mvit2.ship.data_check import check_training_data
    from keras_mvit2.ship.phone_files import _export_phone_files

    run_config = training.load_config(config)
    checked, train_source, val_source = check_training_data(run_config)
    qat = qat_settings(train_source, steps=options.qat_steps,
                       learning_rate=options.qat_learning_rate,
                       epochs=options.qat_epochs, crop_ratio=run_config.data.crop_ratio,
                       verbose=log is not None)
    model = keras.saving.load_model(model_path, compile=False)
    size = int(model.input_shape[1])
    data = _phone_data(run_config, train_source, val_source, size, options.num_calibration)
    return _export_phone_files(model, run_dir, data, class_names=checked.class_names,
                               targets=options.targets, io_dtype=options.io_dtype,
                               bench_runs=options.bench_runs, max_drop=options.max_drop,
                               qat=qat, log=log or (lambda line: None))


def _phone_data(config: Any, train_source: Any, val_source: Any, size: int,
                num_calibration: int) -> Any:
    from keras_mvit2.export.calibration import load_labelled_images
    from keras_mvit2.ship.phone_files import PhoneData

    crop = config.data.crop_ratio
    calibration = load_labelled_images(train_source, image_size=(size, size),
                                       limit=num_calibration, shuffle=True,
                                       crop_ratio=crop).images
    if val_source is None:
        return PhoneData(calibration, None, None)
    held = load_labelled_images(val_source, image_size=(size, size), shuffle=False,
                                limit=MAX_VALIDATION_IMAGES, crop_ratio=crop)
    return PhoneData(calibration, held.images, held.labels)


def _export_in_child(config: dict[str, Any], model_path: str, run_dir: str,
                     options: dict[str, Any], log: Callable[[str], None] | None
                     ) -> list[dict[str, Any]]:
    say = log or (lambda line: None)
    say(f"exporting on Keras' TensorFlow backend (a child process; Keras runs on "
        f"{keras_backend_name()!r} here)")
    with tempfile.TemporaryDirectory(prefix="mvit2_export_") as work:
        run = run_child(
            [sys.executable, "-u", "-m", "keras_mvit2.ship.export_step"],
            {"config": config, "model_path": os.path.abspath(model_path),
             "run_dir": os.path.abspath(run_dir), "options": options,
             "verbose": log is not None},
            work, result_key="result", env={**os.environ, "KERAS_BACKEND": "tensorflow"},
            on_line=say, merge_stderr=False, tail_lines=15)
    if run.result is not None and run.result["ok"]:
        return run.result["records"]
    run.raise_passed_on(_PASSED_ON)
    outcome = run.result
    what = (f"{outcome['type']}: {outcome['message']}\n{outcome['traceback']}"
            if outcome is not None else f"exit status {run.returncode}\n{run.tail.strip()}")
    raise RuntimeError("The export step failed in its TensorFlow process "
                       f"(python -m keras_mvit2.ship.export_step): {what}")


def _child_main(job_path: str) -> int:
    """The child: runs `_export_here` for the job and writes its result file."""
    with open(job_path) as f:
        job = json.load(f)
    if not job["verbose"]:
        from keras_mvit2.utils.quiet import quiet_libraries

        quiet_libraries()
    try:
        records = _export_here(job["config"], job["model_path"], job["run_dir"],
                               ExportOptions(**job["options"]),
                               (lambda line: print(line, flush=True)) if job["verbose"]
                               else None)
        outcome: dict[str, Any] = {"ok": True, "records": records}
    except Exception as err:  # reported to the parent, which raises it
        outcome = failure_result(err, traceback_lines=12)
    write_result(job["result"], outcome)
    return 0 if outcome["ok"] else 1


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1]))
