"""Multi-head self-attention (ViT's MSA, Dosovitskiy et al. 2021, eq. 5-8), timm layout."""

import math
import warnings
from typing import ClassVar

import keras
from keras import ops

from keras_mvit2.api_export import serializable
from keras_mvit2.layers import attention_registry
from keras_mvit2.layers.functional import product
from keras_mvit2.layers.initializers import clone_initializer
from keras_mvit2.layers.token_mixer import TokenMixer
from keras_mvit2.utils.arguments import validate_positive_ints, validate_rates


def split_heads(x, num_heads: int, head_dim: int):
    """`(batch, tokens, heads * head_dim)` -> `(batch, heads, tokens, head_dim)`.

    Head h owns channels `[h * head_dim, (h + 1) * head_dim)`, as timm's
    `reshape(B, N, heads, head_dim)`. Rank stays <= 4.
    """
    num_tokens = x.shape[1] if x.shape[1] is not None else ops.shape(x)[1]
    x = ops.reshape(x, (-1, num_tokens, num_heads, head_dim))    # (B, N, H, hd)
    return ops.transpose(x, (0, 2, 1, 3))                        # (B, H, N, hd)


def merge_heads(x):
    """`(batch, heads, tokens, head_dim)` -> `(batch, tokens, heads * head_dim)` (concat heads)."""
    num_heads, head_dim = x.shape[1], x.shape[3]
    x = ops.transpose(x, (0, 2, 1, 3))                           # (B, N, H, hd)
    num_tokens = x.shape[1] if x.shape[1] is not None else ops.shape(x)[1]
    return ops.reshape(x, (-1, num_tokens, num_heads * head_dim))


#: What a full-int8 file of a softmax attention over keys computes in float (its declared
#: `int8_float_ops`): `to_tflite(..., allow_float_ops=True)` runs each attention weights'
#: SOFTMAX in float inside XNNPACK, between a DEQUANTIZE and a QUANTIZE of the same int8
#: tensors (`keras_mvit2.export.tflite.int8_kernels.float_softmax_islands`). LiteRT's int8
#: SOFTMAX is a kernel of its own, on one thread: MobileViTV2-0.5 with MHA at 256x256 takes
#: 1.92x the island file's time with it at 2 threads, slower than its float32 file (Linformer
#: 2.06x; Intel host, `benchmarks/results/int8_speed_intel/`, the variants). Without
#: `allow_float_ops` the file stays integer-only, with LiteRT's int8 SOFTMAX.
SOFTMAX_FLOAT_ISLAND = frozenset({"DEQUANTIZE", "QUANTIZE", "SOFTMAX"})


def softmax_last_axis(x):
    """`ops.softmax(x, axis=-1)` (TFLite SOFTMAX), computed in float32.

    Under mixed precision the scores are cast to float32 for the softmax and
    the weights cast back (no cast op in a float32 graph). Keras' warning about
    a size-1 axis is silenced: with one key (e.g. the 1-patch last stage of
    MobileViTv2 at 64x64) the attention weight is exactly 1, which is correct.
    """
    dtype = keras.backend.standardize_dtype(x.dtype)
    if dtype != "float32":
        return ops.cast(softmax_last_axis(ops.cast(x, "float32")), dtype)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="You are using a softmax over axis")
        return ops.softmax(x, axis=-1)


def dense_on_tokens(units: int, use_bias: bool, name: str, dtype,
                    kernel_initializer="glorot_uniform", bias_initializer="zeros",
                    rank: int = 3) -> keras.layers.EinsumDense:
    """A per-token linear map on the last axis of a rank-3 (or rank-4) tensor, kernel `(d, units)`.

    `EinsumDense` rather than `Dense`: on 3-D input it lowers to one
    FULLY_CONNECTED in TFLite, without the shape ops that `Dense` adds. Each call
    gets its own clone of the initializers.
    """
    if rank == 3:
        equation, output_shape, bias_axes = "abc,cd->abd", (None, units), "d"
    else:
        equation, output_shape, bias_axes = "abcd,de->abce", (None, None, units), "e"
    return keras.layers.EinsumDense(
        equation,
        output_shape=output_shape,
        bias_axes=bias_axes if use_bias else None,
        kernel_initializer=clone_initializer(kernel_initializer),
        bias_initializer=clone_initializer(bias_initializer),
        name=name,
        dtype=dtype,
    )


def head_dim_of(layer_name: str, dim: int, num_heads: int) -> int:
    if dim % num_heads:
        raise ValueError(
            f"{layer_name}: the token width must be divisible by num_heads. "
            f"Received: dim={dim}, num_heads={num_heads}"
        )
    return dim // num_heads


