"""The paper's Table 3 (ADE20k segmentation) and Table 4 (MS-COCO detection) rows: the
models with the paper's settings (`build_paper_model`) and our parameter and MAC counts
beside the paper's (`paper_comparison`, the `mvit2 task-profile` table).
"""

from __future__ import annotations

from collections.abc import Iterable

import keras

from keras_mvit2.backend import require_tensorflow

require_tensorflow("keras_mvit2.tasks.paper_tables (MAC counts from the TensorFlow graph)")

from keras_mvit2 import profiling  # noqa: E402
from keras_mvit2.tasks.detection import SSDLite  # noqa: E402
from keras_mvit2.tasks.segmentation import DeepLabV3, PSPNet  # noqa: E402

__all__ = ["PAPER_ROWS", "build_paper_model", "paper_comparison"]

#: (model, width, paper params in millions, paper GMACs) of Table 3 (ADE20k, 150 classes,
#: 512x512) and Table 4 (MS-COCO, 81 classes, 320x320). The extracted text of Table 3 has
#: garbled model names; the row grouping (each MobileViTv2 row paired with the same head on
#: MobileNetv2 / ResNet-50) and the parameter counts identify PSPNet for 0.5 / 1.75 and
#: DeepLabv3 for 0.75 / 2.0.
PAPER_ROWS = (
    ("pspnet", 0.5, 3.6, 15.4),
    ("pspnet", 1.75, 22.5, 95.9),
    ("deeplabv3", 0.75, 9.6, 40.0),
    ("deeplabv3", 2.0, 34.0, 147.0),
    ("ssdlite", 0.5, 2.0, 0.9),
    ("ssdlite", 0.75, 3.6, 1.8),
    ("ssdlite", 1.75, 14.9, 9.0),
)


def build_paper_model(head: str, width_multiplier: float, *, input_size: int | None = None,
                      **kwargs) -> keras.Model:
    """The model of a Table 3 / Table 4 row with the paper's settings (ml-cvnets configs).

    Segmentation: ADE20k config (150 classes, output stride 8, 512 head channels,
    512x512); detection: COCO config (81 classes, 320x320).
    """
    if head in ("deeplabv3", "pspnet"):
        size = input_size or 512
        builder = DeepLabV3 if head == "deeplabv3" else PSPNet
        return builder(width_multiplier, input_shape=(size, size, 3), classes=150,
                       output_stride=8, **kwargs)
    if head == "ssdlite":
        size = input_size or 320
        return SSDLite(width_multiplier, input_shape=(size, size, 3), classes=81, **kwargs)
    raise ValueError(f"head must be 'deeplabv3', 'pspnet' or 'ssdlite'. Received: {head!r}")


def paper_comparison(rows: Iterable[tuple[str, float, float, float]] = PAPER_ROWS, *,
                     macs: bool = True) -> list[dict]:
    """Our parameters and MACs beside the paper's rows.

    `gmacs` is in the paper's convention (`profile(...).macs`), `executed_gmacs` what
    keras_mvit2 runs (its separable attention projects the keys of the score-weighted
    sum only: the same function with fewer MACs); the relative differences are against
    the paper.
    """
    out = []
    for head, width, paper_params, paper_gmacs in rows:
        model = build_paper_model(head, width)
        if macs:
            result = profiling.profile(model)
            params, gmacs = result.params, result.gmacs
            executed = result.executed_macs / 1e9
        else:
            from keras_mvit2.profiling import count_params

            params, gmacs, executed = sum(count_params(model)), float("nan"), float("nan")
        out.append({
            "model": f"{head}-mobilevitv2-{width:g}",
            "input": "x".join(str(d) for d in model.input_shape[1:3]),
            "params": params,
            "gmacs": gmacs,
            "executed_gmacs": executed,
            "paper_params_m": paper_params,
            "paper_gmacs": paper_gmacs,
            "params_rel_diff": params / (paper_params * 1e6) - 1.0,
            "macs_rel_diff": gmacs / paper_gmacs - 1.0,
        })
        keras.backend.clear_session()
    return out
