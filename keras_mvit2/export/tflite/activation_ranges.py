"""Activation ranges of a full-int8 file chosen per tensor, instead of the global min / max.

TF 2.21's converter calibrates by running the float graph on the representative images
and keeping, per tensor, the smallest and largest value it ever saw
(``calibration_logger.cc``); the int8 step is that range / 255. MobileViTV2's
activations are heavy-tailed, so that step is coarse for almost every value (measurements:
``docs/int8.md``).

`select_ranges` re-chooses each range from the tensor's histogram over the calibration
images, then the quantizer quantizes with those ranges (the same MLIR quantizer call the
converter makes; `keras_mvit2.export.tflite.calibrated_quantize`):

* ``"minmax"``: the converter's ranges, unchanged;
* ``"mse"``: the range ``[a, b]`` (``a <= 0 <= b``) that minimises the expected squared
  error of the quantized tensor over the calibration values: the clipping error of the
  values outside it plus the rounding error ``step^2 / 12`` of those inside, with
  ``step = (b - a) / 255`` (searched on a grid of fractions of the calibrated min and max);
* ``"p99.99"`` (any ``"p<percent>"``): the two-sided percentile.

Tensors whose range the int8 kernels fix (the model input, the outputs of LOGISTIC, EXP,
SOFTMAX, TANH) keep theirs. The second operand of every BATCH_MATMUL gets the zero point that
picks the kernel of its product (`zero_offset_matmul_operands`): 0 where XNNPACK, which runs
int8 files on phones' CPUs, should run it (LiteRT 2.3's XNNPACK takes an int8 BATCH_MATMUL only
then), non-zero for a product of one row (LiteRT's own kernel). The histograms also give
`RangeStats`: per tensor the calibrated range against its 99.9 / 99.99 percentiles and the
chosen range.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np

from keras_mvit2.export.tflite.flatbuffer import (
    decode_name,
    op_names,
    parse_flatbuffer,
    read_flatbuffer,
    serialize_flatbuffer,
    tensor_indices,
)

__all__ = ["RANGE_METHODS", "RangeStats", "check_range_method", "select_named_ranges",
           "select_ranges", "zero_offset_matmul_operands"]

#: Activation range methods of `to_tflite(activation_ranges=...)` (and any ``"p<percent>"``).
RANGE_METHODS = ("minmax", "mse", "p99.99", "p99.9")
#: Histogram bins between a tensor's calibrated min and max.
BINS = 2048
#: Grid of the MSE search: fractions of the calibrated min / max.
_FRACTIONS = np.linspace(0.05, 1.0, 96)
#: Ops whose int8 output range the kernels fix.
_FIXED_RANGE_OPS = ("LOGISTIC", "EXP", "SOFTMAX", "TANH")
#: Ops whose int8 output keeps the input's scale and zero point (the quantizer ties them).
_SAME_SCALE_OPS: dict[str, tuple[int, ...]] = {
    # op -> the indices of its data inputs, tied with its outputs (empty: every input)
    **dict.fromkeys(("RESHAPE", "TRANSPOSE", "SQUEEZE", "EXPAND_DIMS", "SPACE_TO_DEPTH",
                     "DEPTH_TO_SPACE", "SPLIT_V", "STRIDED_SLICE", "SLICE", "GATHER", "PAD",
                     "UNPACK", "TILE", "BROADCAST_TO"), (0,)),
    "SPLIT": (1,),
    **dict.fromkeys(("CONCATENATION", "PACK"), ()),
}
_PERCENTILE = re.compile(r"^p(\d+(?:\.\d+)?)$")


@dataclasses.dataclass(frozen=True)
class RangeStats:
    """One activation tensor's calibration statistics and the range chosen for it.

    Attributes:
        tensor: the tensor's name in the graph.
        op: the type of the op that writes it (``"CONV_2D"``).
        calibrated: ``(min, max)`` the converter calibrated (global min / max).
        p99_9: ``(0.05th, 99.95th)`` percentiles: 99.9 % of the values lie in between.
        p99_99: ``(0.005th, 99.995th)`` percentiles.
        rms: root mean square of the calibration values.
        chosen: the range the file is quantized with.
    """

    tensor: str
    op: str
    calibrated: tuple[float, float]
    p99_9: tuple[float, float]
    p99_99: tuple[float, float]
    rms: float
    chosen: tuple[float, float]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check_range_method(method: Any) -> str:
    """`method` if it is one of `RANGE_METHODS` or ``"p<percent>"`` (50 < percent < 100)."""
    if isinstance(method, str):
        if method in ("minmax", "mse"):
            return method
        match = _PERCENTILE.match(method)
        if match and 50.0 < float(match.group(1)) < 100.0:
            return method
    raise ValueError(
        f"activation_ranges must be one of {RANGE_METHODS} or 'p<percent>' (e.g. 'p99.99', "
        f"percent in (50, 100)). Received: activation_ranges={method!r}"
    )


def select_ranges(calibrated: bytes, images: np.ndarray, method: str,
                  *, stats: list[RangeStats] | None = None) -> bytes:
    """The calibrated float flatbuffer with each activation range chosen by `method`.

    Args:
        calibrated: the converter's calibrated float model (``_experimental_calibrate_only``:
            float ops, each activation tensor annotated with its calibrated min / max).
        images: the calibration images, `(N, H, W, C)` float32 (the model's fixed batch).
        method: ``"minmax"``, ``"mse"`` or ``"p<percent>"`` (`check_range_method`).
        stats: a list that receives one `RangeStats` per ranged tensor (optional).

    Returns:
        The calibrated flatbuffer with the new ranges, for ``mlir_quantize``.
    """
    method = check_range_method(method)
    if method == "minmax" and stats is None:
        return calibrated
    model = parse_flatbuffer(calibrated)
    subgraph = model.subgraphs[0]
    tensors = subgraph.tensors
    ranged = {
        i: (float(t.quantization.min[0]), float(t.quantization.max[0]))
        for i, t in enumerate(tensors)
        if t.quantization is not None and t.quantization.min is not None
        and len(t.quantization.min) == 1 and len(t.quantization.max) == 1
    }
    kinds = op_names(model)
    writer = {
        i: kinds[op.opcodeIndex] for op in subgraph.operators or []
        for i in tensor_indices(op.outputs)
    }
    fixed = set(tensor_indices(subgraph.inputs)) | {
        i for i, kind in writer.items() if kind in _FIXED_RANGE_OPS
    }
    histograms = _histograms(calibrated, images, {
        i: (lo, hi) for i, (lo, hi) in ranged.items() if i not in fixed and hi - lo > 1e-6})
    for i, (lo, hi) in ranged.items():
        if i in fixed or i not in histograms:
            continue
        hist, moments = histograms[i]
        chosen = choose_range(hist, lo, hi, method)
        if stats is not None:
            stats.append(RangeStats(
                tensor=decode_name(tensors[i].name), op=writer.get(i, ""), calibrated=(lo, hi),
                p99_9=_percentiles(hist, lo, hi, 99.9), p99_99=_percentiles(hist, lo, hi, 99.99),
                rms=float(np.sqrt(moments)), chosen=chosen,
            ))
        tensors[i].quantization.min = np.array([chosen[0]], np.float32)
        tensors[i].quantization.max = np.array([chosen[1]], np.float32)
    zero_offset_matmul_operands(model)
    return serialize_flatbuffer(model, size_hint=len(calibrated) + 1024)


def zero_offset_matmul_operands(model: Any) -> int:
    """Sets the int8 zero point of each BATCH_MATMUL's second operand for the kernel that
    should run the product: 0 (XNNPACK) where its first operand has several rows, non-zero
    (LiteRT's own kernel) where it has one.

    LiteRT 2.3's XNNPACK delegate (the CPU delegate apps use) takes an int8 BATCH_MATMUL
    only where its second operand has zero point 0; any other runs in LiteRT's own kernel,
    exact with any zero point, which measured 20-30x slower on the attentions' products
    (MHA's `q k^T` at 256 tokens: 9.4 against 0.28 ms on the AMD host,
    `benchmarks/int8_speed.py`). So the second operand of every product whose first
    operand has several rows (the attentions' token sums, `q k^T`, the weights times `v`,
    Linformer's token projections, per row of queries or pixel positions) gets the range
    ``[-128 s, 127 s]`` (``s = max(max / 127, -min / 128)``), which covers the calibrated one
    with zero point 0.

    A product whose first operand is one row (a vector times a matrix: the GroupNorm's
    `E[x^2]` as `x . x`, `(1, K) x (K, 1)`, and an attention's products for one token) is
    the other way round: XNNPACK packs the second operand on every invoke (its one column to
    the kernel's tile width for `x . x`: 4-5x LiteRT's kernel on the AMD host, and the int8
    file 2.3x slower on an Intel host with AMX tiles, where the tile is widest), which one
    row never repays, while LiteRT's kernel runs it directly. (A constant second operand is
    packed once, when the file loads: XNNPACK, `int8_kernels.symmetric_constant_matmul_
    operands`.) Its operand keeps the
    calibrated range; where that range has zero point 0 it is shifted by one step (to
    zero point -1) so that the product stays in LiteRT's kernel. (Where one operand serves
    both kinds, zero point 0 wins.)

    Each new range goes to every tensor the quantizer ties to the operand's scale (through
    `_SAME_SCALE_OPS`: e.g. MHA's keys are a SPLIT of the fused projection, so the whole
    projection gets the range), so the file keeps its ops.

    Args:
        model: a parsed calibrated flatbuffer (`parse_flatbuffer`), changed in place.

    Returns:
        The number of operand groups changed.
    """
    subgraph = model.subgraphs[0]
    tensors = subgraph.tensors
    kinds = op_names(model)
    parent = list(range(len(tensors)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    products, row_products = [], []
    for op in subgraph.operators or []:
        kind, ins = kinds[op.opcodeIndex], tensor_indices(op.inputs)
        if kind in _SAME_SCALE_OPS:
            data = [ins[i] for i in _SAME_SCALE_OPS[kind]] or ins
            for i in data[1:] + tensor_indices(op.outputs):
                parent[root(i)] = root(data[0])
        elif kind == "BATCH_MATMUL" and len(ins) > 1:
            one_row = first_operand_rows(tensors[ins[0]], op) == 1
            (row_products if one_row else products).append(ins[1])

    def ranged(i: int) -> bool:
        q = tensors[i].quantization
        return q is not None and q.min is not None and len(q.min) == 1 and len(q.max) == 1

    groups: dict[int, list[int]] = {}
    for i in range(len(tensors)):
        if ranged(i):
            groups.setdefault(root(i), []).append(i)
    zero = {root(i) for i in products if ranged(i)}
    nonzero = {root(i) for i in row_products if ranged(i)} - zero
    changed = 0
    for key in zero | nonzero:
        members = groups[key]
        lo = min(float(tensors[i].quantization.min[0]) for i in members)
        hi = max(float(tensors[i].quantization.max[0]) for i in members)
        if key in zero:
            step = max(hi / 127.0, -lo / 128.0, 1e-12)
            lo, hi = -128.0 * step, 127.0 * step
        else:
            lo, hi = min(lo, 0.0), max(hi, 0.0)  # the quantizer's range always holds 0
            step = max((hi - lo) / 255.0, 1e-12)
            if round(-128.0 - lo / step) != 0:
                continue
            lo, hi = lo + step, hi + step
        changed += 1
        for i in members:
            tensors[i].quantization.min = np.array([lo], np.float32)
            tensors[i].quantization.max = np.array([hi], np.float32)
    return changed


def first_operand_rows(tensor: Any, op: Any) -> int | None:
    """The rows of a BATCH_MATMUL's first operand `tensor` (its second-to-last axis, the last
    with the op's ``adj_x``), or None where the shape is not static."""
    shape = tensor_indices(tensor.shape)
    if len(shape) < 2:
        return None
    adj_x = bool(getattr(op.builtinOptions, "adjX", False))
    rows = shape[-1] if adj_x else shape[-2]
    return rows if rows > 0 else None


def select_named_ranges(float_model: bytes, images: np.ndarray,
                        ranges: dict[str, tuple[float, float]],
                        method: str) -> dict[str, tuple[float, float]]:
    """Ranges chosen by `method` for the tensors of a float flatbuffer named in `ranges`
    (another calibrator's ranges, e.g. ai-edge-quantizer's calibration result, keyed by
    tensor name), from their values on `images`: the same choice as `select_ranges`, for a
    graph without the converter's annotations. Tensors whose range the kernels fix, and the
    model's inputs, keep theirs."""
    method = check_range_method(method)
    model = read_flatbuffer(float_model)
    subgraph = model.subgraphs[0]
    kinds = op_names(model)
    fixed = set(tensor_indices(subgraph.inputs)) | {
        i for op in subgraph.operators or [] if kinds[op.opcodeIndex] in _FIXED_RANGE_OPS
        for i in tensor_indices(op.outputs)}
    index = {decode_name(t.name): i for i, t in enumerate(subgraph.tensors)}
    named = [index[name] for name in ranges if name in index and index[name] not in fixed]
    if method == "minmax" or not named:
        return dict(ranges)
    # The other calibrator's min / max may be averages over batches: the histograms span
    # each tensor's global extremes, with 0 inside (int8 holds 0 exactly).
    wanted = {i: (min(lo, 0.0), max(hi, 0.0))
              for i, (lo, hi) in _extremes(float_model, images, named).items() if hi - lo > 1e-6}
    histograms = _histograms(float_model, images, wanted)
    chosen = dict(ranges)
    names = {i: name for name, i in index.items()}
    for i, (lo, hi) in wanted.items():
        if i in histograms:
            chosen[names[i]] = choose_range(histograms[i][0], lo, hi, method)
    return chosen


def _tensor_values(model: bytes, images: np.ndarray, indices) -> Iterator[dict[int, np.ndarray]]:
    """Per batch of `images`, the values of the tensors `indices` of the float flatbuffer
    `model` run in LiteRT (every tensor kept), flattened."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    with tempfile.TemporaryDirectory(prefix="keras_mvit2_ranges_") as tmp:
        path = os.path.join(tmp, "calibrated.tflite")
        with open(path, "wb") as f:
            f.write(model)
        interpreter = Interpreter(
            model_path=path, experimental_preserve_all_tensors=True,
            experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
        )
        interpreter.allocate_tensors()
        detail = interpreter.get_input_details()[0]
        batch = int(detail["shape"][0]) or 1
        for start in range(0, len(images) - batch + 1, batch):
            interpreter.set_tensor(
                detail["index"], np.ascontiguousarray(images[start:start + batch], np.float32))
            interpreter.invoke()
            yield {i: interpreter.get_tensor(i).ravel() for i in indices}


def _histograms(calibrated: bytes, images: np.ndarray, ranged: dict[int, tuple[float, float]]):
    """Per tensor: a `BINS`-bin histogram over its calibrated range and its mean square,
    from the calibrated float model run in LiteRT on `images`."""
    hists = {i: np.zeros(BINS) for i in ranged}
    squares = dict.fromkeys(ranged, 0.0)
    counts = dict.fromkeys(ranged, 0)
    for values_of in _tensor_values(calibrated, images, ranged):
        for i, (lo, hi) in ranged.items():
            values = values_of[i]
            # The bins of np.histogram(values, BINS, (lo, hi)), counted with bincount
            # (several times faster on the ~500 tensors of a model, per image).
            bins = ((values - lo) * (BINS / (hi - lo))).astype(np.int64)
            hists[i] += np.bincount(np.clip(bins, 0, BINS - 1), minlength=BINS)
            squares[i] += float(np.dot(values, values))
            counts[i] += values.size
    return {i: (hists[i], squares[i] / max(counts[i], 1)) for i in ranged}


def _extremes(model: bytes, images: np.ndarray, indices) -> dict[int, tuple[float, float]]:
    """Each tensor's global ``(min, max)`` over `images`."""
    low = dict.fromkeys(indices, np.inf)
    high = dict.fromkeys(indices, -np.inf)
    for values_of in _tensor_values(model, images, indices):
        for i in indices:
            low[i] = min(low[i], float(values_of[i].min()))
            high[i] = max(high[i], float(values_of[i].max()))
    return {i: (low[i], high[i]) for i in indices}


def _percentiles(hist: np.ndarray, lo: float, hi: float, percent: float) -> tuple[float, float]:
    """The two-sided `percent` interval of the histogrammed values (bin edges)."""
    edges = np.linspace(lo, hi, len(hist) + 1)
    cumulative = np.cumsum(hist)
    total = cumulative[-1]
    if total <= 0:
        return lo, hi
    tail = (100.0 - percent) / 200.0 * total
    low = edges[int(np.searchsorted(cumulative, tail, side="right"))]
    high = edges[min(int(np.searchsorted(cumulative, total - tail, side="left")) + 1, len(hist))]
    return float(low), float(high)


def choose_range(hist: np.ndarray, lo: float, hi: float, method: str) -> tuple[float, float]:
    """The range `method` picks for a tensor with histogram `hist` over ``[lo, hi]``.

    The range always holds 0 (int8 represents 0 exactly), and never exceeds ``[lo, hi]``.
    """
    if hi <= lo or method == "minmax" or hist.sum() <= 0:
        return lo, hi
    match = _PERCENTILE.match(method)
    if match:
        a, b = _percentiles(hist, lo, hi, float(match.group(1)))
        return (min(a, 0.0) if lo < 0 else lo), (max(b, 0.0) if hi > 0 else hi)
    return _mse_range(hist, lo, hi)


def _mse_range(hist: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
    """The ``[a, b]`` of smallest expected squared quantization error (see the module doc)."""
    edges = np.linspace(lo, hi, len(hist) + 1)
    centers = (edges[:-1] + edges[1:]) / 2
    # Prefix sums of n, n x, n x^2: the clipping error of any [a, b] in O(1).
    n = np.concatenate([[0.0], np.cumsum(hist)])
    nx = np.concatenate([[0.0], np.cumsum(hist * centers)])
    nxx = np.concatenate([[0.0], np.cumsum(hist * centers * centers)])
    lows = np.array([lo]) if lo >= 0 else np.minimum(lo * _FRACTIONS, 0.0)
    highs = np.array([hi]) if hi <= 0 else np.maximum(hi * _FRACTIONS, 0.0)
    a = lows[:, None]
    b = highs[None, :]
    ia = np.searchsorted(centers, a)           # bins below a: [0, ia)
    ib = np.searchsorted(centers, b, side="right")  # bins above b: [ib, B)
    below = nxx[ia] - 2 * a * nx[ia] + a * a * n[ia]
    above = (nxx[-1] - nxx[ib]) - 2 * b * (nx[-1] - nx[ib]) + b * b * (n[-1] - n[ib])
    step = (b - a) / 255.0
    inside = n[ib] - n[ia]
    error = below + above + inside * step * step / 12.0
    i, j = np.unravel_index(int(np.argmin(error)), error.shape)
    return float(lows[i]), float(highs[j])
