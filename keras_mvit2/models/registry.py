"""Model registry: `create_model(name, **kwargs)`, `list_models(pattern)`, `register_model`."""

import fnmatch
from collections.abc import Callable

import keras

_MODEL_BUILDERS: dict[str, Callable[..., keras.Model]] = {}


def register_model(builder: Callable[..., keras.Model]) -> Callable[..., keras.Model]:
    """Decorator: registers `builder` under its function name."""
    name = builder.__name__
    if name in _MODEL_BUILDERS:
        raise ValueError(f"A model named {name!r} is already registered.")
    _MODEL_BUILDERS[name] = builder
    return builder


def register_builder(name: str, build: Callable[..., keras.Model],
                     doc: str) -> Callable[..., keras.Model]:
    """Registers a builder `name` that calls `build(name=name, **kwargs)` (a given `name`
    wins), documented by `doc`."""

    def builder(**kwargs) -> keras.Model:
        kwargs.setdefault("name", name)
        return build(**kwargs)

    builder.__name__ = builder.__qualname__ = name
    builder.__doc__ = doc
    return register_model(builder)


def list_models(pattern: str = "*") -> list[str]:
    """Registered model names matching a shell-style `pattern`, sorted."""
    return sorted(n for n in _MODEL_BUILDERS if fnmatch.fnmatch(n, pattern))


def create_model(name: str, **kwargs) -> keras.Model:
    """Builds the registered model `name`; `kwargs` go to its builder.

    Example: `create_model("mobilevitv2_050", weights="mobilevitv2-0.5.pt")`.
    """
    if name not in _MODEL_BUILDERS:
        close = fnmatch.filter(_MODEL_BUILDERS, f"*{name.split('_')[0]}*")
        hint = f" Did you mean one of {sorted(close)}?" if close else ""
        raise ValueError(
            f"Unknown model {name!r}.{hint} `keras_mvit2.list_models()` lists them all."
        )
    return _MODEL_BUILDERS[name](**kwargs)
