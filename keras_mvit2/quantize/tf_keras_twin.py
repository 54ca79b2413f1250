"""The tf_keras twin of a Keras 3 model, built from the same keras_mvit2 layer code.

TensorFlow Model Optimization (TFMOT 0.8) only accepts tf_keras (Keras 2) models,
and importing it flips ``tf.keras`` to tf_keras for the whole process. So the
quantization-aware training, pruning and clustering of `keras_mvit2.quantize` run
in a separate worker process that builds a *twin* of the user's Keras 3 model:

1. `install_keras_shim()` puts a module named ``keras`` into ``sys.modules``
   before anything imports Keras 3. It exposes tf_keras (layers, initializers,
   saving, ...), a small ``keras.ops`` that maps the ``keras.ops`` functions our
   layers call to the TensorFlow functions Keras 3 itself uses on the TensorFlow
   backend, and a ``keras.layers.Layer`` base that papers over the three
   differences that matter here:

   - Keras 3 marks a layer built when its ``build()`` returns (also when a parent
     calls ``child.build(shape)`` explicitly); tf_keras does not, and would build
     the child a second time on its first call. The base marks it built.
   - tf_keras names a variable after the name scope it is created in, and a
     sublayer built explicitly inside its parent's ``build()`` would get the
     parent's scope (duplicate names such as ``attn/kernel:0`` for both
     projections). The base builds each sublayer assigned to an attribute in
     ``tf.name_scope(sublayer.name)``, so the twin's variables get the same paths
     as Keras 3's (``stage2_block1/transformer_0/attn/qkv_proj/kernel``).
   - ``add_weight(autocast=...)`` is ``experimental_autocast`` in tf_keras.

2. ``import keras_mvit2`` then runs the *same source files* as in the user's
   process; the layer classes subclass ``tf_keras.layers.Layer``.
3. `build_twin(config)` replays the Keras 3 functional (or Sequential) config
   layer by layer: Keras built-in layers become their tf_keras classes,
   keras_mvit2 layers are instantiated from their registered names with the same
   config.
4. `twin_transfer.transfer_weights` copies the weights by variable path (one-to-one, shapes
   checked; tf_keras' ``depthwise_kernel`` is Keras 3's ``kernel``). The worker
   then checks the twin's float outputs against the Keras 3 outputs on real
   images before anything else runs.

This module imports neither keras nor tensorflow at import time: it is imported
in the user's (Keras 3) process too, and by file path in the worker before the
shim exists.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import os
import re
import sys
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass

#: Attribute set on the shim module, so a second install is a no-op.
SHIM_MARKER = "__keras_mvit2_tf_keras_shim__"

#: Keyword arguments every tf_keras Layer accepts besides its own.
_BASE_LAYER_KWARGS = frozenset(
    {"name", "trainable", "dtype", "dynamic", "input_dim", "input_shape",
     "batch_input_shape", "batch_size", "weights", "activity_regularizer", "autocast",
     "implementation"}
)


class TwinError(ValueError):
    """The model cannot be rebuilt as a tf_keras twin (the message names the layer)."""


# --------------------------------------------------------------------------------------
# The `keras` shim


def _ops_namespace(tf) -> types.ModuleType:
    """The ``keras.ops`` functions keras_mvit2's layers use, on TensorFlow.

    Each maps to the TensorFlow function that Keras 3's TensorFlow backend calls
    for it, so the twin computes the same graph (up to float rounding).
    """
    ops = types.ModuleType("keras.ops")

    def _axis(axis):
        return list(axis) if isinstance(axis, tuple) else axis

    def cast(x, dtype):
        return tf.cast(x, dtype)

    def convert_to_tensor(x, dtype=None, sparse=None):
        return tf.convert_to_tensor(x, dtype=dtype)

    def split(x, indices_or_sections, axis=0):
        if isinstance(indices_or_sections, int):
            return tf.split(x, indices_or_sections, axis=axis)
        bounds = [0, *indices_or_sections, x.shape[axis]]
        return tf.split(x, [b - a for a, b in itertools.pairwise(bounds)],
                        axis=axis)

    def pad(x, pad_width, mode="constant", constant_values=None):
        kwargs = {} if constant_values is None else {"constant_values": constant_values}
        return tf.pad(x, pad_width, mode=mode.upper(), **kwargs)

    def shape(x):
        static = x.shape.as_list() if hasattr(x.shape, "as_list") else list(x.shape)
        if None not in static:
            return tuple(static)
        dynamic = tf.shape(x)
        return tuple(dynamic[i] if d is None else d for i, d in enumerate(static))

    def conv(inputs, kernel, strides=1, padding="valid", data_format=None, dilation_rate=1):
        if data_format not in (None, "channels_last"):
            raise ValueError("the tf_keras twin supports channels_last convolutions only")
        return tf.nn.convolution(inputs, kernel, strides=strides, padding=padding.upper(),
                                 dilations=dilation_rate)

    def softmax(x, axis=-1):
        return tf.nn.softmax(x, axis=axis)

    def take(x, indices, axis=None):
        if axis is None:
            return tf.gather(tf.reshape(x, [-1]), indices)
        return tf.gather(x, indices, axis=axis)

    def while_loop(cond, body, loop_vars, maximum_iterations=None):
        is_tuple = isinstance(loop_vars, list | tuple)
        loop_vars = tuple(loop_vars) if is_tuple else (loop_vars,)

        def _body(*args):
            out = body(*args)
            return tuple(out) if isinstance(out, list | tuple) else (out,)

        out = tf.while_loop(cond, _body, loop_vars, maximum_iterations=maximum_iterations)
        return tuple(out) if is_tuple else out[0]

    table = {
        "abs": tf.abs,
        "add": tf.add,
        "arange": lambda start, stop=None, step=1, dtype=None: tf.range(
            start, stop, step, dtype=dtype or "int32"),
        "broadcast_to": tf.broadcast_to,
        "cast": cast,
        "clip": lambda x, a, b: tf.clip_by_value(x, a, b),
        "concatenate": lambda xs, axis=0: tf.concat(list(xs), axis=axis),
        "conv": conv,
        "convert_to_tensor": convert_to_tensor,
        "cos": tf.cos,
        "cumsum": lambda x, axis=None, dtype=None: tf.cumsum(x, axis=0 if axis is None else axis),
        "erf": tf.math.erf,
        "exp": tf.exp,
        "expand_dims": lambda x, axis: tf.expand_dims(x, axis),
        "eye": lambda n, m=None, dtype="float32": tf.eye(n, m, dtype=dtype),
        "floor": tf.floor,
        "matmul": tf.matmul,
        "max": lambda x, axis=None, keepdims=False: tf.reduce_max(
            x, axis=_axis(axis), keepdims=keepdims),
        "maximum": tf.maximum,
        "multiply": tf.multiply,
        "mean": lambda x, axis=None, keepdims=False: tf.reduce_mean(
            x, axis=_axis(axis), keepdims=keepdims),
        "ones": lambda shape, dtype="float32": tf.ones(shape, dtype=dtype),
        "pad": pad,
        "relu": tf.nn.relu,
        "reshape": lambda x, newshape: tf.reshape(x, newshape),
        "rsqrt": tf.math.rsqrt,
        "shape": shape,
        "sigmoid": tf.sigmoid,
        "silu": tf.nn.silu,
        "sin": tf.sin,
        "softmax": softmax,
        "split": split,
        "sqrt": tf.sqrt,
        "square": tf.square,
        "squeeze": lambda x, axis=None: tf.squeeze(x, axis=axis),
        "sum": lambda x, axis=None, keepdims=False: tf.reduce_sum(
            x, axis=_axis(axis), keepdims=keepdims),
        "take": take,
        "transpose": lambda x, axes=None: tf.transpose(x, perm=axes),
        "while_loop": while_loop,
        "zeros": lambda shape, dtype="float32": tf.zeros(shape, dtype=dtype),
        "zeros_like": lambda x, dtype=None: tf.zeros_like(x, dtype=dtype),
    }
    for name, fn in table.items():
        # Plain TF calls: AutoGraph has nothing to convert (and cannot find their module).
        setattr(ops, name, tf.autograph.experimental.do_not_convert(fn))

    def _missing(name):
        raise AttributeError(
            f"keras.ops.{name} is not mapped in the tf_keras twin shim "
            "(keras_mvit2/quantize/tf_keras_twin.py, `_ops_namespace`). A layer uses it; add "
            "the TensorFlow equivalent there."
        )

    ops.__getattr__ = _missing
    return ops


def _scope_matches(scope: str, name: str) -> bool:
    last = scope.rstrip("/").rsplit("/", 1)[-1]
    return re.fullmatch(re.escape(name) + r"(_\d+)?", last) is not None


def _scoped_build(tf, layer) -> None:
    """Makes an explicit ``layer.build(shape)`` create its variables under ``layer.name``."""
    if getattr(layer, "_mvit2_scoped_build", False) or layer.built:
        return
    original = layer.build

    @functools.wraps(original)
    def build(input_shape):
        if _scope_matches(tf.get_current_name_scope(), layer.name):
            return original(input_shape)       # called from layer.__call__: already scoped
        with tf.name_scope(layer.name):
            return original(input_shape)

    object.__setattr__(layer, "build", build)
    object.__setattr__(layer, "_mvit2_scoped_build", True)


def _make_layer_base(tf, tf_keras) -> type:
    base = tf_keras.layers.Layer

    class Layer(base):
        """tf_keras Layer with the Keras 3 behaviour keras_mvit2's layers rely on."""

        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)
            if "build" in cls.__dict__:
                original = cls.__dict__["build"]

                @functools.wraps(original)
                def build(self, input_shape, _original=original):
                    result = _original(self, input_shape)
                    self.built = True          # as Keras 3 does after build()
                    return result

                cls.build = build

        def __setattr__(self, name, value):
            if not name.startswith("_"):
                items = value if isinstance(value, list | tuple) else (value,)
                for item in items:
                    if isinstance(item, base):
                        _scoped_build(tf, item)
            super().__setattr__(name, value)

        def add_weight(self, *args, autocast=None, **kwargs):
            if autocast is not None:
                kwargs["experimental_autocast"] = autocast
            kwargs.pop("overwrite_with_gradient", None)
            return super().add_weight(*args, **kwargs)

    Layer.__module__ = "keras.layers"
    Layer.__qualname__ = "Layer"
    return Layer


