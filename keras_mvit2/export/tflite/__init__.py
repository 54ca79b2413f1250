"""TFLite (LiteRT) export: `to_tflite`, builtin ops only, checked at run time, with metadata.

One module per concern:

* `convert`: `to_tflite` and the converter plumbing (tracing, op sets, quantization,
  calibration, the checked atomic write);
* `diagnose`: `UnsupportedOpError`, read from the converter's errors;
* `run`: `run_tflite` and the run-time checks of a converted file;
* `inspect`: `inspect_tflite` / `TFLiteReport` (ops, ranks, I/O, XNNPACK coverage, float ops);
* `metadata`: keras_mvit2's JSON metadata (`tflite_metadata`, `read_tflite_metadata`);
  `standard_metadata`: the standard ``TFLITE_METADATA`` (MediaPipe Tasks, Task Library),
  through the generated `metadata_schema`;
* `flatbuffer`: reading and writing flatbuffers; `pointwise_fusion`: the 1x1 convolution
  fusion; `detection_postprocess`: SSDLite ending in ``TFLite_Detection_PostProcess``;
* `signature`: the ``serving_default`` SignatureDef every file carries;
* `edge_quantizer`: `quantize_with_edge_quantizer`, ai-edge-quantizer recipes (int4 weights,
  static int8 / int16x8, per-layer float / int16x8) on a float32 export;
* `layer_errors`: the int8 error of each Keras layer (`layer_errors`, `plot_layer_errors`),
  `layer_names`: TFLite tensor names -> Keras layer paths, `float_layers`: int8 files with
  named layers kept in float (`to_tflite(float_layers=...)`);
* `torch_road`: `to_tflite_via_torch`, the same file from a model on Keras' PyTorch backend
  through litert-torch (`keras_mvit2.export.roads`); `formats`: the numeric formats both
  roads share.

On the PyTorch backend only the TensorFlow-free modules are imported here (the torch road,
reading, running, inspecting and quantizing files, the metadata); the TensorFlow road's
names raise `TensorFlowBackendRequiredError` when used.
"""

from keras_mvit2.backend import keras_backend_name
from keras_mvit2.export.roads import tensorflow_road_getattr
from keras_mvit2.export.tflite.edge_quantizer import (
    EDGE_RECIPES,
    quantize_with_edge_quantizer,
    tflite_layer_names,
)
from keras_mvit2.export.tflite.inspect import (
    TensorDetails,
    TFLiteReport,
    inspect_tflite,
    summarize_flatbuffer,
)
from keras_mvit2.export.tflite.metadata import (
    METADATA_FORMAT,
    METADATA_NAME,
    METADATA_VERSION,
    embed_all_metadata,
    embed_metadata,
    read_tflite_metadata,
    tflite_metadata,
)
from keras_mvit2.export.tflite.quantization import CALIBRATED, IO_DTYPES, QUANTIZATIONS
from keras_mvit2.export.tflite.run import run_tflite
from keras_mvit2.export.tflite.signature import SERVING_SIGNATURE
from keras_mvit2.export.tflite.target import TFLITE, TFLiteTarget
from keras_mvit2.export.tflite.torch_road import to_tflite_via_torch

#: The TensorFlow road's names: imported on TensorFlow, an error naming the fix elsewhere.
_TENSORFLOW_ROAD = ("LayerError", "UnsupportedOpError", "layer_errors", "layer_errors_of_file",
                    "plot_layer_errors", "to_tflite", "with_detection_postprocess")

if keras_backend_name() == "tensorflow":
    from keras_mvit2.export.tflite.convert import to_tflite
    from keras_mvit2.export.tflite.detection_postprocess import with_detection_postprocess
    from keras_mvit2.export.tflite.diagnose import UnsupportedOpError
    from keras_mvit2.export.tflite.layer_errors import (
        LayerError,
        layer_errors,
        layer_errors_of_file,
        plot_layer_errors,
    )
else:
    __getattr__ = tensorflow_road_getattr(__name__, _TENSORFLOW_ROAD)

__all__ = [
    "CALIBRATED",
    "EDGE_RECIPES",
    "IO_DTYPES",
    "METADATA_FORMAT",
    "METADATA_NAME",
    "METADATA_VERSION",
    "QUANTIZATIONS",
    "SERVING_SIGNATURE",
    "TFLITE",
    "LayerError",
    "TFLiteReport",
    "TFLiteTarget",
    "TensorDetails",
    "UnsupportedOpError",
    "embed_all_metadata",
    "embed_metadata",
    "inspect_tflite",
    "layer_errors",
    "layer_errors_of_file",
    "plot_layer_errors",
    "quantize_with_edge_quantizer",
    "read_tflite_metadata",
    "run_tflite",
    "summarize_flatbuffer",
    "tflite_layer_names",
    "tflite_metadata",
    "to_tflite",
    "to_tflite_via_torch",
    "with_detection_postprocess",
]
