"""Registry of the attention (token-mixing) layers: `mv.attention.get(name, **kwargs)`.

Every registered layer maps `(batch, tokens, dim)` or the MobileViT layout
`(batch, patches, patch_area, dim)` to the same shape (see `TokenMixer`), so any
of them can replace the attention of any model with one `attention=` argument.

This module imports no layer module: the built-in layers register themselves
(`register`) when `keras_mvit2.layers` is imported, which Python does before it runs
this module. `keras_mvit2` exposes it as `keras_mvit2.attention`.
"""

from collections.abc import Callable

import keras

_REGISTRY: dict[str, type[keras.layers.Layer]] = {}
_ALIASES: dict[str, str] = {}


def register(name: str, *aliases: str) -> Callable[[type], type]:
    """Class decorator: registers an attention layer under `name` (and `aliases`)."""

    def decorator(cls: type) -> type:
        for key in (name, *aliases):
            if key in _REGISTRY or key in _ALIASES:
                raise ValueError(f"Attention name {key!r} is already registered.")
        _REGISTRY[name] = cls
        for alias in aliases:
            _ALIASES[alias] = name
        return cls

    return decorator


def available() -> list[str]:
    """Canonical names of the registered attention layers."""
    return sorted(_REGISTRY)


def canonical_name(name: str) -> str:
    """The canonical registry name of `name` or one of its aliases."""
    key = name.lower().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key not in _REGISTRY:
        raise ValueError(
            f"Unknown attention {name!r}. Available: {available()} "
            f"(aliases: {sorted(_ALIASES)})."
        )
    return key


def get_class(name: str) -> type[keras.layers.Layer]:
    """The layer class registered under `name` (or an alias)."""
    return _REGISTRY[canonical_name(name)]


def get(identifier="separable", **kwargs) -> keras.layers.Layer:
    """A new attention layer from a name, a config dict or a layer.

    - a name or alias, e.g. `get("mha", num_heads=4)`;
    - a dict `{"name": "linformer", "projected_tokens": 64}` (kwargs override it),
      or a Keras serialization dict (`keras.saving.serialize_keras_object(layer)`);
    - a layer instance: a fresh copy built from its config (each transformer layer
      needs its own weights), with `kwargs` applied.
    """
    if isinstance(identifier, keras.layers.Layer):
        config = identifier.get_config()
        config.update(kwargs)
        return type(identifier).from_config(config)
    if isinstance(identifier, dict):
        if "class_name" in identifier:
            layer = keras.saving.deserialize_keras_object(identifier)
            return get(layer, **kwargs) if kwargs else layer
        config = dict(identifier)
        name = config.pop("name", None)
        if name is None:
            raise ValueError(
                "An attention config dict needs a 'name' key, e.g. {'name': 'mha', "
                f"'num_heads': 4}}. Received: {identifier}"
            )
        config.update(kwargs)
        return get(name, **config)
    if isinstance(identifier, str):
        return get_class(identifier)(**kwargs)
    raise ValueError(
        "attention must be a name, a config dict or a Keras layer. "
        f"Received: {identifier!r}"
    )


def int8_float_ops(name: str) -> frozenset[str]:
    """TFLite ops a full-int8 conversion of the attention `name` may leave in float.

    The layer class declares them (`int8_float_ops`, a class attribute; none when it
    does not): ops without an int8 kernel in LiteRT and the QUANTIZE / DEQUANTIZE that
    enter and leave them. `keras_mvit2.export.to_tflite(..., quantization="int8")` then
    needs `allow_float_ops=True` for a model using it.
    """
    return frozenset(getattr(get_class(name), "int8_float_ops", frozenset()))


def names_in(model: keras.Layer) -> list[str]:
    """Canonical names of the registered attention layers inside `model`, sorted.

    E.g. `["separable"]` for `MobileViTV2(...)`, `["mha"]` for
    `MobileViTV2(..., attention="mha")`, `[]` for a model without attention.
    """
    by_class = {cls: name for name, cls in _REGISTRY.items()}
    layers = model._flatten_layers(include_self=False)
    return sorted({by_class[type(layer)] for layer in layers if type(layer) in by_class})


def serialize(identifier):
    """A JSON-friendly form of an `attention=` argument, for `get_config`."""
    if isinstance(identifier, keras.layers.Layer):
        return keras.saving.serialize_keras_object(identifier)
    return identifier
