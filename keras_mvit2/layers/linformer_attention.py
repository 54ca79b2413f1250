"""Linformer self-attention (Wang et al. 2020): keys and values projected along the tokens."""

from typing import ClassVar

import keras
from keras import ops

from keras_mvit2.api_export import serializable
from keras_mvit2.layers import attention_registry
from keras_mvit2.layers.functional import linformer_attention
from keras_mvit2.layers.multi_head_attention import (
    SOFTMAX_FLOAT_ISLAND,
    dense_on_tokens,
    head_dim_of,
    merge_heads,
    softmax_last_axis,
)
from keras_mvit2.layers.token_mixer import TokenMixer
from keras_mvit2.utils.arguments import validate_positive_ints, validate_rates


def token_projection_initializer() -> keras.initializers.Initializer:
    """fairseq's init of E and F: `xavier_uniform_(gain=1/sqrt(2))` on the `(p, k)` matrix.

    Bound `sqrt(6 / (k + p)) / sqrt(2)`, i.e. variance `1 / (k + p)`: a sum over
    the k tokens keeps the scale of the keys and values (variance `k / (k + p)`).
    """
    return keras.initializers.VarianceScaling(scale=0.5, mode="fan_avg", distribution="uniform")


@attention_registry.register("linformer")
@serializable
class LinformerSelfAttention(TokenMixer):
    """Linformer self-attention: softmax attention over p projected keys and values.

    For tokens `x` (k of them, width D; `k` is the paper's `n`), `M = num_heads`
    heads of width `D_h = D / M`, and learned `E, F` of shape `(p, k)` shared by
    all heads (`F = E` when `share_kv`):

    ```
    [q | k | v] = x U_qkv + b_qkv                  # (k, 3D), as MultiHeadSelfAttention
    K' = E k,  V' = F v                             # (p, D): the token axis k -> p
    A_m = softmax(q_m K'_m^T / sqrt(D_h)) over p    # (k, p) per head, never (k, k)
    y = [A_1 V'_1; ...; A_M V'_M] U_out + b_out
    ```

    Cost O(k p D) time and O(M k p) memory for the attention, linear in k for a
    fixed p. This is the Linformer baseline of the MobileViTv2 paper (Fig. 3b,
    Table 1). Sublayers `qkv` and `proj` have the same layout as
    `MultiHeadSelfAttention`; the weights `E` and `F` are `(p, k)` matrices
    (fairseq's `compress_k.weight` / `compress_v.weight`; lucidrains' `proj_k`
    is their transpose). Unlike fairseq, E is applied to the projected keys
    (not to the input before `k_proj`), so the key bias goes through E as in
    the paper's formula. E and F are initialized as fairseq does:
    `xavier_uniform_` with gain `1/sqrt(2)` (variance `1 / (k + p)`).

    The token count k is fixed when the layer is built, from the input shape:
    E and F have exactly k columns. Calling a built layer on a different number
    of tokens raises a `ValueError` (no silent slicing or zero padding, unlike
    fairseq): build a new layer / model for another resolution. An unknown
    (`None`) token count at build time is an error too. In the MobileViT layout
    k is the number of patches of the block's feature map, so each block of
    `MobileViTV2` gets its own k (e.g. 256 / 64 / 16 at 256x256 input).

    `projected_tokens >= k` is allowed: the formula is still defined (E then
    maps k tokens to p >= k mixtures of them), but there is no saving over
    `MultiHeadSelfAttention` and the attention costs O(k p D) >= O(k^2 D). The
    default `projected_tokens=256` is such a case in every block of MobileViTv2
    at 256x256 (k = 256, 64, 16); pass a smaller p to get the linear regime.

    Args:
        num_heads: int. Number of heads M; the token width must be divisible
            by it. Defaults to `4`.
        projected_tokens: int. p, the number of projected keys / values.
            Defaults to `256`.
        qkv_bias: bool. Bias in the qkv projection. Defaults to `True`.
        share_kv: bool. One projection for keys and values (`F = E`, the
            paper's key-value sharing); the qkv projection is not shared.
            Defaults to `False`.
        attn_dropout: float. Dropout on the `(k, p)` attention weights.
            Defaults to `0.0`.

    Call arguments:
        inputs: tokens, see below.
        training: bool, enables the attention dropout.

    Input shape:
        `(batch, num_tokens, dim)` or the unfolded MobileViT layout
        `(batch, num_patches, patch_area, dim)` (attention over the patches),
        with a static `num_tokens` / `num_patches`.

    Output shape:
        Same as the input.

    Example:
    >>> x = keras.random.normal((2, 64, 32))
    >>> keras_mvit2.layers.LinformerSelfAttention(projected_tokens=16)(x).shape
    (2, 64, 32)

    Reference:
        Wang, Li, Khabsa, Fang & Ma, "Linformer: Self-Attention with Linear
        Complexity", arXiv:2006.04768, 2020; fairseq
        `examples/linformer/.../multihead_linear_attention.py`.
    """

    #: The attention weights' SOFTMAX in float in a mixed int8 file, as MHA's.
    int8_float_ops: ClassVar[frozenset[str]] = SOFTMAX_FLOAT_ISLAND

    def __init__(
        self,
        num_heads: int = 4,
        projected_tokens: int = 256,
        qkv_bias: bool = True,
        share_kv: bool = False,
        attn_dropout: float = 0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        validate_positive_ints(
            "LinformerSelfAttention", num_heads=num_heads, projected_tokens=projected_tokens)
        validate_rates(attn_dropout=attn_dropout)
        self.num_heads = num_heads
        self.projected_tokens = projected_tokens
        self.qkv_bias = qkv_bias
        self.share_kv = share_kv
        self.attn_dropout = attn_dropout

    def build_tokens(self, token_shape):
        num_tokens, dim = token_shape[1], int(token_shape[-1])
        if num_tokens is None:
            raise ValueError(
                "LinformerSelfAttention needs a fixed number of tokens k at build time "
                "(E and F have shape (projected_tokens, k)); build it on an input with a "
                f"static token axis. Received: token shape={tuple(token_shape)}"
            )
        self.num_tokens = int(num_tokens)
        self.head_dim = head_dim_of("LinformerSelfAttention", dim, self.num_heads)
        self.dim = dim
        policy = self.dtype_policy
        self.qkv = dense_on_tokens(3 * dim, self.qkv_bias, "qkv", policy)
        self.qkv.build(tuple(token_shape))
        self.proj = dense_on_tokens(dim, True, "proj", policy)
        self.proj.build(tuple(token_shape))
        shape = (self.projected_tokens, self.num_tokens)
        self.e = self.add_weight(
            name="E", shape=shape, initializer=token_projection_initializer()
        )
        self.f = self.e if self.share_kv else self.add_weight(
            name="F", shape=shape, initializer=token_projection_initializer()
        )
        self.attn_drop = keras.layers.Dropout(self.attn_dropout, dtype=policy)

    def _check_tokens(self, num_tokens) -> None:
        if num_tokens is not None and num_tokens != self.num_tokens:
            raise ValueError(
                "LinformerSelfAttention needs a fixed token count k: E and F project "
                f"exactly k={self.num_tokens} tokens (the count it was built with) to "
                f"p={self.projected_tokens}, but the input has {num_tokens} tokens. "
                "Rebuild the layer (or the model) for the new input resolution. "
                f"Received: num_tokens={num_tokens}, built for num_tokens={self.num_tokens}"
            )

    def mix(self, tokens, training=None):
        self._check_tokens(tokens.shape[1])
        qkv = self.qkv(tokens)                                     # (B, k, 3D)
        query, key, value = ops.split(qkv, 3, axis=-1)             # 3 x (B, k, D)

        def softmax(scores):                                       # over the p keys
            return self.attn_drop(softmax_last_axis(scores), training=training)

        out = linformer_attention(query, key, value, self.e, self.f, self.num_heads,
                                  softmax)                          # (B, H, k, hd)
        return self.proj(merge_heads(out))                         # (B, k, D)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "projected_tokens": self.projected_tokens,
                "qkv_bias": self.qkv_bias,
                "share_kv": self.share_kv,
                "attn_dropout": self.attn_dropout,
            }
        )
        return config
