"""MobileViT v1 (Mehta & Rastegari, ICLR 2022), the MobileViTv2 paper's Fig. 2 baseline,
in one folder: `mobilevit_block.py` (`MobileViTBlock`: LayerNorm transformer of ViT
blocks, fusion, skip) and `mobilevit_builders.py` (`MobileViT`, the registered
`mobilevit_xxs` / `mobilevit_xs` / `mobilevit_s`, as timm's). Its timm checkpoints port
through `keras_mvit2.models.timm_port` (shared with ViT: v1's transformer is ViT's block).
"""

from keras_mvit2.models.mobilevit.mobilevit_block import MobileViTBlock
from keras_mvit2.models.mobilevit.mobilevit_builders import (
    MOBILEVIT_CONFIGS,
    MobileViT,
    MobileViTConfig,
    mobilevit_s,
    mobilevit_xs,
    mobilevit_xxs,
)

__all__ = [
    "MOBILEVIT_CONFIGS",
    "MobileViT",
    "MobileViTBlock",
    "MobileViTConfig",
    "mobilevit_s",
    "mobilevit_xs",
    "mobilevit_xxs",
]
