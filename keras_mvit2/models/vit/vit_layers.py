"""ViT / DeiT building blocks (Dosovitskiy et al., ICLR 2021, eq. 1-4), timm layout:
`PatchEmbedding`, `ClassTokenPositionEmbedding`, `ViTBlock`, `TokenPooling`.

Every projection on tokens is an `EinsumDense` (kernel `(in, out)` = timm's `weight.T`,
see `dense_on_tokens`). No tensor exceeds rank 4.
"""

import inspect
import math

import keras
from keras import ops

from keras_mvit2.api_export import serializable
from keras_mvit2.layers import attention_registry
from keras_mvit2.layers.multi_head_attention import dense_on_tokens
from keras_mvit2.utils.arguments import validate_positive_ints, validate_rates


def gelu_erf(x):
    """Exact GELU, `0.5 x (1 + erf(x / sqrt(2)))` (PyTorch's `nn.GELU()`, timm's ViT).

    Written with `erf` rather than `tf.nn.gelu(approximate=False)`, which lowers to
    `Erfc`: Core ML has no `Erfc`. The TFLite converter fuses this form into one
    GELU builtin.
    """
    return 0.5 * x * (1.0 + ops.erf(x * (1.0 / math.sqrt(2.0))))


def _activation(identifier):
    if identifier == "gelu":
        return gelu_erf
    return keras.activations.get(identifier)


def _takes_num_heads(name: str) -> bool:
    cls = attention_registry.get_class(name)
    return "num_heads" in inspect.signature(cls.__init__).parameters


def attention_layer(identifier="mha", num_heads: int | None = None, **kwargs) -> keras.layers.Layer:
    """A new attention layer, with `num_heads` given only to mechanisms that take it.

    Like `keras_mvit2.attention.get(identifier, **kwargs)`, plus `num_heads`:

    - a name (`"mha"`, `"mobile_attention"`, ...): `num_heads` is passed when the
      layer class has a `num_heads` argument (MHA, Linformer, RFA, MobiAtt), not to
      the separable attention, which has no heads;
    - a config dict `{"name": ..., ...}`: the same, unless the dict sets `num_heads`
      itself (the dict wins);
    - a layer or a Keras serialization dict: copied as configured (its own
      `num_heads` is kept).

    Args:
        identifier: name, config dict or layer (see `keras_mvit2.attention.get`).
        num_heads: int or None. The model's head count.
        **kwargs: passed to the layer (`name`, `dtype`, `attn_dropout`, ...).

    Returns:
        A new, unbuilt attention layer.
    """
    if num_heads is not None:
        if isinstance(identifier, str):
            if _takes_num_heads(identifier):
                kwargs["num_heads"] = num_heads
        elif isinstance(identifier, dict) and "class_name" not in identifier:
            name = identifier.get("name")
            if (isinstance(name, str) and "num_heads" not in identifier
                    and _takes_num_heads(name)):
                kwargs["num_heads"] = num_heads
    return attention_registry.get(identifier, **kwargs)


