"""Keras layers of keras_mvit2 that no one model family owns (all registered for `.keras`
serialization). Each family's own blocks live in its folder: `MobileViTV2Block`,
`MobileViTBlock` and the ViT layers are `keras_mvit2.models.*`."""

from keras_mvit2.layers.eval_resize_crop import EvalResizeCrop
from keras_mvit2.layers.group_norm import GroupNorm1
from keras_mvit2.layers.inverted_residual import InvertedResidual, make_divisible
from keras_mvit2.layers.linformer_attention import LinformerSelfAttention
from keras_mvit2.layers.mobile_attention import MobileAttention
from keras_mvit2.layers.multi_head_attention import MultiHeadSelfAttention
from keras_mvit2.layers.patching import fold, unfold
from keras_mvit2.layers.random_feature_attention import RandomFeatureAttention
from keras_mvit2.layers.separable_self_attention import SeparableSelfAttention
from keras_mvit2.layers.stochastic_depth import StochasticDepth
from keras_mvit2.layers.token_mixer import TokenMixer
from keras_mvit2.layers.transformer_layer import TransformerLayer

__all__ = [
    "EvalResizeCrop",
    "GroupNorm1",
    "InvertedResidual",
    "LinformerSelfAttention",
    "MobileAttention",
    "MultiHeadSelfAttention",
    "RandomFeatureAttention",
    "SeparableSelfAttention",
    "StochasticDepth",
    "TokenMixer",
    "TransformerLayer",
    "fold",
    "make_divisible",
    "unfold",
]
