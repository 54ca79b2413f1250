"""The static page folder: an exported `.tflite`, the page and the browser runtime.

`build_site` lays out a folder that any static host serves as it is (and `mvit2 web`
serves on 127.0.0.1)::

    index.html, app.js, style.css     the page (keras_mvit2/export/web/static/)
    mediapipe/                        @mediapipe/tasks-vision's module and WebAssembly
    model.tflite                      the exported file
    config.json                       what the page reads: model file, task, input size,
                                      class names, quantization, runtime, images
    images/                           optional example images the page lists
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from typing import Any

from keras_mvit2.export.web.runtime import TASKS_VISION_VERSION, runtime_dir
from keras_mvit2.utils.files import atomic_output, write_json

__all__ = ["IMAGE_SUFFIXES", "MODEL_FILE", "STATIC_DIR", "build_site", "model_info"]

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
MODEL_FILE = "model.tflite"
#: Image files a browser decodes (the ones `--images` lists).
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp")


def model_info(path: str | os.PathLike) -> dict[str, Any]:
    """What the page needs to know of a `.tflite`: its ``task`` (``"classifier"``,
    ``"segmenter"`` or ``"detector"``, ending in ``TFLite_Detection_PostProcess``, as
    `task_of_outputs` reads the outputs), ``input_size`` [H, W], ``class_names`` and
    ``quantization`` from its metadata.

    Raises:
        ValueError: the file is not an RGB image model MediaPipe can load (no standard
            metadata, or another output layout), with what to export instead.
    """
    from keras_mvit2.export.tflite import inspect_tflite, read_tflite_metadata
    from keras_mvit2.export.tflite.standard_metadata import task_of_outputs

    path = os.fspath(path)
    if not os.path.isfile(path) or not path.endswith(".tflite"):
        raise FileNotFoundError(f"Not a .tflite file: {path!r} (export one with `mvit2 export "
                                "-o model.tflite`).")
    report = inspect_tflite(path)
    meta = read_tflite_metadata(path) or {}
    if not meta.get("tflite_metadata"):
        raise ValueError(
            f"{path} has no standard TFLite metadata (image normalization, labels), which "
            "MediaPipe Tasks needs: export it again with keras_mvit2 (`mvit2 export`), "
            "which writes it for RGB image models."
        )
    shape = list(report.inputs[0].shape)
    if len(shape) != 4 or shape[-1] != 3:
        raise ValueError(f"{path} takes input {shape}; the page runs RGB image models "
                         "(1, H, W, 3).")
    outputs = [list(t.shape) for t in report.outputs]
    task = {"classifier": "classifier", "segmenter": "segmenter",
            "detector_postprocessed": "detector"}.get(task_of_outputs(outputs))
    if task is None:
        raise ValueError(
            f"{path} has outputs {outputs}: the page runs classifiers (1, C), segmenters "
            "(1, H, W, C) and detectors ending in TFLite_Detection_PostProcess "
            "(export a detector through `with_detection_postprocess`)."
        )
    return {"task": task, "input_size": shape[1:3], "class_names": meta.get("class_names"),
            "quantization": meta.get("quantization"),
            "input_dtype": str(report.inputs[0].dtype)}


def _copy(source: str, dest: str, link: bool) -> None:
    if link:
        os.symlink(os.path.abspath(source), dest)
    else:
        shutil.copyfile(source, dest)


def build_site(model: str | os.PathLike, folder: str | os.PathLike, *,
               images: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
               link: bool = False) -> dict[str, Any]:
    """Writes the page folder for the `.tflite` file `model` (atomically) and returns its
    ``config.json`` content.

    Args:
        model: the exported `.tflite` (classifier, segmenter or detector, with the
            standard metadata keras_mvit2 writes).
        folder: the folder to write (replaced if it exists).
        images: a folder of images, or image files, the page lists to click through.
        link: symlink the model, runtime and images instead of copying them (a folder
            served from this machine only, as `mvit2 web` does).

    Raises:
        RuntimeMissingError: the browser runtime is not installed (`install_runtime`).
    """
    info = model_info(model)
    runtime = runtime_dir()
    files = _image_files(images)
    config = {"model": MODEL_FILE, "model_name": os.path.basename(os.fspath(model)), **info,
              "runtime": f"@mediapipe/tasks-vision {TASKS_VISION_VERSION}",
              "images": [f"images/{i:04d}_{os.path.basename(p)}" for i, p in enumerate(files)]}
    with atomic_output(folder) as tmp:
        os.makedirs(os.path.join(tmp, "mediapipe"))
        for name in os.listdir(STATIC_DIR):
            shutil.copyfile(os.path.join(STATIC_DIR, name), os.path.join(tmp, name))
        for name in os.listdir(runtime):
            _copy(os.path.join(runtime, name), os.path.join(tmp, "mediapipe", name), link)
        _copy(os.fspath(model), os.path.join(tmp, MODEL_FILE), link)
        if files:
            os.makedirs(os.path.join(tmp, "images"))
        for path, url in zip(files, config["images"], strict=True):
            _copy(path, os.path.join(tmp, url), link)
        write_json(os.path.join(tmp, "config.json"), config)
    return config


def _image_files(images: Any) -> list[str]:
    if images is None:
        return []
    if isinstance(images, (str, os.PathLike)):
        folder = os.fspath(images)
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"--images must be a folder of images. Received: {folder!r}")
        files = sorted(os.path.join(root, name) for root, _, names in os.walk(folder)
                       for name in names if name.lower().endswith(IMAGE_SUFFIXES))
        if not files:
            raise ValueError(f"No images ({', '.join(IMAGE_SUFFIXES)}) in {folder!r}.")
        return files
    files = [os.fspath(p) for p in images]
    missing = [p for p in files if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(f"Image files not found: {missing[:5]}")
    return files
