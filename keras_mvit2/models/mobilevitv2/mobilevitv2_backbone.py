"""MobileViTv2 as a KerasHub `Backbone`: the stride-32 feature map of `MobileViTV2`."""

from __future__ import annotations

import keras
import keras_hub

from keras_mvit2.api_export import serializable
from keras_mvit2.layers import attention_registry
from keras_mvit2.models.mobilevitv2.mobilevitv2_builders import MobileViTV2
from keras_mvit2.models.mobilevitv2.mobilevitv2_presets import PresetsProperty


@serializable
class MobileViTV2Backbone(keras_hub.models.Backbone):
    """MobileViTv2 feature extractor as a `keras_hub.models.Backbone`.

    The graph is `keras_mvit2.MobileViTV2(width_multiplier, include_top=False, ...)`:
    the same layers, variables and variable paths (`stem_conv/kernel`, ...), so weights
    move between the two by name. The output is the last feature map
    `(batch, height / 32, width / 32, channels)`; `MobileViTV2ImageClassifier` pools
    it and adds the classifier.

    Args:
        width_multiplier: float. Width of the model (0.5 to 2.0 are published; any
            value in (0, 4] builds).
        image_shape: `(height, width, 3)` with a fixed height and width. Inputs are
            RGB in [0, 1] (the preprocessor converts raw images).
        attention: the attention of every MobileViTv2 block: `"separable"` (the
            paper's, the one of the published weights) or any name, config dict or
            layer of `keras_mvit2.attention`.
        attn_dropout: float. Dropout on the context scores.
        ffn_dropout: float. Dropout inside the FFN.
        block_dropout: float. Dropout on the attention and FFN outputs.
        drop_path_rate: float in [0, 1). Stochastic depth of the deepest transformer
            layer (linear from 0, as timm).
        dtype: dtype policy of every layer (the layers are built under it); `None`
            uses `keras.config.dtype_policy()`.

    Example:
        ```python
        import keras_mvit2.kerashub
        backbone = keras_mvit2.kerashub.MobileViTV2Backbone(0.5, image_shape=(64, 64, 3))
        backbone(np.zeros((1, 64, 64, 3))).shape  # (1, 2, 2, 256)
        ```

    Reference: Mehta & Rastegari, "Separable Self-attention for Mobile Vision
    Transformers", TMLR 2023.
    """

    presets = PresetsProperty()

    def __init__(
        self,
        width_multiplier: float = 1.0,
        image_shape: tuple[int, int, int] = (256, 256, 3),
        attention="separable",
        attn_dropout: float = 0.0,
        ffn_dropout: float = 0.0,
        block_dropout: float = 0.0,
        drop_path_rate: float = 0.0,
        dtype=None,
        **kwargs,
    ):
        image_shape = tuple(image_shape)
        # === Functional Model ===
        # MobileViTV2's builder makes the layers; this class keeps its graph. The
        # layers take the global dtype policy, so a `dtype` is made global while
        # they are built.
        policy = None
        if dtype is not None and not isinstance(dtype, keras.dtype_policies.DTypePolicyMap):
            policy = keras.dtype_policies.get(dtype)
        previous = keras.config.dtype_policy()
        if policy is not None:
            keras.config.set_dtype_policy(policy)
        try:
            features = MobileViTV2(
                width_multiplier,
                include_top=False,
                input_shape=image_shape,
                attention=attention,
                attn_dropout=attn_dropout,
                ffn_dropout=ffn_dropout,
                block_dropout=block_dropout,
                drop_path_rate=drop_path_rate,
            )
        finally:
            keras.config.set_dtype_policy(previous)
        super().__init__(inputs=features.inputs[0], outputs=features.outputs[0], dtype=dtype,
                         **kwargs)

        # === Config ===
        self.width_multiplier = width_multiplier
        self.image_shape = image_shape
        self.attention = attention
        self.attn_dropout = attn_dropout
        self.ffn_dropout = ffn_dropout
        self.block_dropout = block_dropout
        self.drop_path_rate = drop_path_rate

    @classmethod
    def from_preset(cls, preset: str, load_weights: bool = True, **kwargs):
        """`keras_hub.models.Backbone.from_preset`, which also takes the published
        names (`"mobilevitv2_050_imagenet"`, ...) and timm MobileViTv2 checkpoints
        (`"hf://timm/mobilevitv2_050.cvnets_in1k"`); see
        `MobileViTV2ImageClassifier.from_preset`."""
        from keras_mvit2.models.mobilevitv2.mobilevitv2_preset_resolver import resolve_preset

        return super().from_preset(resolve_preset(preset), load_weights, **kwargs)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            width_multiplier=self.width_multiplier,
            image_shape=list(self.image_shape),
            attention=attention_registry.serialize(self.attention),
            attn_dropout=self.attn_dropout,
            ffn_dropout=self.ffn_dropout,
            block_dropout=self.block_dropout,
            drop_path_rate=self.drop_path_rate,
        )
        return config
