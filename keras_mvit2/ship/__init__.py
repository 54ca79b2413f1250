"""From a folder of photos to a labelled phone model: `finetune_to_phone` (`mvit2 finetune`).

`data_check.py` (classes, counts, small-data warnings), `phone_files.py` (the export step:
int8 TFLite + Core ML, validated and timed), `model_card.py` (`MODEL_CARD.md` from
`run.json`), `pipeline.py` (the steps in order).
"""

from keras_mvit2.ship.data_check import DataCheck, check_training_data
from keras_mvit2.ship.model_card import render_model_card, write_model_card
from keras_mvit2.ship.pipeline import ShipResult, finetune_to_phone

__all__ = [
    "DataCheck",
    "ShipResult",
    "check_training_data",
    "finetune_to_phone",
    "render_model_card",
    "write_model_card",
]
