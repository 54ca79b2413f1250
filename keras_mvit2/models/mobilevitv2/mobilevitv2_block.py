"""The MobileViTv2 block: local convolution, separable-attention transformer, projection."""

import functools
import math

import keras
from keras import ops

from keras_mvit2.api_export import serializable
from keras_mvit2.backend import forms as backend_forms
from keras_mvit2.layers import attention_registry, export_forms, functional

# Importable from here, as before (keras_mvit2.export.coreml.layout imports it).
from keras_mvit2.layers.group_norm import GroupNorm1
from keras_mvit2.layers.initializers import clone_initializer, conv_kernel_initializer
from keras_mvit2.layers.inverted_residual import batch_norm
from keras_mvit2.layers.patching import (
    resize_if_needed,
    round_up_to_patch,
    spatial_size,
)
from keras_mvit2.layers.transformer_layer import TransformerLayer

__all__ = ["MobileViTV2Block"]

def _resize_align_corners(x, size):
    """Bilinear resize with `align_corners=True` (ml-cvnets / timm), to ints or tensors."""
    return backend_forms.resize_bilinear(x, size, align_corners=True)


@serializable
class MobileViTV2Block(keras.layers.Layer):
    """MobileViTv2 block (Fig. 6 / Table 6 of the paper, ml-cvnets `MobileViTBlockv2`).

    ```
    x  -> [bilinear resize, align_corners, when a side is not a multiple of the patch]
       -> depthwise 3x3 + BN + SiLU -> 1x1 conv C -> d (no bias, no norm)
       -> unfold into (N patches, P = patch_size^2 pixels)
       -> num_layers x TransformerLayer -> GN1
       -> fold -> 1x1 conv d -> C (no bias) + BN
    ```

    There is no residual around the block and no fusion (unlike MobileViT v1).
    Like the reference, an input whose height or width is not a multiple of
    `patch_size` is upsized to the next multiple and the output keeps that
    larger size (e.g. a 224x224 image gives a 8x8 final feature map).

    The patch grid and the resize are decided at each call from the input's size:
    with a static height and width (a model built for one size, or any model
    traced for one size, as the exporters do) they are constants of the graph;
    with an unknown one (`input_shape=(None, None, 3)`) the grid is read from the
    tensor's runtime shape and the resize runs only when a side is not a multiple
    of `patch_size` (a `tf.cond` on TensorFlow).

    Args:
        attention_dim: int. Width d of the attention tokens.
        num_layers: int. Number of transformer layers (B in Table 6).
        attention: the attention of every transformer layer: a name of
            `keras_mvit2.attention.available()`, a config dict or a layer.
            Defaults to `"separable"` (the paper).
        ffn_dim: int. FFN hidden width. Defaults to `2 * attention_dim` floored
            to a multiple of 16.
        patch_size: int. Patch height and width. Defaults to `2`.
        attn_dropout: float. Dropout on the context scores.
        dropout: float. Dropout on the attention and FFN outputs.
        ffn_dropout: float. Dropout after the FFN activation.
        norm_epsilon: float. Epsilon of BN and GN1. Defaults to `1e-5`.
        kernel_initializer: initializer of all convolution kernels. Defaults to
            He-normal with fan-out, as the reference.
        drop_path: float or list of `num_layers` floats, each in [0, 1).
            Stochastic depth rate of the residual branches of each transformer
            layer (one float: the same for all). Defaults to `0.0`.

    Input shape:
        `(batch, height, width, channels)`; height and width may be `None`.

    Output shape:
        `(batch, ceil(height / p) * p, ceil(width / p) * p, channels)`.

    Example:
    >>> x = keras.random.normal((1, 16, 16, 64))
    >>> keras_mvit2.models.MobileViTV2Block(32, num_layers=2)(x).shape
    (1, 16, 16, 64)
    """

    def __init__(
        self,
        attention_dim: int,
        num_layers: int,
        attention="separable",
        ffn_dim: int | None = None,
        patch_size: int = 2,
        attn_dropout: float = 0.0,
        dropout: float = 0.0,
        ffn_dropout: float = 0.0,
        norm_epsilon: float = 1e-5,
        kernel_initializer=None,
        drop_path: float | list[float] = 0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if attention_dim <= 0 or num_layers <= 0 or patch_size <= 0:
            raise ValueError(
                "attention_dim, num_layers and patch_size must be positive. Received: "
                f"attention_dim={attention_dim}, num_layers={num_layers}, patch_size={patch_size}"
            )
        if isinstance(drop_path, list | tuple):
            if len(drop_path) != num_layers:
                raise ValueError(
                    f"drop_path must be a float or a list of num_layers={num_layers} floats. "
                    f"Received: drop_path={drop_path}"
                )
            drop_path = [float(r) for r in drop_path]
        else:
            drop_path = float(drop_path)
        for rate in drop_path if isinstance(drop_path, list) else [drop_path]:
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"drop_path rates must be in [0, 1). Received: drop_path={rate}")
        self.drop_path = drop_path
        self.attention_dim = attention_dim
        self.num_layers = num_layers
        self.attention = attention
        self.ffn_dim = ffn_dim
        self.patch_size = patch_size
        self.attn_dropout = attn_dropout
        self.dropout = dropout
        self.ffn_dropout = ffn_dropout
        self.norm_epsilon = norm_epsilon
        self.kernel_initializer = conv_kernel_initializer(kernel_initializer)

    def _drop_path_rate(self, index: int) -> float:
        if isinstance(self.drop_path, list):
            return self.drop_path[index]
        return self.drop_path

    def _resized_hw(self, height: int | None, width: int | None) -> tuple[int | None, int | None]:
        p = self.patch_size
        return tuple(None if s is None else math.ceil(s / p) * p for s in (height, width))

    def build(self, input_shape):
        if len(input_shape) != 4 or input_shape[-1] is None:
            raise ValueError(
                "MobileViTV2Block expects (batch, height, width, channels) with a known "
                f"channel axis. Received: input_shape={input_shape}"
            )
        batch, height, width, channels = input_shape
        height, width = self._resized_hw(height, width)
        d = self.attention_dim
        policy = self.dtype_policy
        def init():
            return clone_initializer(self.kernel_initializer)

        self.local_conv = keras.layers.DepthwiseConv2D(
            3, padding="same", use_bias=False, depthwise_initializer=init(), name="local_conv",
            dtype=policy,
        )
        self.local_bn = batch_norm("local_bn", self.norm_epsilon, policy)
        self.local_proj = keras.layers.Conv2D(
            d, 1, use_bias=False, kernel_initializer=init(), name="local_proj", dtype=policy
        )
        self.transformer = [
            TransformerLayer(
                attention=self.attention,
                ffn_dim=self.ffn_dim,
                attn_dropout=self.attn_dropout,
                dropout=self.dropout,
                ffn_dropout=self.ffn_dropout,
                norm_epsilon=self.norm_epsilon,
                kernel_initializer=init(),
                drop_path=self._drop_path_rate(i),
                name=f"transformer_{i}",
                dtype=policy,
            )
            for i in range(self.num_layers)
        ]
        self.norm = GroupNorm1(self.norm_epsilon, name="norm", dtype=policy)
        self.conv_proj = keras.layers.Conv2D(
            channels, 1, use_bias=False, kernel_initializer=init(), name="conv_proj", dtype=policy
        )
        self.proj_bn = batch_norm("proj_bn", self.norm_epsilon, policy)

        feature_shape = (batch, height, width, channels)
        p = self.patch_size
        num_patches = None if height is None or width is None else (height // p) * (width // p)
        token_shape = (batch, num_patches, p * p, d)
        self.local_conv.build(feature_shape)
        self.local_bn.build(feature_shape)
        self.local_proj.build(feature_shape)
        for layer in self.transformer:
            layer.build(token_shape)
        self.norm.build(token_shape)
        self.conv_proj.build((batch, height, width, d))
        self.proj_bn.build(feature_shape)

    def resize_input(self, x):
        """Upsize `x` (bilinear, align_corners=True) when a side is not a multiple of the patch.

        Decided from the static size when it is known (no op at all for even maps), else
        at run time from the tensor's shape.
        """
        size = round_up_to_patch(spatial_size(x), self.patch_size)
        return resize_if_needed(x, size, _resize_align_corners)

    def local_features(self, x, training=None):
        """The local representation of the (already resized) map `x`: `(B, H', W', d)`."""
        x = ops.silu(self.local_bn(self.local_conv(x), training=training))
        return self.local_proj(x)

    def project(self, x, training=None):
        """The final projection of the folded map `(B, H', W', d)` -> `(B, H', W', C)`."""
        return self.proj_bn(self.conv_proj(x), training=training)

    def patch_tokens(self, inputs, training=None):
        """The tokens fed to the first transformer layer, `(batch, N, P, attention_dim)`."""
        x = self.local_features(self.resize_input(inputs), training=training)
        return functional.unfold(x, self.patch_size, layout=functional.CHANNELS_LAST,
                                 form=export_forms.current().unfold)

    def patch_grid(self, x):
        """`(rows, cols)` of patches of the resized map `x`: ints, or scalar tensors."""
        return tuple(side // self.patch_size for side in spatial_size(x))

    def call(self, inputs, training=None):
        override = export_forms.current_block_call()
        if override is not None and not training:
            outputs = override(self, inputs)
            if outputs is not None:
                return outputs
        x = self.resize_input(inputs)                                # (B, H', W', C)
        grid = self.patch_grid(x)
        x = functional.transform_patches(
            self.local_features(x, training=training),               # (B, H', W', d)
            grid, self.patch_size,
            [functools.partial(layer, training=training) for layer in self.transformer],
            self.norm, layout=functional.CHANNELS_LAST,
            unfold_form=export_forms.current().unfold,
        )                                                            # (B, H', W', d)
        return self.project(x, training=training)                    # (B, H', W', C)

    def compute_output_shape(self, input_shape):
        batch, height, width, channels = input_shape
        height, width = self._resized_hw(height, width)
        return (batch, height, width, channels)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "attention_dim": self.attention_dim,
                "num_layers": self.num_layers,
                "attention": attention_registry.serialize(self.attention),
                "ffn_dim": self.ffn_dim,
                "patch_size": self.patch_size,
                "attn_dropout": self.attn_dropout,
                "dropout": self.dropout,
                "ffn_dropout": self.ffn_dropout,
                "norm_epsilon": self.norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "drop_path": self.drop_path,
            }
        )
        return config
