"""Core ML export: an ML Program (`.mlpackage`) for iPhone, with structural checks.

One module per concern:

* `convert`: `to_coreml` (trace, convert with coremltools, metadata, atomic save), the
  TensorFlow road; `torch_road`: `to_coreml_via_torch`, the same file from a model on
  Keras' PyTorch backend through ``torch.export`` (`keras_mvit2.export.roads`);
  `description`: what both roads' packages carry (arguments, input, labels, metadata);
* `compress`: weight compression (int8, palettization per tensor or grouped, pruning);
  `activation_quantization`: W8A8, calibrated here; `recipes`: `COMPRESSION_RECIPES`, the
  candidates an optimizer measures;
* `package_weights`: a package's own MIL program and decompressed weights run with
  TensorFlow on any OS (`predict_with_package_weights`; ops in `mil_ops`), the accuracy of
  a compressed package measured without macOS;
* `inspect`: `CoreMLReport`, `inspect_coreml` (ops, ranks, inputs, outputs, metadata on any
  OS), `run_coreml` and `coreml_predictions_available` (predictions need macOS);
* `detection`: `to_coreml_detector`, SSDLite as the pipeline Vision's object detection reads;
* `pointwise_fusion`: the 1x1 convolution fusion as a coremltools graph pass (imported on
  use: it needs coremltools).

The channels-first tracing of MobileViTv2 blocks is `keras_mvit2.export.coreml.layout`.
On PyTorch only the TensorFlow-free modules are imported here (the torch road, inspecting,
the target); the TensorFlow road's names raise `TensorFlowBackendRequiredError` when used.
"""

from keras_mvit2.backend import keras_backend_name
from keras_mvit2.export.coreml.compress import WEIGHT_COMPRESSIONS
from keras_mvit2.export.coreml.description import (
    COMPUTE_UNITS_GUIDANCE,
    DEPLOYMENT_TARGETS,
    PRECISIONS,
)
from keras_mvit2.export.coreml.inspect import (
    CoreMLReport,
    coreml_predictions_available,
    inspect_coreml,
    run_coreml,
)
from keras_mvit2.export.coreml.recipes import COMPRESSION_RECIPES, CoreMLRecipe
from keras_mvit2.export.coreml.target import COREML, CoreMLTarget
from keras_mvit2.export.coreml.torch_road import to_coreml_via_torch
from keras_mvit2.export.roads import tensorflow_road_getattr

#: The TensorFlow road's names (and those running a program's MIL in TensorFlow): imported
#: on TensorFlow, an error naming the fix elsewhere.
_TENSORFLOW_ROAD = ("measurement_kind", "package_weights", "predict_with_package_weights",
                    "to_coreml", "to_coreml_detector")

if keras_backend_name() == "tensorflow":
    from keras_mvit2.export.coreml.convert import to_coreml
    from keras_mvit2.export.coreml.detection import to_coreml_detector
    from keras_mvit2.export.coreml.package_weights import (
        measurement_kind,
        package_weights,
        predict_with_package_weights,
    )
else:
    __getattr__ = tensorflow_road_getattr(__name__, _TENSORFLOW_ROAD)

__all__ = [
    "COMPRESSION_RECIPES",
    "COMPUTE_UNITS_GUIDANCE",
    "COREML",
    "DEPLOYMENT_TARGETS",
    "PRECISIONS",
    "WEIGHT_COMPRESSIONS",
    "CoreMLRecipe",
    "CoreMLReport",
    "CoreMLTarget",
    "coreml_predictions_available",
    "inspect_coreml",
    "measurement_kind",
    "package_weights",
    "predict_with_package_weights",
    "run_coreml",
    "to_coreml",
    "to_coreml_detector",
    "to_coreml_via_torch",
]
