"""The MobileViT v1 block (Mehta & Rastegari, ICLR 2022, Fig. 1b), timm's `MobileVitBlock`."""

import math

import keras
from keras import ops

from keras_mvit2.api_export import serializable
from keras_mvit2.backend import forms as backend_forms
from keras_mvit2.layers import attention_registry
from keras_mvit2.layers.initializers import clone_initializer, conv_kernel_initializer
from keras_mvit2.layers.inverted_residual import batch_norm
from keras_mvit2.layers.patching import (
    fold,
    resize_if_needed,
    round_up_to_patch,
    spatial_size,
    unfold,
)
from keras_mvit2.models.vit.vit_layers import ViTBlock


def resize_bilinear(x, size: tuple):
    """Bilinear resize as PyTorch's `F.interpolate(mode="bilinear", align_corners=False)`.

    Half-pixel centers and no antialiasing, in both directions; converts to the
    TFLite builtin RESIZE_BILINEAR (`half_pixel_centers=True`). `size` holds ints or
    scalar int tensors.
    """
    return backend_forms.resize_bilinear(x, size, align_corners=False)


@serializable
class MobileViTBlock(keras.layers.Layer):
    """MobileViT v1 block: local convolutions, global transformer, fusion with the input.

    ```
    x -> conv 3x3 + BN + SiLU -> conv 1x1 C -> d (no bias, no norm)
      -> [bilinear resize up to a multiple of the patch, when needed]
      -> unfold into (N patches, P = patch_size^2 pixels)
      -> num_layers x ViTBlock (pre-norm LayerNorm, MHA, MLP ratio 2, SiLU) -> LayerNorm
      -> fold -> [bilinear resize back to the input size]
      -> conv 1x1 d -> filters + BN + SiLU
      -> concat([block input, x]) -> conv 3x3 + BN + SiLU   (the fusion)
    ```

    The attention runs over the N patches separately for each of the P pixel
    positions, on the rank-4 layout `(batch, N, P, d)` (see `TokenMixer`).
    Unlike MobileViTv2, the output keeps the input's height and width: an input
    whose sides are not multiples of `patch_size` is resized up with bilinear
    interpolation (half-pixel centers, as timm's `align_corners=False`) before
    the unfold and back down after the fold, as timm does.

    Sublayers (timm names): `conv_kxk` + `conv_kxk_bn`, `conv_1x1`,
    `transformer_{i}` (`ViTBlock`), `norm`, `conv_proj` + `conv_proj_bn`,
    `conv_fusion` + `conv_fusion_bn`.

    Args:
        transformer_dim: int. Width d of the tokens.
        num_layers: int. Number of transformer blocks L.
        attention: the attention of every transformer block: a name of
            `keras_mvit2.attention.available()`, a config dict or a layer.
            Defaults to `"mha"` (the paper).
        num_heads: int. Heads, for the mechanisms that take it. Defaults to `4`.
        mlp_ratio: float. MLP hidden width = `int(d * mlp_ratio)`. Defaults to `2.0`.
        filters: int or None. Output channels; defaults to the input channels.
        patch_size: int. Patch height and width. Defaults to `2`.
        fusion: bool. Concatenate the block input and fuse with a 3x3 conv (the
            paper). Defaults to `True`.
        attn_dropout: float. Dropout on the attention weights.
        dropout: float. Dropout on the attention and MLP outputs.
        norm_epsilon: float. Epsilon of the BatchNorms and LayerNorms. Defaults
            to `1e-5` (timm / ml-cvnets).
        kernel_initializer: initializer of the convolution kernels. Defaults to
            He-normal with fan-out, as the reference.

    Input shape:
        `(batch, height, width, channels)`; height and width may be `None` (the patch
        grid and the resizes are then computed from each call's input).

    Output shape:
        `(batch, height, width, filters or channels)`.

    Example:
    >>> x = keras.random.normal((1, 16, 16, 48))
    >>> keras_mvit2.models.MobileViTBlock(64, num_layers=2)(x).shape
    (1, 16, 16, 48)

    Reference:
        Mehta & Rastegari, "MobileViT: Light-weight, General-purpose, and
        Mobile-friendly Vision Transformer", ICLR 2022; timm
        `timm.models.mobilevit.MobileVitBlock`.
    """

    def __init__(
        self,
        transformer_dim: int,
        num_layers: int,
        attention="mha",
        num_heads: int = 4,
        mlp_ratio: float = 2.0,
        filters: int | None = None,
        patch_size: int = 2,
        fusion: bool = True,
        attn_dropout: float = 0.0,
        dropout: float = 0.0,
        norm_epsilon: float = 1e-5,
        kernel_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if transformer_dim <= 0 or num_layers <= 0 or patch_size <= 0:
            raise ValueError(
                "transformer_dim, num_layers and patch_size must be positive. Received: "
                f"transformer_dim={transformer_dim}, num_layers={num_layers}, "
                f"patch_size={patch_size}"
            )
        if filters is not None and filters <= 0:
            raise ValueError(f"filters must be positive or None. Received: filters={filters}")
        self.transformer_dim = transformer_dim
        self.num_layers = num_layers
        self.attention = attention
        self.num_heads = num_heads
        self.mlp_ratio = mlp_ratio
        self.filters = filters
        self.patch_size = patch_size
        self.fusion = fusion
        self.attn_dropout = attn_dropout
        self.dropout = dropout
        self.norm_epsilon = norm_epsilon
        self.kernel_initializer = conv_kernel_initializer(kernel_initializer)

    def _padded_hw(self, height: int | None, width: int | None) -> tuple[int | None, int | None]:
        p = self.patch_size
        return tuple(None if s is None else math.ceil(s / p) * p for s in (height, width))

    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(
                "MobileViTBlock expects (batch, height, width, channels). "
                f"Received: input_shape={input_shape}"
            )
        batch, height, width, channels = input_shape
        if channels is None:
            raise ValueError(
                "MobileViTBlock needs a known number of channels. "
                f"Received: input_shape={input_shape}"
            )
        d = self.transformer_dim
        out = self.filters or channels
        policy = self.dtype_policy
        def init():
            return clone_initializer(self.kernel_initializer)

        eps = self.norm_epsilon

        def conv(filters, kernel, name):
            return keras.layers.Conv2D(
                filters, kernel, padding="same", use_bias=False, kernel_initializer=init(),
                name=name, dtype=policy,
            )

        self.conv_kxk = conv(channels, 3, "conv_kxk")
        self.conv_kxk_bn = batch_norm("conv_kxk_bn", eps, policy)
        self.conv_1x1 = conv(d, 1, "conv_1x1")
        self.transformer = [
            ViTBlock(
                num_heads=self.num_heads,
                mlp_ratio=self.mlp_ratio,
                attention=self.attention,
                activation="silu",
                attn_dropout=self.attn_dropout,
                dropout=self.dropout,
                norm_epsilon=eps,
                name=f"transformer_{i}",
                dtype=policy,
            )
            for i in range(self.num_layers)
        ]
        self.norm = keras.layers.LayerNormalization(epsilon=eps, name="norm", dtype=policy)
        self.conv_proj = conv(out, 1, "conv_proj")
        self.conv_proj_bn = batch_norm("conv_proj_bn", eps, policy)
        feature_shape = (batch, height, width, channels)
        out_shape = (batch, height, width, out)
        self.conv_kxk.build(feature_shape)
        self.conv_kxk_bn.build(feature_shape)
        self.conv_1x1.build(feature_shape)
        p = self.patch_size
        padded_h, padded_w = self._padded_hw(height, width)
        num_patches = (
            None if padded_h is None or padded_w is None else (padded_h // p) * (padded_w // p)
        )
        token_shape = (batch, num_patches, p * p, d)
        for layer in self.transformer:
            layer.build(token_shape)
        self.norm.build(token_shape)
        self.conv_proj.build((batch, height, width, d))
        self.conv_proj_bn.build(out_shape)
        if self.fusion:
            self.conv_fusion = conv(out, 3, "conv_fusion")
            self.conv_fusion_bn = batch_norm("conv_fusion_bn", eps, policy)
            self.conv_fusion.build((batch, height, width, channels + out))
            self.conv_fusion_bn.build(out_shape)

    def patch_tokens(self, inputs, training=None):
        """The tokens fed to the first transformer block, `(batch, N, P, transformer_dim)`."""
        x = ops.silu(self.conv_kxk_bn(self.conv_kxk(inputs), training=training))
        x = self.conv_1x1(x)                                          # (B, H, W, d)
        padded = round_up_to_patch(spatial_size(x), self.patch_size)
        x = resize_if_needed(x, padded, resize_bilinear)              # (B, H', W', d)
        return unfold(x, self.patch_size)                             # (B, N, P, d)

    def call(self, inputs, training=None):
        size = spatial_size(inputs)
        padded = round_up_to_patch(size, self.patch_size)
        p = self.patch_size
        tokens = self.patch_tokens(inputs, training=training)        # (B, N, P, d)
        for layer in self.transformer:
            tokens = layer(tokens, training=training)
        tokens = self.norm(tokens)
        x = fold(tokens, tuple(side // p for side in padded), p)     # (B, H', W', d)
        x = resize_if_needed(x, size, resize_bilinear)               # (B, H, W, d)
        x = ops.silu(self.conv_proj_bn(self.conv_proj(x), training=training))  # (B, H, W, C')
        if not self.fusion:
            return x
        x = ops.concatenate([inputs, x], axis=-1)                    # (B, H, W, C + C')
        return ops.silu(self.conv_fusion_bn(self.conv_fusion(x), training=training))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:3]) + (self.filters or input_shape[3],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "transformer_dim": self.transformer_dim,
                "num_layers": self.num_layers,
                "attention": attention_registry.serialize(self.attention),
                "num_heads": self.num_heads,
                "mlp_ratio": self.mlp_ratio,
                "filters": self.filters,
                "patch_size": self.patch_size,
                "fusion": self.fusion,
                "attn_dropout": self.attn_dropout,
                "dropout": self.dropout,
                "norm_epsilon": self.norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