def _keras3_only_layer(name: str) -> type:
    """A placeholder for a Keras 3 layer class that tf_keras lacks (e.g. ``CutMix``).

    Modules that subclass such a class at import time still import in the worker;
    building one is an error that names it.
    """
    if name.startswith("__"):
        raise AttributeError(name)

    def unavailable(self, *args, **kwargs):
        raise TypeError(
            f"keras.layers.{name} exists only in Keras 3; the tf_keras twin used by "
            "keras_mvit2.quantize cannot build it. Remove it from the model (augmentation "
            "layers are no-ops at inference) before quantization-aware training."
        )

    return type(name, (), {"__init__": unavailable, "__module__": "keras.layers"})


class _SeedGenerator:
    """`keras.random.SeedGenerator` stand-in: the twin never trains RFA's pool draws."""

    def __init__(self, seed=None, **kwargs):
        self.seed = seed


def install_keras_shim() -> types.ModuleType:
    """Makes ``import keras`` give tf_keras plus the ``keras.ops`` our layers use.

    Must run before Keras 3 is imported in this process (it is meant for the
    worker process of `keras_mvit2.quantize`). Sets ``TF_USE_LEGACY_KERAS=1`` so
    that ``tf.keras`` is tf_keras too. Returns the shim module.

    Raises:
        RuntimeError: Keras 3 was already imported in this process.
    """
    existing = sys.modules.get("keras")
    if existing is not None:
        if getattr(existing, SHIM_MARKER, False):
            return existing
        raise RuntimeError(
            "Keras 3 is already imported in this process, so keras_mvit2 cannot be loaded on "
            "tf_keras here. The tf_keras twin is built in a separate worker process; call "
            "keras_mvit2.quantize.prune / cluster, which start it for you."
        )
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf
    import tf_keras

    shim = types.ModuleType("keras")
    shim.__dict__[SHIM_MARKER] = True
    shim.__version__ = tf_keras.__version__
    shim.__path__ = []  # a package, so `import keras.ops` resolves through sys.modules

    layers = types.ModuleType("keras.layers")
    layers.__dict__.update(
        {k: v for k, v in vars(tf_keras.layers).items() if not k.startswith("__")}
    )
    layers.Layer = _make_layer_base(tf, tf_keras)
    layers.InputSpec = tf_keras.layers.InputSpec
    layers.__getattr__ = _keras3_only_layer

    ops = _ops_namespace(tf)

    saving = types.ModuleType("keras.saving")
    saving.register_keras_serializable = tf_keras.saving.register_keras_serializable
    saving.serialize_keras_object = tf_keras.saving.serialize_keras_object
    saving.deserialize_keras_object = tf_keras.saving.deserialize_keras_object
    saving.get_registered_object = tf_keras.saving.get_registered_object
    saving.load_model = tf_keras.models.load_model

    config = types.ModuleType("keras.config")
    config.image_data_format = tf_keras.backend.image_data_format
    config.set_image_data_format = tf_keras.backend.set_image_data_format
    config.floatx = tf_keras.backend.floatx
    config.backend = lambda: "tensorflow"

    backend = types.ModuleType("keras.backend")
    backend.__dict__.update(
        {k: v for k, v in vars(tf_keras.backend).items() if not k.startswith("__")}
    )
    backend.is_keras_tensor = tf_keras.backend.is_keras_tensor
    backend.standardize_dtype = lambda dtype: tf.as_dtype(dtype).name
    backend.backend = lambda: "tensorflow"

    utils = types.ModuleType("keras.utils")
    utils.__dict__.update({k: v for k, v in vars(tf_keras.utils).items() if not k.startswith("__")})
    if not hasattr(utils, "get_source_inputs"):
        from tf_keras.src.utils.layer_utils import get_source_inputs

        utils.get_source_inputs = get_source_inputs

    random = types.ModuleType("keras.random")
    random.SeedGenerator = _SeedGenerator
    random.shuffle = lambda x, axis=0, seed=None: tf.random.shuffle(x)
    random.normal = lambda shape, mean=0.0, stddev=1.0, dtype="float32", seed=None: (
        tf.random.normal(shape, mean, stddev, dtype=dtype))
    random.uniform = lambda shape, minval=0.0, maxval=1.0, dtype="float32", seed=None: (
        tf.random.uniform(shape, minval, maxval, dtype=dtype))

    submodules = {
        "layers": layers, "ops": ops, "saving": saving, "config": config, "backend": backend,
        "utils": utils, "random": random, "initializers": tf_keras.initializers,
        "activations": tf_keras.activations, "regularizers": tf_keras.regularizers,
        "constraints": tf_keras.constraints, "models": tf_keras.models,
        "optimizers": tf_keras.optimizers, "losses": tf_keras.losses,
        "metrics": tf_keras.metrics, "callbacks": tf_keras.callbacks,
        "applications": tf_keras.applications,
    }
    for name, module in submodules.items():
        setattr(shim, name, module)
        sys.modules[f"keras.{name}"] = module
    shim.Model = tf_keras.Model
    shim.Sequential = tf_keras.Sequential
    shim.Input = tf_keras.Input
    shim.InputSpec = tf_keras.layers.InputSpec
    shim.Layer = layers.Layer
    shim.__getattr__ = lambda name: getattr(tf_keras, name)
    sys.modules["keras"] = shim
    return shim


