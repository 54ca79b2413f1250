"""MobileViTv2 (Mehta & Rastegari, "Separable Self-attention for Mobile Vision
Transformers", TMLR 2023), the whole family in one folder (as KerasHub's):

- `mobilevitv2_block.py`: `MobileViTV2Block` (Fig. 6);
- `mobilevitv2_builders.py`: `MobileViTV2` (Table 6, ml-cvnets' width rule), the
  registered `mobilevitv2_050` ... `mobilevitv2_200`, `preprocess_input`,
  `decode_predictions`;
- `mobilevitv2_presets.py`: the one table of published checkpoints (`weights=` tags,
  `finetune`'s weights, KerasHub's preset names);
- `mobilevitv2_port.py`: Apple ml-cvnets / timm / HF transformers checkpoints -> Keras;
- `mobilevitv2_features.py`: the multi-scale, dilated backbone of the task models;
- KerasHub (`hub` extra; imported by `keras_mvit2.kerashub`, never here):
  `mobilevitv2_backbone.py`, `mobilevitv2_image_classifier.py`,
  `mobilevitv2_image_classifier_preprocessor.py`, `mobilevitv2_image_converter.py`, and
  `mobilevitv2_preset_resolver.py` (published names / hf://timm -> KerasHub presets).
"""

from keras_mvit2.models.mobilevitv2.mobilevitv2_block import MobileViTV2Block
from keras_mvit2.models.mobilevitv2.mobilevitv2_builders import (
    MobileViTV2,
    decode_predictions,
    mobilevitv2_050,
    mobilevitv2_075,
    mobilevitv2_100,
    mobilevitv2_125,
    mobilevitv2_150,
    mobilevitv2_175,
    mobilevitv2_200,
    mobilevitv2_widths,
    preprocess_input,
)
from keras_mvit2.models.mobilevitv2.mobilevitv2_presets import (
    PRESETS,
    PRETRAINED_WEIGHTS,
    find_preset,
    find_weights,
    list_weights,
)

__all__ = [
    "PRESETS",
    "PRETRAINED_WEIGHTS",
    "MobileViTV2",
    "MobileViTV2Block",
    "decode_predictions",
    "find_preset",
    "find_weights",
    "list_weights",
    "mobilevitv2_050",
    "mobilevitv2_075",
    "mobilevitv2_100",
    "mobilevitv2_125",
    "mobilevitv2_150",
    "mobilevitv2_175",
    "mobilevitv2_200",
    "mobilevitv2_widths",
    "preprocess_input",
]
