"""ViT / DeiT (Dosovitskiy et al., ICLR 2021; Touvron et al., ICML 2021) in one folder:
`vit_layers.py` (`PatchEmbedding`, `ClassTokenPositionEmbedding`, `ViTBlock`,
`TokenPooling`) and `vit_builders.py` (`ViT`, the registered `deit_tiny` / `deit_small` /
`deit_base`, as timm's). Its timm checkpoints port through `keras_mvit2.models.timm_port`.
"""

from keras_mvit2.models.vit.vit_builders import DEIT_CONFIGS, ViT, deit_base, deit_small, deit_tiny
from keras_mvit2.models.vit.vit_layers import (
    ClassTokenPositionEmbedding,
    PatchEmbedding,
    TokenPooling,
    ViTBlock,
)

__all__ = [
    "DEIT_CONFIGS",
    "ClassTokenPositionEmbedding",
    "PatchEmbedding",
    "TokenPooling",
    "ViT",
    "ViTBlock",
    "deit_base",
    "deit_small",
    "deit_tiny",
]
