"""ViT / DeiT (Dosovitskiy et al., ICLR 2021, eq. 1-4; Touvron et al., ICML 2021) with
any attention of `keras_mvit2.attention`, as timm's `deit_*_patch16_224`."""

import keras

from keras_mvit2.models.builder_utils import dense_classifier, load_weights, model_input
from keras_mvit2.models.registry import register_builder
from keras_mvit2.models.vit.vit_layers import (
    ClassTokenPositionEmbedding,
    PatchEmbedding,
    TokenPooling,
    ViTBlock,
)
from keras_mvit2.utils.arguments import validate_positive_ints

#: timm's DeiT configurations (patch 16, input 224).
DEIT_CONFIGS: dict[str, dict] = {
    "deit_tiny": dict(patch_size=16, embed_dim=192, depth=12, num_heads=3),
    "deit_small": dict(patch_size=16, embed_dim=384, depth=12, num_heads=6),
    "deit_base": dict(patch_size=16, embed_dim=768, depth=12, num_heads=12),
}

VIT_DEFAULT_INPUT_SHAPE = (224, 224, 3)


def ViT(  # noqa: N802 (keras.applications naming)
    include_top: bool = True,
    weights: str | None = None,
    input_tensor=None,
    input_shape: tuple[int, int, int] | None = None,
    pooling: str | None = None,
    classes: int = 1000,
    classifier_activation: str | None = "softmax",
    dropout: float = 0.0,
    name: str | None = None,
    *,
    patch_size: int = 16,
    embed_dim: int = 768,
    depth: int = 12,
    num_heads: int = 12,
    mlp_ratio: float = 4.0,
    attention="mha",
    attn_dropout: float = 0.0,
    block_dropout: float = 0.0,
    norm_epsilon: float = 1e-6,
) -> keras.Model:
    """Builds a Vision Transformer (ViT / DeiT) classifier or backbone (channels-last).

    ```
    z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos         eq. (1)  patch_embed, cls_pos_embed
    z'_l = MSA(LN(z_{l-1})) + z_{l-1}                     eq. (2)  block_{l}
    z_l = MLP(LN(z'_l)) + z'_l                            eq. (3)  (GELU, ratio 4)
    y = LN(z_L^0)                                         eq. (4)  norm, class token
    ```

    As timm's `VisionTransformer` with DeiT's settings (LayerNorm epsilon 1e-6,
    exact GELU, qkv bias, a learned position for the class token, the head on
    the class token). Defaults are ViT-B/16 = DeiT-B; `create_model("deit_tiny")`
    etc. give the DeiT configurations. The MSA can be replaced by any attention
    (`attention="mobile_attention"` gives the DeiT-MobiAtt rows of the
    Mobile-Attention paper); `num_heads` goes to the mechanisms that take it.
    Mechanisms that need a fixed token count (Linformer) see `N + 1` tokens
    (197 at 224x224, patch 16).

    Args:
        include_top: bool. Add the classifier on the class token.
        weights: `None` (random init) or the path of a checkpoint: a timm
            `.pth` / `.bin` / `.safetensors` of the same configuration and input
            size, or a Keras `.weights.h5`. Nothing is downloaded.
        input_tensor: optional Keras tensor to use as the image input.
        input_shape: `(height, width, 3)`, static, sides divisible by
            `patch_size`. Defaults to `(224, 224, 3)`. timm's DeiT expects
            ImageNet mean / std normalized inputs.
        pooling: when `include_top=False`: `None` (the normalized token sequence,
            `(batch, N + 1, embed_dim)`), `"token"` (the class token), `"avg"` or
            `"max"` (over the patch tokens).
        classes: int. Number of classes of the classifier.
        classifier_activation: activation of the classifier; `None` gives logits.
        dropout: float. Dropout before the classifier.
        name: model name. Defaults to `"vit"`.
        patch_size: int. Patch side P. Defaults to `16`.
        embed_dim: int. Token width D. Defaults to `768`.
        depth: int. Number of transformer blocks L. Defaults to `12`.
        num_heads: int. Attention heads; must divide `embed_dim` for MHA.
            Defaults to `12`.
        mlp_ratio: float. MLP hidden width = `int(D * mlp_ratio)`. Defaults to `4.0`.
        attention: the token mixer of every block: a name of
            `keras_mvit2.attention.available()`, a config dict or a layer.
            Defaults to `"mha"`.
        attn_dropout: float. Dropout on the attention weights.
        block_dropout: float. Dropout on the attention and MLP outputs.
        norm_epsilon: float. LayerNorm epsilon. Defaults to `1e-6` (timm).

    Returns:
        A `keras.Model` (Functional).

    Example:
    >>> model = keras_mvit2.create_model("deit_tiny", attention="mobile_attention")
    >>> model.output_shape
    (None, 1000)
    """
    validate_positive_ints(
        patch_size=patch_size, embed_dim=embed_dim, depth=depth, num_heads=num_heads)
    if mlp_ratio <= 0:
        raise ValueError(f"mlp_ratio must be positive. Received: mlp_ratio={mlp_ratio}")
    inputs, x = model_input(input_tensor, input_shape, min_size=patch_size,
                            default_shape=VIT_DEFAULT_INPUT_SHAPE)
    height, width = x.shape[1], x.shape[2]
    if height % patch_size or width % patch_size:
        raise ValueError(
            f"The input height and width must be multiples of patch_size={patch_size}. "
            f"Received: input_shape={tuple(x.shape[1:])}"
        )
    if include_top:
        if pooling not in (None, "token"):
            raise ValueError(
                "With include_top=True the classifier reads the class token; pooling must be "
                f"None. Received: pooling={pooling!r}"
            )
        if not isinstance(classes, int) or classes <= 0:
            raise ValueError(f"classes must be a positive int. Received: classes={classes!r}")
    elif pooling not in (None, *TokenPooling.MODES):
        raise ValueError(
            f"pooling must be None, 'token', 'avg' or 'max'. Received: pooling={pooling!r}"
        )

    x = PatchEmbedding(patch_size, embed_dim, name="patch_embed")(x)      # (B, N, D)
    x = ClassTokenPositionEmbedding(name="cls_pos_embed")(x)              # (B, N + 1, D)
    for i in range(depth):
        x = ViTBlock(
            num_heads=num_heads,
            mlp_ratio=mlp_ratio,
            attention=attention,
            activation="gelu",
            attn_dropout=attn_dropout,
            dropout=block_dropout,
            norm_epsilon=norm_epsilon,
            name=f"block_{i}",
        )(x)
    x = keras.layers.LayerNormalization(epsilon=norm_epsilon, name="norm")(x)

    if include_top:
        x = TokenPooling("token", name="class_token")(x)                  # (B, D)
        x = dense_classifier(x, classes, classifier_activation, dropout)
    elif pooling is not None:
        x = TokenPooling(pooling, name=f"{pooling}_pool")(x)

    model = keras.Model(inputs, x, name=name or "vit")
    load_weights(model, weights)
    return model


def _named_builder(name: str):
    config = DEIT_CONFIGS[name]
    return register_builder(
        name, lambda **kwargs: ViT(**dict(config, **kwargs)),
        f"{name.replace('_', '-').replace('deit', 'DeiT')} (timm `{name}_patch16_224`): "
        f"`ViT({', '.join(f'{k}={v}' for k, v in config.items())})`; keyword arguments as `ViT`.",
    )


deit_tiny = _named_builder("deit_tiny")
deit_small = _named_builder("deit_small")
deit_base = _named_builder("deit_base")
