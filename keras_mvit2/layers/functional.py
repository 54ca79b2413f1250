"""The MobileViTv2 transformer's math, written once, over named token axes.

The Keras layers (`GroupNorm1`, `SeparableSelfAttention`, `TransformerLayer`,
`MobileViTV2Block`, `unfold` / `fold`) call these functions with `CHANNELS_LAST`; the
Core ML export (`keras_mvit2.export.coreml.layout`) calls them with `CHANNELS_FIRST` and
the weights of the same layers. Where a step has two forms that compute the same
function but convert to different programs, the form is an argument, chosen by
`keras_mvit2.layers.export_forms` (the table there says which target gets which).

Token layouts (P pixel positions of a patch, N patches, d channels):

* `CHANNELS_LAST`: `(B, N, P, d)`, tokens on axis 1, channels last (TFLite, Keras);
* `CHANNELS_FIRST`: `(B, d, P, N)`, channels on axis 1, tokens last (Core ML, which
  runs convolutions channels-first: P is the height axis, N the width axis).

The math is `keras.ops`; the steps that only TensorFlow converts op-for-op as wanted
(space_to_depth, NCHW 1x1 convolutions, the transposed matrix product) are the small
functions of `keras_mvit2.backend.tf_forms` on TensorFlow, of `keras_mvit2.backend.ops_forms`
on the other backends (picked by `keras_mvit2.backend.forms`). Every function here
traces exactly the ops the layers traced before it existed, in the same order (exported
files are unchanged).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np
from keras import ops

from keras_mvit2.backend import forms as backend_forms
from keras_mvit2.layers import export_forms
from keras_mvit2.layers.export_forms import ExportForms

__all__ = [
    "CHANNELS_FIRST",
    "CHANNELS_LAST",
    "TokenLayout",
    "divide_positive",
    "exp_over_tokens",
    "flow_factor",
    "fold",
    "group_norm1",
    "kernel_attention",
    "linformer_attention",
    "mobile_attention_flows",
    "pointwise_conv",
    "pool_tokens",
    "product",
    "separable_attention",
    "softmax_over_tokens",
    "transform_patches",
    "transformer_layer",
    "unfold",
]


@dataclasses.dataclass(frozen=True)
class TokenLayout:
    """Where the tokens and the channels are in a rank-4 token tensor.

    Attributes:
        name: `"channels_last"` or `"channels_first"`.
        token_axis: the axis of the N patches (the attention's sequence axis).
        channel_axis: the axis of the d channels (the 1x1 convolutions' axis).
    """

    name: str
    token_axis: int
    channel_axis: int

    @property
    def channels_last(self) -> bool:
        return self.channel_axis == -1

    def per_channel(self, vector, dtype):
        """A `(d,)` weight cast to `dtype`, shaped to broadcast over this layout's channels."""
        vector = ops.cast(vector, dtype)
        return vector if self.channels_last else ops.reshape(vector, (1, -1, 1, 1))


#: `(B, N, P, d)` (or `(B, ..., d)` for the norm): tokens on axis 1, channels last.
CHANNELS_LAST = TokenLayout("channels_last", token_axis=1, channel_axis=-1)
#: `(B, d, P, N)`: channels on axis 1, tokens last.
CHANNELS_FIRST = TokenLayout("channels_first", token_axis=-1, channel_axis=1)


def _forms(forms: ExportForms | None) -> ExportForms:
    return export_forms.current() if forms is None else forms


def _num_tokens(x, axis: int):
    n = x.shape[axis]
    return float(n) if n is not None else ops.cast(ops.shape(x)[axis], x.dtype)


# --------------------------------------------------------------------------------------
# 1x1 convolutions and GN1


def pointwise_conv(x, kernel, bias=None, *, layout: TokenLayout = CHANNELS_LAST,
                   outputs: tuple[int, int] | None = None):
    """`W x + b` over the channel axis, with a Keras `(1, 1, d_in, d_out)` kernel.

    Args:
        x: rank-4 tokens in `layout`.
        kernel: `(1, 1, d_in, d_out)`.
        bias: `(d_out,)` or None.
        layout: `CHANNELS_LAST` (`keras.ops.conv` + add) or `CHANNELS_FIRST` (NCHW
            Conv2D + BiasAdd).
        outputs: `(start, stop)`: only these output channels of `kernel` and `bias`
            (the query, key or value slice of a fused projection).

    Returns:
        `x`'s shape with `stop - start` (or `d_out`) channels.
    """
    def kernel_part():
        return kernel if outputs is None else kernel[..., outputs[0]:outputs[1]]

    def bias_part():
        return bias if outputs is None else bias[outputs[0]:outputs[1]]

    if layout.channels_last:
        y = ops.conv(x, ops.cast(kernel_part(), x.dtype))
        return y if bias is None else y + ops.cast(bias_part(), x.dtype)
    return backend_forms.conv1x1_nchw(x, kernel_part(), None if bias is None else bias_part())


def group_norm1(x, gamma, beta, epsilon: float, *, layout: TokenLayout = CHANNELS_LAST,
                variance: str | None = None, compute_dtype: str | None = None):
    """GroupNorm with one group: one mean and variance per sample, per-channel affine.

    Args:
        x: `(B, ..., d)` (`CHANNELS_LAST`, any rank >= 2) or `(B, d, P, N)`.
        gamma, beta: `(d,)` scale and shift.
        epsilon: added to the variance.
        layout: where the channels are.
        variance: `"one_pass"` (`E[x^2] - E[x]^2`, the affine folded into one
            scale and shift), `"one_pass_matmul"` (the same, `E[x^2]` as one dot product
            per sample: in full int8 summed in int32 and rounded once, where `x * x`
            is rounded to 8 bits per element first) or `"centred"` (`E[(x - E[x])^2]`,
            then `* gamma + beta`); None: `export_forms.current()`.
        compute_dtype: the layer's compute dtype: a half one computes the statistics
            in float32 and casts back. None: no cast.

    Returns:
        `x`'s shape.
    """
    variance = _forms(None).variance if variance is None else variance
    axes = tuple(range(1, len(x.shape)))
    if compute_dtype in ("float16", "bfloat16"):
        x = ops.cast(x, "float32")
    if variance in ("one_pass", "one_pass_matmul"):
        # y = x * s + (beta - mean * s), s = gamma * rsqrt(var + eps): two full-tensor
        # element-wise ops instead of five (about 5 % of the MobileViTV2-0.5 TFLite
        # latency). x * x (MUL), not SQUARE: SQUARE stays float in int8 TFLite.
        mean = ops.mean(x, axis=axes, keepdims=True)                 # (B, 1, ..., 1)
        if variance == "one_pass_matmul":
            # E[x^2] as one dot product per sample: int8 x int8 summed in int32 and
            # rounded once, instead of x * x rounded to int8 per element before MEAN.
            flat = ops.reshape(x, (-1, 1, math.prod(x.shape[1:])))
            square_mean = ops.matmul(flat, ops.transpose(flat, (0, 2, 1))) / flat.shape[-1]
            square_mean = ops.reshape(square_mean, (-1,) + (1,) * (len(x.shape) - 1))
        else:
            square_mean = ops.mean(x * x, axis=axes, keepdims=True)
        var = square_mean - mean * mean
        var = ops.maximum(var, 0.0)  # rounding can make it slightly negative
        scale = ops.rsqrt(var + epsilon) * layout.per_channel(gamma, x.dtype)
        shift = layout.per_channel(beta, x.dtype) - mean * scale     # per sample, channel
        y = x * scale + shift
    elif variance == "centred":
        centred = x - ops.mean(x, axis=axes, keepdims=True)
        var = ops.mean(ops.square(centred), axis=axes, keepdims=True)
        normalized = centred * ops.rsqrt(var + epsilon)
        y = normalized * layout.per_channel(gamma, x.dtype) + layout.per_channel(beta, x.dtype)
    else:
        raise ValueError("variance must be 'one_pass', 'one_pass_matmul' or 'centred'. "
                         f"Received: {variance!r}")
    return y if compute_dtype is None else ops.cast(y, compute_dtype)


# --------------------------------------------------------------------------------------
# Separable self-attention


def exp_over_tokens(x, *, axis: int = 1):
    """Softmax along `axis`, unnormalised: `(exp(x - max), sum of it)` over the tokens.

    TFLite's SOFTMAX only works on the last axis; max / exp / mean keeps the token
    axis where it is, so the converted graph has no TRANSPOSE. The normaliser
    sum(e) is computed as mean(N * e): LiteRT's int16 SUM kernel is wrong and its
    MEAN is not (int16x8 models). The sum is >= 1 (the largest term is exp(0)); what
    divides by it is `divide_positive`.

    Returns:
        `e` with the shape of `x`, and its sum over `axis` (kept, size 1).
    """
    e = ops.exp(x - ops.max(x, axis=axis, keepdims=True))
    return e, ops.mean(e * _num_tokens(x, axis), axis=axis, keepdims=True)


def divide_positive(values, divisor):
    """`values / divisor` for a `divisor` > 0 (broadcast), as `values * s * s` with
    `s = rsqrt(divisor)`: every normalisation of the attentions (the separable attention's
    token sum, Mobile-Attention's flows, RFA's norms and denominators), in every form and
    under every converter. Float: within a few ulp of the division.

    Full int8: LiteRT's int8 DIV computes each element in fixed point (2.6 ms for one
    `(4, 4, 256, 16)` division on the AMD host, about 40 ns an element, against about 0.3 ns
    for an int8 MUL in XNNPACK; `benchmarks/int8_speed.py`) and fails at invoke on a divisor
    that rounds to zero. Here RSQRT reads the divisor (usually a much smaller tensor; its
    int8 kernel becomes a table, `keras_mvit2.export.tflite.lookup_tables`) and a divisor
    rounded to zero saturates it to its largest value instead of failing. RSQRT reads the
    same int8-rounded divisor the DIV did, so `s * s` knows it no better: the separable
    attention's token sum lies in [1, N] and is quantized over [0, its calibrated maximum]
    in 255 steps, so a sum near 1 is known only to about N / 510 either way. (On a
    fine-tune's int8 file the products agreed with Keras more often than the division,
    docs/int8_investigation.md; the rounding of the sum does not explain it.)
    """
    scale = ops.rsqrt(divisor)
    return values * scale * scale


def softmax_over_tokens(x, *, axis: int = 1):
    """Softmax along `axis`, without a TRANSPOSE in TFLite (see `exp_over_tokens`)."""
    e, total = exp_over_tokens(x, axis=axis)
    return divide_positive(e, total)


def _softmax(x, axis: int):
    """`keras.ops.softmax`, without its warning for an axis of size 1 (a map of one patch)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="You are using a softmax over axis")
        return ops.softmax(x, axis=axis)


def _matmul_pool(x, weights):
    """`sum_N(weights * x)` of `(B, N, P, d)` tokens as one BATCH_MATMUL per sample."""
    positions, dim = x.shape[2], x.shape[3]
    tokens = ops.shape(x)[1]
    flat = ops.reshape(x, (-1, tokens, positions * dim))              # (B, N, P*d)
    pairs = backend_forms.matmul_transpose_a(
        ops.reshape(weights, (-1, tokens, positions)), flat)           # (B, P, P*d)
    if positions == 1:
        return ops.reshape(pairs, (-1, 1, 1, dim))
    pairs = ops.reshape(pairs, (-1, positions, positions, dim))       # (B, P, P, d)
    # A constant (numpy), not `ops.eye`: PyTorch traces `eye` as an op, which litert-torch
    # lowers to STABLEHLO_IOTA, an op LiteRT's interpreter does not have.
    diagonal = ops.cast(np.eye(positions, dtype="float32")[:, :, None], pairs.dtype)  # (P, P, 1)
    # Mean of one non-zero term and P - 1 zeros, times P (see exp_over_tokens).
    return ops.mean(pairs * diagonal, axis=1, keepdims=True) * float(positions)


def pool_tokens(x, weights, *, layout: TokenLayout = CHANNELS_LAST, pooling: str | None = None):
    """`sum_N(weights * x)`: the weighted sum over the tokens of each pixel position.

    Forms (`pooling`, None: `export_forms.current().token_pooling`):

    * `"matmul"` (`CHANNELS_LAST` only): one matrix product over the token axis,
      `weights^T x` per sample. In full-int8 TFLite an element-wise product
      `weights * x` is requantized to 8 bits before the sum, and at hundreds of tokens
      (256x256 input) its typical values (about |x| / N) fall under one quantization
      step, so most terms round to zero; a BATCH_MATMUL accumulates its int8 products
      in int32 and rounds once. For P pixel positions it computes all P x P
      (position, position) pairs and keeps the diagonal with a 0/1 mask: no TRANSPOSE,
      at P times the (small) multiply-accumulates of the sum.
    * `"product_mean"`: `mean_N(x * weights) * N` (float runtimes).
    * `"product_sum"`: `sum_N(x * weights)` (float runtimes).

    Args:
        x: `(B, N, P, d)` or `(B, d, P, N)` as `layout`.
        weights: the same with one channel.

    Returns:
        `x`'s shape with one token.
    """
    pooling = _forms(None).token_pooling if pooling is None else pooling
    axis = layout.token_axis
    if pooling == "matmul":
        if not layout.channels_last:
            raise ValueError("The 'matmul' token pooling needs the CHANNELS_LAST layout.")
        return _matmul_pool(x, weights)
    if pooling == "product_mean":
        return ops.mean(x * weights, axis=axis, keepdims=True) * _num_tokens(x, axis)
    if pooling == "product_sum":
        return ops.sum(x * weights, axis=axis, keepdims=True)
    raise ValueError(f"Unknown token pooling {pooling!r}.")


def separable_attention(x, qkv_kernel, qkv_bias, out_projection: Callable, *,
                        layout: TokenLayout = CHANNELS_LAST, forms: ExportForms | None = None,
                        dropout: Callable | None = None, key_bias_correction: bool = False):
    """Separable self-attention (MobileViTv2 eq. 3) of rank-4 tokens in `layout`.

    ```
    q, k, v = split(W_qkv x + b, [1, d, d])       # slices of one 1x1 projection
    c_s = softmax(q) over the N tokens             # per pixel position
    y = out_projection(ReLU(v) * (W_k sum_N(c_s * x) + b_k))
    ```

    The key projection is applied once to the pooled tokens (the same function as
    pooling the projected keys, since the scores sum to 1).

    Args:
        x: `(B, N, P, d)` or `(B, d, P, N)` as `layout`.
        qkv_kernel: `(1, 1, d, 1 + 2d)`, the reference's `qkv_proj` kernel.
        qkv_bias: `(1 + 2d,)` or None.
        out_projection: the output 1x1 projection, a callable on `layout` tokens.
        layout: `CHANNELS_LAST` or `CHANNELS_FIRST`.
        forms: token pooling and normaliser forms; None: `export_forms.current()`.
            `"exp_mean"` pools `exp(q - max)` and divides the pooled tokens once by
            its sum (int8: the scores, about 1 / N each, are not rounded per token);
            `"softmax"` pools the softmax (one op when the tokens are the last axis).
        dropout: applied to the score weights (training).
        key_bias_correction: dropped scores no longer sum to 1; scale the key bias
            by their sum (training with dropout).

    Returns:
        `x`'s shape.
    """
    forms = _forms(forms)
    dim = (int(qkv_kernel.shape[-1]) - 1) // 2
    axis = layout.token_axis
    query = pointwise_conv(x, qkv_kernel, qkv_bias, layout=layout, outputs=(0, 1))
    if forms.token_normaliser == "softmax":
        weights, total = _softmax(query, axis), None
    else:
        weights, total = exp_over_tokens(query, axis=axis)
    if dropout is not None:
        weights = dropout(weights)
    pooled = pool_tokens(x, weights, layout=layout, pooling=forms.token_pooling)
    if total is not None:
        pooled = divide_positive(pooled, total)
    context = pointwise_conv(pooled, qkv_kernel, qkv_bias, layout=layout, outputs=(1, 1 + dim))
    if key_bias_correction and qkv_bias is not None:
        key_bias = layout.per_channel(qkv_bias[1 : 1 + dim], x.dtype)
        kept = ops.sum(weights, axis=axis, keepdims=True)
        kept = kept if total is None else divide_positive(kept, total)
        context = context + key_bias * (kept - 1.0)
    # ReLU(W_v x + b_v) as its own 1x1 conv, so converters fuse the ReLU into it.
    value = ops.relu(pointwise_conv(x, qkv_kernel, qkv_bias, layout=layout,
                                    outputs=(1 + dim, 1 + 2 * dim)))
    return out_projection(ops.multiply(value, context))


def transformer_layer(x, *, norm1: Callable, attention: Callable, norm2: Callable,
                      fc1: Callable, fc2: Callable, attention_output: Callable | None = None,
                      hidden: Callable | None = None, ffn_output: Callable | None = None):
    """The pre-norm layer: `x + Attn(GN1(x))`, then `x + fc2(SiLU(fc1(GN1(x))))`.

    Each argument is a callable on tokens (Keras layers, or the functions of this module
    with the layers' weights); `attention_output`, `hidden` and `ffn_output` wrap the
    attention output, the FFN hidden activation and the FFN output (dropout, stochastic
    depth) and are skipped when None. The sums and the product of `separable_attention` are
    `ops.add` / `ops.multiply` calls (the same graph as `+` and `*`).
    """
    y = attention(norm1(x))
    x = ops.add(x, y if attention_output is None else attention_output(y))
    y = ops.silu(fc1(norm2(x)))
    y = fc2(y if hidden is None else hidden(y))
    return ops.add(x, y if ffn_output is None else ffn_output(y))


# --------------------------------------------------------------------------------------
# Products of the attentions


def product(a, b, *, transpose_b: bool = False, constant_a: bool = False,
            constant_b: bool = False, softmax_a: bool = False,
            forms: ExportForms | None = None):
    """`a @ b` (or `a @ b^T` with `transpose_b`) over the last two axes, the others
    broadcast as `keras.ops.matmul`.

    `"as_written"` (`keras_mvit2.layers.export_forms`): `keras.ops.matmul`, `b` transposed
    first where asked. `"small_second"` (full int8, (8)): one BATCH_MATMUL with the second
    operand's adjoint flag (no TRANSPOSE of `b`), and computed as `(b a^T)^T` where `a` is a
    constant (`constant_a`: the fixed operand then comes second and is packed once, when the
    file loads) or has fewer elements than `b` (the second operand is the one XNNPACK packs
    on every invoke); the (small) result is transposed back. Static shapes decide, but a
    constant `b` (`constant_b`) and a softmax's output (`softmax_a`, first: its int8 zero
    point is fixed at -128, and XNNPACK takes a product only where the second operand's
    zero point is 0) stay where they are.
    """
    if _forms(forms).products == "as_written":
        return ops.matmul(a, _swap_last(b) if transpose_b else b)
    if not constant_b and (constant_a or (_smaller(a, b) and not softmax_a)):
        b_rows = b if transpose_b else _swap_last(b)      # (..., N, K)
        return _swap_last(backend_forms.matmul_transpose_b(b_rows, a))
    if transpose_b:
        return backend_forms.matmul_transpose_b(a, b)
    return ops.matmul(a, b)


def _swap_last(x):
    """`x` with its last two axes swapped: one TRANSPOSE (a static permutation)."""
    rank = len(x.shape)
    return ops.transpose(x, (*range(rank - 2), rank - 1, rank - 2))


def _smaller(a, b) -> bool:
    """Whether `a` has fewer elements per batch than `b` (False where a size is unknown)."""
    sizes = [a.shape[-2:], b.shape[-2:]]
    if any(d is None for shape in sizes for d in shape):
        return False
    return math.prod(sizes[0]) < math.prod(sizes[1])


# --------------------------------------------------------------------------------------
# Three-factor products in the cheaper association


def _fewer_macs_token_first(num_tokens, quadratic: int, linear: int) -> bool:
    """Whether a product costing `N^2 quadratic` multiply-adds (through an `N x N` matrix of
    the N tokens) takes fewer than its other association, `N linear` (False where N is not
    static)."""
    return num_tokens is not None and num_tokens * quadratic < linear


def kernel_attention(phi_q, phi_k, values, *, forms: ExportForms | None = None):
    """A linear (kernel) attention's numerator and denominator, per head: `phi_q phi_k^T v`
    `(B, M, N, d)` and `phi_q phi_k^T 1` `(B, M, N, 1)`, of `(B, M, N, F)` feature maps and
    `(B, M, N, d)` values; the numerator as `kernel_numerator` associates it. The
    denominator: the row sums of `phi_q phi_k^T` where that matrix is formed, else
    `phi_q . sum_t phi_k`."""
    num, scores = _associated_numerator(phi_q, phi_k, values, forms)
    if scores is not None:
        return num, ops.sum(scores, axis=-1, keepdims=True)
    key_sum = ops.sum(phi_k, axis=2, keepdims=True)                        # (B, M, 1, F)
    return num, ops.sum(phi_q * key_sum, axis=-1, keepdims=True)           # (B, M, N, 1)


def kernel_numerator(phi_q, phi_k, values, *, forms: ExportForms | None = None):
    """`phi_q phi_k^T v` per head `(B, M, N, d)`, of `(B, M, N, F)` feature maps and
    `(B, M, N, d)` values: the token mixing of every linear attention (RFA's numerator,
    Mobile-Attention's `q k^T (c v)`).

    Associated where it takes fewer multiply-adds (static shapes, every form): `(phi_q
    phi_k^T) v`, `N^2 (F + d)`, for few tokens (`N (F + d) < 2 F d`: RFA's 128 features and
    16-32 channels below about 28-51 tokens, e.g. every block at 64x64; Mobile-Attention's
    `F = d` below d tokens, e.g. its 4 and 1 tokens of 24 and 32 channels at 64x64), else
    `phi_q (phi_k^T v)`, `2 N F d`, the linear form. With few tokens the linear form's
    products are all per-invoke overhead (RFA's shapes, 16 batches x heads, 1 thread, Intel
    host: 16 tokens 31 against 73 us int8, 27 against 39 us float32; 4 tokens 29 against
    80 us int8; `benchmarks/results/int8_speed_intel/`, the kernels). The linear form keeps
    `phi_k^T v` as `(F, d)` in every form: its transpose `v^T phi_k` would give `phi_q (.)`
    a second operand XNNPACK packs row by row, but `v^T phi_k` itself then packs the
    `(N, F)` features column by column (256 tokens: 472 against 231 us int8).
    """
    return _associated_numerator(phi_q, phi_k, values, forms)[0]


def _associated_numerator(phi_q, phi_k, values, forms: ExportForms | None):
    """`(phi_q phi_k^T v, phi_q phi_k^T or None)`: see `kernel_numerator`."""
    num_tokens, features, channels = phi_q.shape[2], phi_q.shape[-1], values.shape[-1]
    if _fewer_macs_token_first(num_tokens, features + channels, 2 * features * channels):
        scores = product(phi_q, phi_k, transpose_b=True, forms=forms)      # (B, M, N, N)
        return product(scores, values, forms=forms), scores
    state = ops.matmul(_swap_last(phi_k), values)                          # (B, M, F, d)
    return product(phi_q, state, forms=forms), None


def linformer_attention(query, key, value, e, f, num_heads: int, softmax: Callable, *,
                        forms: ExportForms | None = None):
    """Linformer's attention (`keras_mvit2.layers.LinformerSelfAttention`) of the projected
    tokens `(B, k, D)`: `A_m (F v)_m` with `A_m = softmax(q_m (E k)_m^T / sqrt(hd))` over
    the p projected keys, `E, F` `(p, k)` -> `(B, H, k, hd)`.

    Associated where it takes fewer multiply-adds (static shapes, every form): for few
    tokens (`k (H p + D) < 2 p D`, e.g. k = 16, 4 and 1 at 64x64 with p = 256) the scores as
    `(q_m k_m^T) E^T` and the sum as `(A_m F) v_m`, `E^T` and `F` constant second operands
    (packed once, when a file loads), where the written `E k` and `F v` project a handful of
    tokens to p (the one token at 64x64 becomes a `(p, D)` outer product, an int8 MUL of
    131,072 values); else as written, `E k` and `F v` first. `softmax` (the layer's: the
    softmax over the last axis, then its dropout) maps the scores to the attention weights.
    `"small_second"` (full int8, (8)) takes `F v` in the layout XNNPACK packs row by row:
    `(F v)^T = v^T F^T`, `(B, D, p)` (one FULLY_CONNECTED), reshaped to `(B, H, hd, p)`
    without a transpose (the weighted sum at 16 tokens, `(16, 256) @ (256, 16)` for 16 heads
    x patch positions: 45 against 68 us int8, Intel host, the kernels of
    `benchmarks/results/int8_speed_intel/`); a float graph keeps `(B, H, p, hd)`, whose
    float product XNNPACK packs no slower (43 us).
    """
    num_tokens, dim = query.shape[1], query.shape[-1]
    p, head_dim = e.shape[0], dim // num_heads
    e, f = ops.cast(e, query.dtype), ops.cast(f, query.dtype)

    def heads(x):                                                        # (B, n, D) ->
        n = x.shape[1]
        return ops.transpose(ops.reshape(x, (-1, n, num_heads, head_dim)),
                             (0, 2, 1, 3))                              # (B, H, n, hd)

    query = heads(query) * ops.cast(1.0 / math.sqrt(head_dim), query.dtype)
    if _fewer_macs_token_first(num_tokens, 2 * (dim + num_heads * p), 4 * p * dim):
        scores = product(query, heads(key), transpose_b=True, forms=forms)  # (B, H, k, k)
        scores = product(scores, e, transpose_b=True, constant_b=True,
                         forms=forms)                                       # (B, H, k, p)
        weighted = product(softmax(scores), f, constant_b=True, forms=forms)  # (B, H, k, k)
        return product(weighted, heads(value), forms=forms)                 # (B, H, k, hd)
    projected_keys = heads(product(e, key, constant_a=True, forms=forms))  # (B, H, p, hd)
    weights = softmax(product(query, projected_keys, transpose_b=True, forms=forms))
    if _forms(forms).products == "as_written":
        projected = heads(product(f, value, constant_a=True, forms=forms))  # (B, H, p, hd)
        return product(weights, projected, softmax_a=True, forms=forms)
    projected_t = product(_swap_last(value), f, transpose_b=True, constant_b=True,
                          forms=forms)                                      # (B, D, p)
    projected_t = ops.reshape(projected_t, (-1, num_heads, head_dim, p))   # (B, H, hd, p)
    return product(weights, projected_t, transpose_b=True, softmax_a=True, forms=forms)


# --------------------------------------------------------------------------------------
# Mobile-Attention's flows


def flow_factor(x, eps: float, *, forms: ExportForms | None = None):
    """`x + eps`, a factor of Mobile-Attention's flow dot products; `x` itself under the
    `"omit"` flow epsilon (full int8, where eps is below one step; see
    `keras_mvit2.layers.export_forms`)."""
    return x if _forms(forms).flow_epsilon == "omit" else x + eps


def mobile_attention_flows(q, k, eps: float, *, forms: ExportForms | None = None) -> dict:
    """Mobile-Attention's flows (`keras_mvit2.layers.MobileAttention`) of `(B, M, N, d)`
    queries and keys after phi, each `(B, M, N)`.

    ```
    I = <q + eps, sum_h k + eps>,   O = <k + eps, sum_h q + eps>
    Ī = <q + eps, sum_h k / O + eps>,   Ō = <k + eps, sum_h q / I + eps>
    competition = N * softmax_over_tokens(clip(Ō, -1, 1)),   allocation = sigmoid(Ī)
    ```

    `<.,.>` sums the d channels, `sum_h` the M heads (kept, size 1); the divisions are
    `divide_positive`; every `+ eps` is `flow_factor` (omitted in full int8).
    """
    def plus(x):
        return flow_factor(x, eps, forms=forms)

    q_heads = ops.sum(q, axis=1, keepdims=True)                     # (B, 1, N, d)
    k_heads = ops.sum(k, axis=1, keepdims=True)                     # (B, 1, N, d)
    q_eps, k_eps = plus(q), plus(k)                                 # (B, M, N, d)
    incoming = ops.sum(q_eps * plus(k_heads), axis=-1)              # (B, M, N)  I
    outgoing = ops.sum(k_eps * plus(q_heads), axis=-1)              # (B, M, N)  O
    k_out = ops.sum(divide_positive(k, ops.expand_dims(outgoing, -1)), axis=1,
                    keepdims=True)                                  # (B, 1, N, d)
    q_in = ops.sum(divide_positive(q, ops.expand_dims(incoming, -1)), axis=1,
                   keepdims=True)                                   # (B, 1, N, d)
    conserved_in = ops.sum(q_eps * plus(k_out), axis=-1)            # (B, M, N)  Ī
    conserved_out = ops.sum(k_eps * plus(q_in), axis=-1)            # (B, M, N)  Ō
    clipped = ops.clip(conserved_out, -1.0, 1.0)                    # "for stability"
    competition = ops.softmax(clipped, axis=-1) * _num_tokens(q, 2)  # over the tokens
    return {
        "incoming": incoming,
        "outgoing": outgoing,
        "conserved_incoming": conserved_in,
        "conserved_outgoing": conserved_out,
        "competition": competition,
        "allocation": ops.sigmoid(conserved_in),                    # N_q / N_k = 1
    }


# --------------------------------------------------------------------------------------
# Unfold and fold


def unfold(x, patch_size: int = 2, *, layout: TokenLayout = CHANNELS_LAST,
           form: str | None = None):
    """`(B, H, W, C)` -> tokens `(B, N, P, C)` or `(B, C, P, N)`, N = (H/p)(W/p), P = p^2.

    `unfolded[b, i * nw + j, ph * p + pw, c] = x[b, p * i + ph, p * j + pw, c]` (the
    index mapping of ml-cvnets' `F.unfold` path), transposed for `CHANNELS_FIRST`.

    Forms (`form`, None: `export_forms.current().unfold`): `"space_to_depth"` and a
    reshape (no TRANSPOSE channels-last; any static or dynamic size), or
    `"depthwise_conv"`: a depthwise p x p stride-p 0/1 convolution and a reshape (no
    layout transpose in Core ML channels-first; static sizes).
    """
    form = _forms(None).unfold if form is None else form
    height, width, channels = x.shape[1], x.shape[2], x.shape[3]
    if (height is not None and height % patch_size) or (
        width is not None and width % patch_size
    ):
        raise ValueError(
            f"unfold needs a height and width divisible by patch_size={patch_size}. "
            f"Received: shape={tuple(x.shape)}"
        )
    area = patch_size * patch_size
    if form == "space_to_depth":
        x = backend_forms.space_to_depth(x, patch_size)
        if height is None or width is None:
            tokens = ops.reshape(x, (backend_forms.batch_size(x), -1, area, channels))
        else:
            num_patches = (height // patch_size) * (width // patch_size)
            tokens = ops.reshape(x, (-1, num_patches, area, channels))
        return tokens if layout.channels_last else ops.transpose(tokens, (0, 3, 2, 1))
    if form != "depthwise_conv":
        raise ValueError(f"Unknown unfold form {form!r}.")
    if height is None or width is None:
        raise ValueError("The 'depthwise_conv' unfold needs a static height and width.")
    patches = backend_forms.depthwise_patch_conv(x, patch_size)    # (B, rows, cols, C * P)
    num_patches = patches.shape[1] * patches.shape[2]
    if layout.channels_last:
        tokens = ops.reshape(patches, (-1, num_patches, channels, area))
        return ops.transpose(tokens, (0, 1, 3, 2))
    patches = ops.transpose(patches, (0, 3, 1, 2))  # cancels Core ML's own layout change
    return ops.reshape(patches, (-1, channels, area, num_patches))


def fold(tokens, grid_size, patch_size: int = 2, *, layout: TokenLayout = CHANNELS_LAST):
    """Tokens `(B, nh * nw, p * p, C)` or `(B, C, p * p, nh * nw)` -> `(B, nh * p, nw * p, C)`.

    The inverse of `unfold`. `grid_size` is `(nh, nw)`: ints, or scalar int tensors for a
    dynamic grid (`CHANNELS_LAST`).
    """
    rows, cols = grid_size
    if layout.channels_last:
        channels = tokens.shape[-1]
        x = ops.reshape(tokens, [-1, rows, cols, patch_size * patch_size * channels])
    else:
        channels, area = tokens.shape[1], tokens.shape[2]
        x = ops.transpose(tokens, (0, 2, 1, 3))                       # (B, P, C, N)
        x = ops.reshape(x, (-1, area * channels, rows, cols))          # channel k * C + c
        x = ops.transpose(x, (0, 2, 3, 1))  # cancels Core ML's own layout change
    return backend_forms.depth_to_space(x, patch_size)


def transform_patches(features, grid_size, patch_size: int, layers: Sequence[Callable],
                      norm: Callable, *, layout: TokenLayout = CHANNELS_LAST,
                      unfold_form: str | None = None):
    """The MobileViTv2 block's global part: unfold, transformer layers, GN1, fold.

    Args:
        features: `(B, H, W, d)`, H and W multiples of `patch_size`.
        grid_size: `(H / p, W / p)`.
        layers: the transformer layers, callables on tokens in `layout`.
        norm: the final GN1, a callable on tokens in `layout`.

    Returns:
        `(B, H, W, d)`.
    """
    tokens = unfold(features, patch_size, layout=layout, form=unfold_form)
    for layer in layers:
        tokens = layer(tokens)
    return fold(norm(tokens), grid_size, patch_size, layout=layout)
