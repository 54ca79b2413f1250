"""A pretrained MobileViTv2 to the phone: `mvit2 demo --pretrained` / `run_pretrained_demo`.

Builds a model with published ImageNet weights (`weights="imagenet"`, downloaded once and
cached), exports it to full-integer int8 TFLite calibrated on any folder of photos (the
checkpoint's own evaluation transform, `preprocess_images`) and to a Core ML classifier,
both carrying the 1000 ImageNet class names, then classifies the photos with Keras and
with the int8 file and reports how often the two agree.

```python
from keras_mvit2.pretrained_demo import run_pretrained_demo

result = run_pretrained_demo("mvit2-pretrained", calibration="my_photos/")
print(result.top1_agreement, result.paths["tflite"])
```
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

__all__ = ["IMAGE_EXTENSIONS", "PretrainedDemoResult", "find_images", "run_pretrained_demo"]

#: File endings read as photos (case-insensitive).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff")


@dataclasses.dataclass
class PretrainedDemoResult:
    """What `run_pretrained_demo` wrote and measured.

    Attributes:
        model: registered model name.
        weights: the weights tag.
        num_images: photos used for calibration and for the comparison.
        top1_agreement: fraction of photos where the int8 file's top-1 class is Keras'.
        predictions: per photo, `(path, Keras top-1 name, its probability, int8 top-1
            name)`.
        tflite_size_bytes: size of the int8 `.tflite` file.
        coreml_size_bytes: size of the `.mlpackage` (None: coremltools not installed).
        paths: `tflite`, `coreml`, `summary` -> path (None when not written).
    """

    model: str
    weights: str
    num_images: int
    top1_agreement: float
    predictions: list[tuple[str, str, float, str]]
    tflite_size_bytes: int
    coreml_size_bytes: int | None
    paths: dict[str, str | None]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def find_images(folder: str | os.PathLike, limit: int | None = None) -> list[str]:
    """Image files under `folder` (any depth), sorted; at most `limit`."""
    root = os.fspath(folder)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"Calibration folder not found: {root!r}")
    found = sorted(
        os.path.join(d, f) for d, _, files in os.walk(root) for f in files
        if f.lower().endswith(IMAGE_EXTENSIONS)
    )
    if not found:
        raise ValueError(
            f"No images ({', '.join(IMAGE_EXTENSIONS)}) under {root!r}: int8 calibration "
            "needs photos like those the app will see (a few dozen to a few hundred)."
        )
    return found[:limit] if limit else found


def run_pretrained_demo(
    output_dir: str | os.PathLike,
    calibration: str | os.PathLike,
    *,
    model: str = "mobilevitv2_050",
    weights: str = "imagenet",
    num_images: int = 100,
    coreml: bool = True,
    log: Callable[[str], None] | None = None,
) -> PretrainedDemoResult:
    """Exports a pretrained model to int8 TFLite and Core ML with the ImageNet labels.

    Args:
        output_dir: folder for `model_int8.tflite`, `model.mlpackage`, `summary.json`.
        calibration: a folder of photos (any layout), for the int8 calibration and the
            Keras vs int8 comparison.
        model: registered MobileViTv2 name.
        weights: published tag (`keras_mvit2.list_weights()`).
        num_images: photos used at most (sorted by path).
        coreml: also export Core ML (skipped when coremltools is not installed).
        log: called with one line per step.

    Returns:
        A `PretrainedDemoResult` (also written to `summary.json`, atomically).
    """
    import numpy as np

    from keras_mvit2.demo import coreml_available
    from keras_mvit2.export import get_target
    from keras_mvit2.models import create_model
    from keras_mvit2.models.mobilevitv2.mobilevitv2_builders import imagenet_classes
    from keras_mvit2.preprocessing import preprocess_images
    from keras_mvit2.utils.files import write_json

    log = log or (lambda line: None)
    out = os.path.abspath(os.fspath(output_dir))
    os.makedirs(out, exist_ok=True)
    files = find_images(calibration, num_images)
    log(f"building {model} with weights={weights!r}")
    net = create_model(model, weights=weights)
    images = preprocess_images(files, net)
    names = [name for _, name in imagenet_classes()]

    log(f"exporting int8 TFLite, calibrated on {len(files)} photos")
    paths: dict[str, str | None] = {"tflite": os.path.join(out, "model_int8.tflite"),
                                    "coreml": None, "summary": os.path.join(out, "summary.json")}
    tflite_target = get_target("tflite")
    tflite = tflite_target.convert(net, paths["tflite"], quantization="int8",
                                   calibration_data=images, num_calibration_samples=len(files),
                                   class_names=names)
    coreml_size = None
    if coreml and coreml_available():
        log("exporting Core ML")
        paths["coreml"] = os.path.join(out, "model.mlpackage")
        coreml_size = get_target("coreml").convert(
            net, paths["coreml"], class_names=names).size_bytes

    log("classifying the photos with Keras and with the int8 file")
    keras_probs = net.predict(images, verbose=0)
    int8_probs = tflite_target.run(tflite.path, images)
    keras_top, int8_top = keras_probs.argmax(-1), int8_probs.argmax(-1)
    predictions = [
        (path, names[k], float(keras_probs[i, k]), names[q])
        for i, (path, k, q) in enumerate(zip(files, keras_top, int8_top, strict=True))
    ]
    result = PretrainedDemoResult(
        model=model, weights=weights, num_images=len(files),
        top1_agreement=float(np.mean(keras_top == int8_top)), predictions=predictions,
        tflite_size_bytes=tflite.size_bytes, coreml_size_bytes=coreml_size, paths=paths,
    )
    write_json(paths["summary"], result.to_dict())
    return result