# --------------------------------------------------------------------------------------
# Model spec (written in the Keras 3 process) and twin construction (in the worker)


def model_spec(model) -> dict[str, Any]:
    """What the worker needs to rebuild `model` (Keras 3): class, config, I/O shape.

    Only Functional and Sequential models can be rebuilt; the error for anything
    else says so.
    """
    import keras

    if isinstance(model, keras.Sequential):
        kind = "Sequential"
    elif type(model).__name__ == "Functional" or (
        isinstance(model, keras.Model) and getattr(model, "_is_graph_network", False)
    ):
        kind = "Functional"
    else:
        raise TwinError(
            "keras_mvit2.quantize needs a Functional or Sequential Keras model (it rebuilds the "
            f"model layer by layer for TFMOT). Received: a {type(model).__name__} "
            f"({model.name!r}); build it with keras.Model(inputs, outputs) instead of "
            "subclassing keras.Model."
        )
    inputs = getattr(model, "inputs", None)
    if not inputs or len(inputs) != 1 or len(model.outputs) != 1:
        raise TwinError(
            "keras_mvit2.quantize supports models with one input and one output. Received: "
            f"{len(inputs or [])} inputs, {len(getattr(model, 'outputs', []) or [])} outputs"
        )
    return {
        "kind": kind,
        "config": model.get_config(),
        "input_shape": list(inputs[0].shape),
        "output_shape": list(model.outputs[0].shape),
    }


