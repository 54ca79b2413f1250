"""Core ML export: an ML Program (`.mlpackage`) for iPhone, with structural checks.

One module per concern:

* `convert`: `to_coreml` (trace, convert with coremltools, metadata, atomic save);
* `compress`: weight compression (int8, palettization, pruning);
* `inspect`: `CoreMLReport`, `inspect_coreml` (ops, ranks, inputs, outputs, metadata on any
  OS), `run_coreml` and `coreml_predictions_available` (predictions need macOS);
* `detection`: `to_coreml_detector`, SSDLite as the pipeline Vision's object detection reads;
* `pointwise_fusion`: the 1x1 convolution fusion as a coremltools graph pass (imported on
  use: it needs coremltools).

The channels-first tracing of MobileViTv2 blocks is `keras_mvit2.export.coreml.layout`.
"""

from keras_mvit2.export.coreml.compress import WEIGHT_COMPRESSIONS
from keras_mvit2.export.coreml.convert import (
    COMPUTE_UNITS_GUIDANCE,
    DEPLOYMENT_TARGETS,
    PRECISIONS,
    to_coreml,
)
from keras_mvit2.export.coreml.detection import to_coreml_detector
from keras_mvit2.export.coreml.inspect import (
    CoreMLReport,
    coreml_predictions_available,
    inspect_coreml,
    run_coreml,
)
from keras_mvit2.export.coreml.target import COREML, CoreMLTarget

__all__ = [
    "COMPUTE_UNITS_GUIDANCE",
    "COREML",
    "DEPLOYMENT_TARGETS",
    "PRECISIONS",
    "WEIGHT_COMPRESSIONS",
    "CoreMLReport",
    "CoreMLTarget",
    "coreml_predictions_available",
    "inspect_coreml",
    "run_coreml",
    "to_coreml",
    "to_coreml_detector",
]
