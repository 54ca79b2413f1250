"""Fake-quantizers on the tensors keras_mvit2's layers compute with function calls (QAT worker).

TFMOT fake-quantizes what a wrapper sees: a layer's weights and its output. Inside our
composite layers the SiLUs (``ops.silu``), the residual sums (``ops.add``) and the separable
attention's ``ReLU(v) * context`` (``ops.multiply``) are function calls, yet each is an int8
tensor of its own in the converted file (a MUL after the LOGISTIC, an ADD, a MUL). Without a
fake-quantizer the fine-tune never sees their rounding and the converter calibrates their
ranges afterwards: the post-training error that QAT was meant to remove, left in place at
every SiLU and residual sum.

`FunctionFakeQuant.install(model, ...)` makes those calls fake-quantized in the worker's
tf_keras QAT model, without touching the layer code:

* each keras_mvit2 layer instance's ``call`` is wrapped to push a frame on a stack (the
  layer, its ``training`` flag, a counter per function), so every call *site* is named
  ``<layer path>/<function>_<index>`` and keeps the same range variables in every trace;
* the shim's ``keras.ops.silu`` / ``add`` / ``multiply`` run the function, then TFMOT's
  `MovingAvgQuantize` (asymmetric per-tensor 8 bits, the same op as a wrapper's output
  quantizer, with the worker's settable EMA decay, so the calibration steps range them too)
  when called inside one of our layers;
* a site whose tensor is the output of a layer that a wrapper already output-quantizes
  (the inverted residual's sum, the transformer layer's second sum) is left alone: two
  fake-quantizers on one tensor would make the converter add a requantize.

Nothing here runs in the user's process; TensorFlow, TFMOT and the tf_keras shim are
passed in by the worker.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

#: The ``keras.ops`` functions whose outputs are fake-quantized inside our layers.
FUNCTIONS = ("silu", "add", "multiply")


@dataclasses.dataclass
class _Frame:
    path: str
    training: Any
    counts: collections.Counter


class FunctionFakeQuant:
    """Fake-quantizes the outputs of `FUNCTIONS` called inside keras_mvit2 layers.

    Args:
        tf: the ``tensorflow`` module (``tf.__internal__.decorator.make_decorator`` keeps a
            wrapped ``call``'s signature, which TFMOT's wrapper reads to pass ``training``).
        ops: the shim's ``keras.ops`` module (its attributes are replaced).
        moving_avg_quantize: TFMOT's ``quant_ops.MovingAvgQuantize`` (looked up at each
            call, so the worker's EMA-decay patch applies).
        smart_cond: ``smart_cond(pred, true_fn, false_fn)``.

    Attributes:
        sites: ``{site name: (min variable, max variable)}`` of the fake-quantized sites.
        skipped: site names left to a wrapper's output quantizer.
    """

    def __init__(self, tf, ops, moving_avg_quantize: Callable[[], Callable], smart_cond):
        self.tf, self.ops = tf, ops
        self.moving_avg_quantize, self.smart_cond = moving_avg_quantize, smart_cond
        self.sites: dict[str, tuple[Any, Any]] = {}
        self.skipped: set[str] = set()
        self._stack: list[_Frame] = []
        # The recording call's tensors are kept alive with their ids (an id is unique
        # only while its object lives).
        self._recorded: dict[int, tuple[str, Any]] | None = None
        self._returned: list[tuple[str, Any]] | None = None

    def install(self, model, layers: Iterable[tuple[str, Any]],
                output_quantized: Iterable[str], input_shape) -> None:
        """Wraps `layers` (``(path, layer)`` pairs, every keras_mvit2 layer of `model`),
        replaces the shim's functions, and finds the sites to leave alone with one eager
        call of `model` on zeros (`input_shape` with batch 1); `output_quantized` are the
        paths of the layers whose output a wrapper quantizes."""
        for path, layer in layers:
            self._wrap_call(path, layer)
        for name in FUNCTIONS:
            self._wrap_function(name)
        self._recorded, self._returned = {}, []
        try:
            model(self.tf.zeros((1, *[int(d) for d in input_shape[1:]])), training=False)
            quantized = set(output_quantized)
            for path, output in self._returned:
                site, _ = self._recorded.get(id(output), (None, None))
                if path in quantized and site is not None:
                    self.skipped.add(site)
                    del self.sites[site]
        finally:
            self._recorded = self._returned = None

    def summary(self) -> Mapping[str, list[str]]:
        """``{layer path: [site names]}`` of the fake-quantized sites."""
        out: dict[str, list[str]] = collections.defaultdict(list)
        for site in self.sites:
            path, name = site.rsplit("/", 1)
            out[path].append(name)
        return dict(out)

    # -------------------------------------------------------------- wrapping

    def _wrap_call(self, path: str, layer) -> None:
        original = layer.call
        signature = inspect.signature(original)

        def call(*args, **kwargs):
            training = signature.bind_partial(*args, **kwargs).arguments.get("training")
            self._stack.append(_Frame(path, training, collections.Counter()))
            try:
                output = original(*args, **kwargs)
            finally:
                self._stack.pop()
            if self._returned is not None:
                self._returned.append((path, output))
            return output

        object.__setattr__(layer, "call",
                           self.tf.__internal__.decorator.make_decorator(original, call))

    def _wrap_function(self, name: str) -> None:
        function = getattr(self.ops, name)
        if getattr(function, "_mvit2_fake_quant", False):
            return

        def fake_quantized(*args, **kwargs):
            output = function(*args, **kwargs)
            if not self._stack:
                return output
            frame = self._stack[-1]
            site = f"{frame.path}/{name}_{frame.counts[name]}"
            frame.counts[name] += 1
            if site in self.skipped:
                return output
            quantized = self._quantize(site, output, frame.training)
            if self._recorded is not None:
                self._recorded[id(quantized)] = (site, quantized)
            return quantized

        fake_quantized._mvit2_fake_quant = True
        setattr(self.ops, name, self.tf.autograph.experimental.do_not_convert(fake_quantized))

    def _quantize(self, site: str, x, training):
        tf = self.tf
        ranges = self.sites.get(site)
        if ranges is None:
            with tf.init_scope():
                name = re.sub(r"[^A-Za-z0-9_.-]", "_", site)
                ranges = (tf.Variable(-6.0, trainable=False, name=f"{name}_min"),
                          tf.Variable(6.0, trainable=False, name=f"{name}_max"))
            self.sites[site] = ranges
        quantize = self.moving_avg_quantize()
        prefix = re.sub(r"[^A-Za-z0-9_.]", "_", site)

        def fake_quant(is_training: bool):
            return lambda: quantize(x, ranges[0], ranges[1], ema_decay=0.999,
                                    is_training=is_training, num_bits=8, per_channel=False,
                                    symmetric=False, narrow_range=False, name_prefix=prefix)

        return self.smart_cond(False if training is None else training,
                               fake_quant(True), fake_quant(False))
