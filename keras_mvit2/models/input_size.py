"""One model for any input size, and its fixed-size twin for export.

A model built with `input_shape=(None, None, 3)` runs any image size: its MobileViT
blocks read the patch grid (and whether an odd side needs the reference's
align-corners upsizing) from each call's input. Mobile runtimes want one fixed
graph; `with_input_size` builds it from the same layers and weights.
"""

import keras

#: The size a dynamic model is exported at when neither the caller nor its checkpoint
#: names one (the ImageNet training size of the paper).
DEFAULT_EXPORT_SIZE = 256

# Attributes the builders attach to a model (the pretrained checkpoint it came from),
# carried over to the fixed-size twin.
_CARRIED_ATTRIBUTES = ("_keras_mvit2_weights", "_keras_mvit2_weights_file")


def has_dynamic_size(model: keras.Model) -> bool:
    """Whether the model's (single, image) input has an unknown height or width."""
    inputs = getattr(model, "inputs", None)
    if not inputs or len(inputs) != 1:
        return False
    shape = tuple(inputs[0].shape)
    return len(shape) == 4 and (shape[1] is None or shape[2] is None)


def _as_hw(image_size) -> tuple[int, int]:
    if isinstance(image_size, int) and not isinstance(image_size, bool):
        image_size = (image_size, image_size)
    try:
        height, width = (int(s) for s in image_size)
        ok = all(float(s) == int(s) for s in image_size)
    except (TypeError, ValueError):
        ok = False
    if not ok or height < 1 or width < 1:
        raise ValueError(
            "image_size must be a positive int or a (height, width) pair. "
            f"Received: image_size={image_size!r}"
        )
    return height, width


def default_export_size(model: keras.Model) -> tuple[int, int]:
    """The size to export a dynamic model at: the known sides of its input, the
    checkpoint's size (`weights="imagenet_384"` gives 384) or `DEFAULT_EXPORT_SIZE`."""
    entry = getattr(model, "_keras_mvit2_weights", None)
    size = getattr(entry, "input_size", None) or DEFAULT_EXPORT_SIZE
    height, width = tuple(model.inputs[0].shape)[1:3]
    return (height or size, width or size)


def with_input_size(model: keras.Model, image_size=None) -> keras.Model:
    """The same Functional model with a fixed `(height, width)` input.

    The layers are cloned from their configs (the graph a builder makes with that
    `input_shape`: constant patch grids, a resize only where a side is odd) and the
    weights copied, so both models compute the same function at that size. The model
    itself is returned when its input already has that size.

    Args:
        model: a Functional model with one `(batch, H, W, C)` input; H and W may be
            `None`.
        image_size: an int (square) or `(height, width)`. Defaults to
            `default_export_size(model)`.

    Returns:
        A `keras.Model` whose input is `(batch, height, width, C)`.

    Raises:
        ValueError: `image_size` disagrees with a static side of the model's input,
            or the model is not a one-input image model.

    Example:
    >>> model = keras_mvit2.MobileViTV2(0.5, input_shape=(None, None, 3))
    >>> keras_mvit2.with_input_size(model, (224, 320)).input_shape
    (None, 224, 320, 3)
    """
    shape = _image_input_shape(model, "with_input_size")
    size = default_export_size(model) if image_size is None else _as_hw(image_size)
    for side, (static, wanted) in zip(("height", "width"), zip(shape[1:3], size, strict=True),
                                      strict=True):
        if static is not None and static != wanted:
            raise ValueError(
                f"The model's input {side} is fixed at {static}; it cannot be exported at "
                f"{size[0]}x{size[1]}. Build it with input_shape=(None, None, {shape[3]}) "
                f"to choose the size at export. Received: image_size={image_size!r}"
            )
    if shape[1:3] == size:
        return model
    return _clone_at(model, size)


def with_dynamic_size(model: keras.Model) -> keras.Model:
    """A copy of a MobileViT / MobileViTv2 classifier or backbone that takes any size.

    For a model built for one size (e.g. a trained `.keras`) that is to run at another
    (`mvit2 eval --image-size`): the layers are cloned for `(None, None)` and the
    weights copied. The model itself is returned when it already takes any size.
    Models whose layers hold a size (segmentation and detection heads built for one
    size) are refused: build those with `input_shape=(None, None, 3)` instead.

    Example:
    >>> model = keras_mvit2.MobileViTV2(0.5, input_shape=(256, 256, 3))
    >>> keras_mvit2.models.input_size.with_dynamic_size(model).input_shape
    (None, None, None, 3)
    """
    if _image_input_shape(model, "with_dynamic_size")[1:3] == (None, None):
        return model
    sized = [layer.name for layer in model._flatten_layers(include_self=False)
             if getattr(layer, "size", None) is not None
             or isinstance(layer, keras.layers.Reshape)]
    if sized:
        raise ValueError(
            f"Model {model.name!r} has layers built for its input size ({', '.join(sized[:3])}); "
            "build it with input_shape=(None, None, 3) to run it at any size."
        )
    return _clone_at(model, (None, None))


def _image_input_shape(model: keras.Model, what: str) -> tuple:
    """The shape of `model`'s one `(batch, H, W, C)` input, else a ValueError naming `what`."""
    inputs = getattr(model, "inputs", None)
    if not inputs or len(inputs) != 1 or len(inputs[0].shape) != 4:
        raise ValueError(
            f"{what} needs a model with one (batch, height, width, channels) input. "
            f"Received: model={getattr(model, 'name', model)!r} with inputs "
            f"{[tuple(t.shape) for t in inputs or []]}"
        )
    return tuple(inputs[0].shape)


def _clone_at(model: keras.Model, size: tuple) -> keras.Model:
    """`model`'s layers cloned on a `(batch, *size, C)` input, with copies of its weights."""
    (model_input,) = model.inputs
    shape = tuple(model_input.shape)
    new_input = keras.Input(batch_shape=(shape[0], *size, shape[3]), dtype=model_input.dtype,
                            name=model_input.name)
    twin = keras.models.clone_model(model, input_tensors=new_input)
    twin.set_weights(model.get_weights())
    for attribute in _CARRIED_ATTRIBUTES:
        if hasattr(model, attribute):
            setattr(twin, attribute, getattr(model, attribute))
    return twin