@attention_registry.register("mha", "multi_head", "transformer")
@serializable
class MultiHeadSelfAttention(TokenMixer):
    """Multi-head self-attention, ViT's MSA (eq. 5-8 of Dosovitskiy et al.).

    For tokens `z` (N of them, width D), `M = num_heads` heads of width
    `D_h = D / M`:

    ```
    [q | k | v] = z U_qkv + b_qkv                  # U_qkv: (D, 3D), eq. (5)
    q_m, k_m, v_m = channels [m D_h, (m+1) D_h) of q, k, v
    A_m = softmax(q_m k_m^T / sqrt(D_h)) over keys  # (N, N), eq. (6)
    SA_m = A_m v_m                                  # eq. (7)
    y = [SA_1; ...; SA_M] U_msa + b_msa             # U_msa: (D, D), eq. (8)
    ```

    Cost O(N^2 D) time and O(M N^2) memory (the attention matrices): this is
    the quadratic baseline ("Transformer") of the MobileViTv2 paper's Table 1.

    Weight layout (so timm `Attention` weights port by transposition only):
    sublayer `qkv` is an `EinsumDense` with kernel `(D, 3D)` = timm's
    `attn.qkv.weight.T`, output ordered `[q | k | v]`, each split into heads
    head-major as timm's `qkv.reshape(B, N, 3, heads, head_dim)`; sublayer
    `proj` has kernel `(D, D)` = `attn.proj.weight.T` and a bias. Kernels are
    Glorot-uniform (= PyTorch `xavier_uniform_`), biases zero. No tensor of
    rank > 4 is created (q, k and v are split before the head reshape). Under
    mixed precision the softmax is computed in float32.

    Args:
        num_heads: int. Number of heads M; the token width must be divisible
            by it. Defaults to `4`.
        qkv_bias: bool. Bias in the qkv projection (timm's `qkv_bias`; DeiT and
            MobileViT v1 use `True`). Defaults to `True`.
        attn_dropout: float. Dropout on the attention weights A. Defaults to `0.0`.
        proj_dropout: float. Dropout after the output projection. Defaults to `0.0`.

    Call arguments:
        inputs: tokens, see below.
        training: bool, enables the dropouts.

    Input shape:
        `(batch, num_tokens, dim)` or the unfolded MobileViT layout
        `(batch, num_patches, patch_area, dim)` (attention over the patches,
        separately for each pixel position; see `TokenMixer`).

    Output shape:
        Same as the input.

    Example:
    >>> x = keras.random.normal((2, 16, 32))
    >>> keras_mvit2.layers.MultiHeadSelfAttention(num_heads=4)(x).shape
    (2, 16, 32)

    Reference:
        Dosovitskiy et al., "An Image is Worth 16x16 Words: Transformers for
        Image Recognition at Scale", ICLR 2021, eq. (5)-(8); timm
        `timm.layers.attention.Attention`.
    """

    int8_float_ops: ClassVar[frozenset[str]] = SOFTMAX_FLOAT_ISLAND

    def __init__(
        self,
        num_heads: int = 4,
        qkv_bias: bool = True,
        attn_dropout: float = 0.0,
        proj_dropout: float = 0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        validate_positive_ints("MultiHeadSelfAttention", num_heads=num_heads)
        validate_rates(attn_dropout=attn_dropout, proj_dropout=proj_dropout)
        self.num_heads = num_heads
        self.qkv_bias = qkv_bias
        self.attn_dropout = attn_dropout
        self.proj_dropout = proj_dropout

    def build_tokens(self, token_shape):
        dim = int(token_shape[-1])
        self.head_dim = head_dim_of("MultiHeadSelfAttention", dim, self.num_heads)
        self.dim = dim
        policy = self.dtype_policy
        self.qkv = dense_on_tokens(3 * dim, self.qkv_bias, "qkv", policy)
        self.qkv.build(tuple(token_shape))
        self.proj = dense_on_tokens(dim, True, "proj", policy)
        self.proj.build(tuple(token_shape))
        self.attn_drop = keras.layers.Dropout(self.attn_dropout, dtype=policy)
        self.proj_drop = keras.layers.Dropout(self.proj_dropout, dtype=policy)

    def mix(self, tokens, training=None):
        qkv = self.qkv(tokens)                                     # (B, N, 3D)
        query, key, value = ops.split(qkv, 3, axis=-1)             # 3 x (B, N, D)
        query = split_heads(query, self.num_heads, self.head_dim)  # (B, H, N, hd)
        key = split_heads(key, self.num_heads, self.head_dim)      # (B, H, N, hd)
        value = split_heads(value, self.num_heads, self.head_dim)  # (B, H, N, hd)
        query = query * ops.cast(1.0 / math.sqrt(self.head_dim), query.dtype)
        scores = product(query, key, transpose_b=True)              # (B, H, N, N)
        weights = softmax_last_axis(scores)                        # over keys (last axis)
        weights = self.attn_drop(weights, training=training)
        out = product(weights, value, softmax_a=True)              # (B, H, N, hd)
        out = self.proj(merge_heads(out))                          # (B, N, D)
        return self.proj_drop(out, training=training)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "qkv_bias": self.qkv_bias,
                "attn_dropout": self.attn_dropout,
                "proj_dropout": self.proj_dropout,
            }
        )
        return config