@serializable
class PatchEmbedding(keras.layers.Layer):
    """Non-overlapping patches to tokens: `x_p E + b` of ViT's eq. (1).

    A `patch_size x patch_size` convolution with stride `patch_size` (sublayer
    `proj`, kernel `(p, p, C, D)` = timm's `patch_embed.proj.weight` transposed),
    then the patch grid is flattened row-major, as timm's `flatten(2).transpose(1, 2)`.

    Args:
        patch_size: int. Patch height and width. Defaults to `16`.
        embed_dim: int. Token width D. Defaults to `768`.
        kernel_initializer: initializer of the projection kernel. Defaults to
            `"glorot_uniform"`.

    Input shape:
        `(batch, height, width, channels)`, static height and width divisible by
        `patch_size`.

    Output shape:
        `(batch, (height / p) * (width / p), embed_dim)`.

    Example:
    >>> x = keras.random.normal((2, 64, 64, 3))
    >>> keras_mvit2.models.PatchEmbedding(16, 48)(x).shape
    (2, 16, 48)

    Reference:
        Dosovitskiy et al., "An Image is Worth 16x16 Words", ICLR 2021, eq. (1);
        timm `timm.layers.PatchEmbed`.
    """

    def __init__(
        self,
        patch_size: int = 16,
        embed_dim: int = 768,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if patch_size <= 0 or embed_dim <= 0:
            raise ValueError(
                "patch_size and embed_dim must be positive. Received: "
                f"patch_size={patch_size}, embed_dim={embed_dim}"
            )
        self.patch_size = patch_size
        self.embed_dim = embed_dim
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def _grid(self, input_shape) -> tuple[int, int]:
        if len(input_shape) != 4:
            raise ValueError(
                "PatchEmbedding expects (batch, height, width, channels). "
                f"Received: input_shape={input_shape}"
            )
        height, width = input_shape[1], input_shape[2]
        p = self.patch_size
        if height is None or width is None or height % p or width % p:
            raise ValueError(
                f"PatchEmbedding needs a static height and width divisible by patch_size={p} "
                "(timm's strict image size; resize or crop the images). "
                f"Received: input_shape={input_shape}"
            )
        return height // p, width // p

    def build(self, input_shape):
        self._grid(input_shape)
        self.proj = keras.layers.Conv2D(
            self.embed_dim,
            self.patch_size,
            strides=self.patch_size,
            padding="valid",
            kernel_initializer=self.kernel_initializer,
            name="proj",
            dtype=self.dtype_policy,
        )
        self.proj.build(tuple(input_shape))

    def call(self, inputs):
        rows, cols = self._grid(inputs.shape)
        x = self.proj(inputs)                                        # (B, H/p, W/p, D)
        return ops.reshape(x, (-1, rows * cols, self.embed_dim))     # (B, N, D)

    def compute_output_shape(self, input_shape):
        rows, cols = self._grid(input_shape)
        return (input_shape[0], rows * cols, self.embed_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "patch_size": self.patch_size,
                "embed_dim": self.embed_dim,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config


@serializable
class ClassTokenPositionEmbedding(keras.layers.Layer):
    """Prepends the learned class token and adds the learned position embedding (eq. 1).

    `z_0 = [x_class; x_1; ...; x_N] + E_pos` with `x_class` the weight
    `cls_token`, shape `(1, 1, D)`, and `E_pos` the weight `pos_embed`, shape
    `(1, N + 1, D)` (the class token has a position too, as timm's ViT / DeiT).
    The position embedding is fixed to the N of the build shape.

    Args:
        class_token_initializer: initializer of `cls_token`. Defaults to
            `RandomNormal(stddev=1e-6)` (timm).
        position_initializer: initializer of `pos_embed`. Defaults to
            `TruncatedNormal(stddev=0.02)` (timm).

    Input shape:
        `(batch, num_tokens, dim)`, static `num_tokens` and `dim`.

    Output shape:
        `(batch, num_tokens + 1, dim)`.

    Example:
    >>> x = keras.random.normal((2, 16, 48))
    >>> keras_mvit2.models.ClassTokenPositionEmbedding()(x).shape
    (2, 17, 48)

    Reference:
        Dosovitskiy et al., ICLR 2021, eq. (1); timm `VisionTransformer._pos_embed`.
    """

    def __init__(
        self,
        class_token_initializer=None,
        position_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.class_token_initializer = keras.initializers.get(
            class_token_initializer or keras.initializers.RandomNormal(stddev=1e-6)
        )
        self.position_initializer = keras.initializers.get(
            position_initializer or keras.initializers.TruncatedNormal(stddev=0.02)
        )

    def build(self, input_shape):
        if len(input_shape) != 3 or input_shape[1] is None or input_shape[2] is None:
            raise ValueError(
                "ClassTokenPositionEmbedding expects (batch, num_tokens, dim) with a static "
                f"num_tokens and dim. Received: input_shape={input_shape}"
            )
        num_tokens, dim = int(input_shape[1]), int(input_shape[2])
        self.cls_token = self.add_weight(
            shape=(1, 1, dim), initializer=self.class_token_initializer, name="cls_token"
        )
        self.pos_embed = self.add_weight(
            shape=(1, num_tokens + 1, dim), initializer=self.position_initializer,
            name="pos_embed",
        )

    def call(self, inputs):
        dim = inputs.shape[-1]
        cls = ops.cast(self.cls_token, inputs.dtype)                      # (1, 1, D)
        cls = ops.broadcast_to(cls, (ops.shape(inputs)[0], 1, dim))       # (B, 1, D)
        x = ops.concatenate([cls, inputs], axis=1)                        # (B, N + 1, D)
        return x + ops.cast(self.pos_embed, inputs.dtype)

    def compute_output_shape(self, input_shape):
        num_tokens = None if input_shape[1] is None else input_shape[1] + 1
        return (input_shape[0], num_tokens, input_shape[2])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "class_token_initializer": keras.initializers.serialize(
                    self.class_token_initializer),
                "position_initializer": keras.initializers.serialize(self.position_initializer),
            }
        )
        return config


@serializable
class ViTBlock(keras.layers.Layer):
    """The pre-norm transformer block of ViT / DeiT and MobileViT v1 (timm `Block`).

    ```
    x = x + Attn(LN(x))                # eq. (2); Attn = MSA by default
    x = x + fc2(act(fc1(LN(x))))       # eq. (3); hidden width mlp_ratio * D
    ```

    LayerNorm is per token (over the channel axis). ViT / DeiT use GELU (exact,
    erf form, as PyTorch's `nn.GELU`), MLP ratio 4 and epsilon `1e-6`; MobileViT
    v1 uses SiLU, MLP ratio 2 and epsilon `1e-5`. The attention is any layer of
    `keras_mvit2.attention`; `num_heads` is passed to those that take it.

    Sublayers (timm names): `norm1`, `attn` (`MultiHeadSelfAttention`: `qkv`,
    `proj`), `norm2`, `fc1`, `fc2` (`EinsumDense`, kernel `(in, out)`).

    Args:
        num_heads: int. Heads of the attention. Defaults to `4`.
        mlp_ratio: float. MLP hidden width = `int(dim * mlp_ratio)`. Defaults to `4.0`.
        attention: the token mixer: a name of `keras_mvit2.attention.available()`,
            a config dict or a layer. Defaults to `"mha"`.
        activation: MLP activation, a Keras activation name; `"gelu"` is the
            exact (erf) GELU, written for Core ML (see `gelu_erf`). Defaults to
            `"gelu"`.
        attn_dropout: float. Dropout on the attention weights (passed to the
            attention when non-zero).
        dropout: float. Dropout on the attention output and after each MLP
            linear (timm's `proj_drop`).
        norm_epsilon: float. LayerNorm epsilon. Defaults to `1e-6` (timm ViT).
        kernel_initializer: initializer of the MLP kernels. Defaults to
            `TruncatedNormal(stddev=0.02)` (timm ViT).

    Input shape:
        `(batch, num_tokens, dim)` or the MobileViT layout
        `(batch, num_patches, patch_area, dim)` (attention over the patches for
        each pixel position; the LayerNorm and MLP are per token).

    Output shape:
        Same as the input.

    Example:
    >>> x = keras.random.normal((2, 17, 48))
    >>> keras_mvit2.models.ViTBlock(num_heads=3)(x).shape
    (2, 17, 48)

    Reference:
        Dosovitskiy et al., ICLR 2021, eq. (2)-(3); timm
        `timm.models.vision_transformer.Block`.
    """

    def __init__(
        self,
        num_heads: int = 4,
        mlp_ratio: float = 4.0,
        attention="mha",
        activation="gelu",
        attn_dropout: float = 0.0,
        dropout: float = 0.0,
        norm_epsilon: float = 1e-6,
        kernel_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        validate_positive_ints(num_heads=num_heads)
        if mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio must be positive. Received: mlp_ratio={mlp_ratio}")
        validate_rates(attn_dropout=attn_dropout, dropout=dropout)
        self.num_heads = num_heads
        self.mlp_ratio = mlp_ratio
        self.attention = attention
        self.activation = activation
        self._activation_fn = _activation(activation)
        self.attn_dropout = attn_dropout
        self.dropout = dropout
        self.norm_epsilon = norm_epsilon
        self.kernel_initializer = keras.initializers.get(
            kernel_initializer or keras.initializers.TruncatedNormal(stddev=0.02)
        )

    def build(self, input_shape):
        if len(input_shape) not in (3, 4) or input_shape[-1] is None:
            raise ValueError(
                "ViTBlock expects (batch, tokens, dim) or (batch, patches, patch_area, dim) "
                f"with a known dim. Received: input_shape={input_shape}"
            )
        input_shape = tuple(input_shape)
        rank = len(input_shape)
        dim = int(input_shape[-1])
        hidden = int(dim * self.mlp_ratio)
        policy = self.dtype_policy
        self.norm1 = keras.layers.LayerNormalization(
            epsilon=self.norm_epsilon, name="norm1", dtype=policy)
        dropout = {"attn_dropout": self.attn_dropout} if self.attn_dropout else {}
        self.attn = attention_layer(self.attention, self.num_heads, name="attn", dtype=policy,
                                    **dropout)
        self.norm2 = keras.layers.LayerNormalization(
            epsilon=self.norm_epsilon, name="norm2", dtype=policy)
        init = self.kernel_initializer
        self.fc1 = dense_on_tokens(hidden, True, "fc1", policy, init, rank=rank)
        self.fc2 = dense_on_tokens(dim, True, "fc2", policy, init, rank=rank)
        self.attn_out_drop = keras.layers.Dropout(self.dropout, dtype=policy)
        self.mlp_drop1 = keras.layers.Dropout(self.dropout, dtype=policy)
        self.mlp_drop2 = keras.layers.Dropout(self.dropout, dtype=policy)
        for layer in (self.norm1, self.attn, self.norm2, self.fc1):
            layer.build(input_shape)
        self.fc2.build(input_shape[:-1] + (hidden,))

    def call(self, inputs, training=None):
        x = inputs
        y = self.attn(self.norm1(x), training=training)                  # (..., D)
        x = x + self.attn_out_drop(y, training=training)
        y = self._activation_fn(self.fc1(self.norm2(x)))                 # (..., hidden)
        y = self.fc2(self.mlp_drop1(y, training=training))               # (..., D)
        return x + self.mlp_drop2(y, training=training)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "mlp_ratio": self.mlp_ratio,
                "attention": attention_registry.serialize(self.attention),
                "activation": self.activation if isinstance(self.activation, str)
                else keras.activations.serialize(self._activation_fn),
                "attn_dropout": self.attn_dropout,
                "dropout": self.dropout,
                "norm_epsilon": self.norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config


@serializable
class TokenPooling(keras.layers.Layer):
    """Token sequence to one vector: the class token, or mean / max of the other tokens.

    Args:
        mode: `"token"` (the first token, ViT's `z_L^0`), `"avg"` or `"max"`
            over the tokens after the `num_prefix_tokens` first ones (timm's
            `global_pool`). Defaults to `"token"`.
        num_prefix_tokens: int. Class-like tokens at the start, skipped by
            `"avg"` / `"max"`. Defaults to `1`.

    Input shape:
        `(batch, num_tokens, dim)`.

    Output shape:
        `(batch, dim)`.

    Example:
    >>> x = keras.random.normal((2, 17, 48))
    >>> keras_mvit2.models.TokenPooling("avg")(x).shape
    (2, 48)
    """

    MODES = ("token", "avg", "max")

    def __init__(self, mode: str = "token", num_prefix_tokens: int = 1, **kwargs):
        super().__init__(**kwargs)
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {self.MODES}. Received: mode={mode!r}")
        if num_prefix_tokens < 0 or (mode == "token" and num_prefix_tokens < 1):
            raise ValueError(
                "num_prefix_tokens must be >= 0 (>= 1 for mode='token'). "
                f"Received: num_prefix_tokens={num_prefix_tokens}, mode={mode!r}"
            )
        self.mode = mode
        self.num_prefix_tokens = num_prefix_tokens

    def build(self, input_shape):
        if len(input_shape) != 3:
            raise ValueError(
                "TokenPooling expects (batch, num_tokens, dim). "
                f"Received: input_shape={input_shape}"
            )

    def call(self, inputs):
        if self.mode == "token":
            # Slice then reshape: a STRIDED_SLICE without shrink_axis_mask stays in XNNPACK.
            return ops.reshape(inputs[:, :1, :], (-1, inputs.shape[-1]))   # (B, D)
        tokens = inputs[:, self.num_prefix_tokens:, :]               # (B, N, D)
        if self.mode == "avg":
            return ops.mean(tokens, axis=1)
        return ops.max(tokens, axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update({"mode": self.mode, "num_prefix_tokens": self.num_prefix_tokens})
        return config