def _sanitize(value):
    """Keras 3 serialization dicts -> what tf_keras' deserializers accept."""
    if isinstance(value, list):
        return [_sanitize(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "class_name" in value and "config" in value and value.get("class_name") in (
        "DTypePolicy", "FloatDTypePolicy", "Policy",
    ):
        return value["config"]["name"]
    if "class_name" in value and "config" in value and "module" in value:
        registered = value.get("registered_name")
        config = _sanitize(value["config"])
        if registered and ">" in registered:
            return {"class_name": registered, "config": config}
        cls = _builtin_object_class(value.get("module") or "", value["class_name"])
        if cls is not None and isinstance(config, dict):
            config = _builtin_config(cls, config, value["class_name"])
        return {"class_name": value["class_name"], "config": config}
    return {k: _sanitize(v) for k, v in value.items()}


def _builtin_object_class(module: str, class_name: str):
    """The tf_keras class of a serialized Keras 3 built-in object, or None."""
    import tf_keras

    namespace = {
        "keras.initializers": tf_keras.initializers,
        "keras.regularizers": tf_keras.regularizers,
        "keras.constraints": tf_keras.constraints,
        "keras.layers": tf_keras.layers,
    }.get(module)
    cls = getattr(namespace, class_name, None) if namespace is not None else None
    return cls if isinstance(cls, type) else None


def _accepted_kwargs(cls) -> tuple[set[str], bool]:
    names: set[str] = set()
    var_kw = False
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            params = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            continue
        for p in params:
            if p.kind is inspect.Parameter.VAR_KEYWORD:
                var_kw = True
            elif p.name != "self":
                names.add(p.name)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            break
    return names, var_kw


def _builtin_config(cls, config: dict, layer_name: str) -> dict:
    """Keeps the keys the tf_keras class accepts; Keras-3-only keys must be unset."""
    accepted, _ = _accepted_kwargs(cls)
    if isinstance(cls, type) and issubclass(cls, _tf_keras_layer_class()):
        accepted |= _BASE_LAYER_KWARGS
    out = {}
    for key, value in config.items():
        if key in accepted:
            out[key] = value
        elif value not in (None, False, 0, {}, [], "none"):
            raise TwinError(
                f"Layer {layer_name!r} ({cls.__name__}) uses the Keras 3 option {key}={value!r}, "
                "which tf_keras does not have, so it cannot be rebuilt for TFMOT. Remove the "
                "option or use keras_mvit2.export.to_tflite(..., quantization='int8') "
                "(post-training quantization) instead."
            )
    return out


def _tf_keras_layer_class():
    import tf_keras

    return tf_keras.layers.Layer


def _layer_class(entry: Mapping[str, Any]):
    import tf_keras

    class_name = entry["class_name"]
    registered = entry.get("registered_name")
    module = entry.get("module") or ""
    if registered and ">" in registered:
        cls = tf_keras.saving.get_registered_object(registered)
        if cls is None:
            raise TwinError(
                f"Layer {entry['config'].get('name')!r} is a custom layer {registered!r} with no "
                "tf_keras equivalent in the worker process, so the model cannot be rebuilt for "
                "TFMOT. keras_mvit2.quantize rebuilds keras_mvit2 layers and Keras built-in "
                "layers only; for other models use keras_mvit2.export.to_tflite(..., "
                "quantization='int8') (post-training quantization)."
            )
        return cls, True
    if class_name in ("Functional", "Sequential", "Model"):
        raise TwinError(
            f"Layer {entry['config'].get('name')!r} is a nested model ({class_name}). TFMOT "
            "cannot quantize a model inside a model: flatten it into one Functional model "
            "(e.g. keras.Model(backbone.input, head(backbone.output)))."
        )
    if module.startswith("keras") and hasattr(tf_keras.layers, class_name):
        return getattr(tf_keras.layers, class_name), False
    raise TwinError(
        f"Layer {entry['config'].get('name')!r} of class {class_name!r} (module {module!r}) has "
        "no tf_keras equivalent, so the model cannot be rebuilt for TFMOT. keras_mvit2.quantize "
        "supports keras_mvit2 layers and Keras built-in layers."
    )


def make_layer(entry: Mapping[str, Any], class_override=None):
    """A tf_keras layer from one Keras 3 layer config entry."""
    cls, ours = _layer_class(entry)
    if class_override is not None:
        cls = class_override(cls) or cls
    config = _sanitize(dict(entry["config"]))
    if not ours:
        config = _builtin_config(cls, config, entry["config"].get("name"))
    try:
        return cls.from_config(config)
    except (TypeError, ValueError) as err:
        raise TwinError(
            f"Could not rebuild layer {entry['config'].get('name')!r} ({entry['class_name']}) "
            f"in tf_keras: {err}"
        ) from err


def build_twin(spec: Mapping[str, Any], class_override=None):
    """The tf_keras twin of the model described by `model_spec` (shim installed).

    Args:
        spec: the dict from `model_spec`.
        class_override: optional ``cls -> cls or None``: the worker uses it to give
            composite layers the TFMOT pruning/clustering interfaces.
    """
    import tf_keras

    # Registers the layer classes and the model families' blocks, on the shim.
    import keras_mvit2.layers
    import keras_mvit2.models  # noqa: F401

    config = spec["config"]
    name = config.get("name")
    if spec["kind"] == "Sequential":
        entries = list(config["layers"])
        if entries and entries[0]["class_name"] == "InputLayer":
            entries = entries[1:]
        x = inputs = tf_keras.Input(
            batch_shape=tuple(spec["input_shape"]), name=f"{name}_input"
        )
        for entry in entries:
            x = make_layer(entry, class_override)(x)
        return tf_keras.Model(inputs, x, name=name)
    return _replay_functional(config, class_override)


def _replay_functional(config: Mapping[str, Any], class_override):
    import tf_keras

    layers: dict[str, Any] = {}
    produced: dict[tuple[str, int], Any] = {}
    pending: list[tuple[str, int, dict]] = []
    for entry in config["layers"]:
        lname = entry["name"]
        if entry["class_name"] == "InputLayer":
            cfg = entry["config"]
            shape = cfg.get("batch_shape") or cfg.get("batch_input_shape")
            produced[(lname, 0)] = tf_keras.Input(
                batch_shape=tuple(shape), dtype=cfg.get("dtype") or "float32", name=lname
            )
            continue
        layers[lname] = make_layer(entry, class_override)
        for node_index, node in enumerate(entry.get("inbound_nodes", [])):
            pending.append((lname, node_index, node))

    def resolve(value):
        if isinstance(value, dict) and value.get("class_name") == "__keras_tensor__":
            hist = value["config"]["keras_history"]
            key = (hist[0], int(hist[1]))
            if key not in produced:
                raise KeyError(key)
            out = produced[key]
            return out[int(hist[2])] if isinstance(out, list | tuple) else out
        if isinstance(value, list):
            return [resolve(v) for v in value]
        if isinstance(value, dict):
            return {k: resolve(v) for k, v in value.items()}
        return value

    while pending:
        progress = False
        remaining = []
        for lname, node_index, node in pending:
            try:
                args = resolve(node.get("args", []))
                kwargs = resolve(node.get("kwargs", {}))
            except KeyError:
                remaining.append((lname, node_index, node))
                continue
            produced[(lname, node_index)] = layers[lname](*args, **kwargs)
            progress = True
        if not progress:
            raise TwinError(
                "Could not replay the model graph: the inputs of layers "
                f"{sorted({p[0] for p in remaining})} are never produced."
            )
        pending = remaining

    def endpoints(spec):
        if spec and isinstance(spec[0], str):
            spec = [spec]
        tensors = []
        for lname, node_index, tensor_index in spec:
            out = produced[(lname, int(node_index))]
            tensors.append(out[int(tensor_index)] if isinstance(out, list | tuple) else out)
        return tensors

    inputs = endpoints(config["input_layers"])
    outputs = endpoints(config["output_layers"])
    return tf_keras.Model(
        inputs[0] if len(inputs) == 1 else inputs,
        outputs[0] if len(outputs) == 1 else outputs,
        name=config.get("name"),
    )
