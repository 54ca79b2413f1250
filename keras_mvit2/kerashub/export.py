"""A KerasHub MobileViTv2 classifier as one plain Keras model, for
`keras_mvit2.export.to_tflite` / `to_coreml`: with its preprocessing or without."""

from __future__ import annotations

import keras

from keras_mvit2.layers.eval_resize_crop import EvalResizeCrop


def inference_model(
    classifier,
    *,
    include_preprocessing: bool = True,
    input_shape: tuple[int, int, int] | None = None,
    interpolation: str | None = None,
    antialias: bool | None = None,
    rescale: bool = True,
) -> keras.Model:
    """`classifier` as a `keras.Model` to export, with or without its preprocessing.

    Without preprocessing it takes what the network takes (`(size, size, 3)` RGB in
    [0, 1]); the app resizes and center-crops. With preprocessing it takes raw RGB
    images of one fixed `input_shape` in [0, 255] and applies the converter's
    resize-shorter-side + center crop (+ the division by 255 unless `rescale=False`).

    Runtimes: TFLite has no builtin op for antialiased or bicubic resizing; for a
    TFLite file with preprocessing pass `interpolation="bilinear", antialias=False`
    (RESIZE_BILINEAR; close to, not equal to, the checkpoints' bicubic transform).
    Core ML's image input already divides by 255 (`to_coreml(image_input=True)`), so
    pass `rescale=False` there.

    Args:
        classifier: a `MobileViTV2ImageClassifier` (any KerasHub image classifier
            whose preprocessor has a `MobileViTV2ImageConverter`, for preprocessing).
        include_preprocessing: put the converter's resize and crop in the model.
        input_shape: the raw images' `(height, width, 3)` (required with
            preprocessing: exported graphs have a fixed input).
        interpolation, antialias: override the converter's resize (see above).
        rescale: divide by 255 inside the model.

    Returns:
        A functional `keras.Model` sharing `classifier`'s weights.
    """
    if not include_preprocessing:
        inputs = keras.Input(shape=classifier.input_shape[1:], name="image")
        return keras.Model(inputs, classifier(inputs), name=f"{classifier.name}_inference")
    converter = getattr(getattr(classifier, "preprocessor", None), "image_converter", None)
    if converter is None or not hasattr(converter, "crop_pct"):
        raise ValueError(
            "include_preprocessing=True needs a classifier whose preprocessor has a "
            "MobileViTV2ImageConverter. Received: preprocessor="
            f"{getattr(classifier, 'preprocessor', None)!r}"
        )
    if input_shape is None or len(input_shape) != 3 or None in tuple(input_shape):
        raise ValueError(
            "include_preprocessing=True needs the fixed shape of the raw images, e.g. "
            f"input_shape=(480, 640, 3). Received: input_shape={input_shape}"
        )
    if converter.offset is not None or converter.scale not in (1.0 / 255.0,):
        raise ValueError(
            "inference_model reproduces a converter with scale=1/255 and no offset (the "
            f"checkpoints'). Received: scale={converter.scale}, offset={converter.offset}"
        )
    inputs = keras.Input(shape=tuple(input_shape), name="photo")
    x = EvalResizeCrop(
        int(converter.image_size[0]), converter.crop_pct,
        interpolation=interpolation or converter.interpolation,
        antialias=converter.antialias if antialias is None else antialias,
        scale=rescale, name="eval_resize_crop",
    )(inputs)
    return keras.Model(inputs, classifier(x), name=f"{classifier.name}_inference")
