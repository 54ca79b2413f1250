"""What a Core ML ML Program holds and what it predicts: `CoreMLReport`, `inspect_coreml`,
`run_coreml`.

`inspect_coreml` reads the saved program's structure (op types, ranks, inputs, outputs and
metadata), which is what can be checked on any OS; predictions (`run_coreml`) need macOS,
Core ML's runtime (`coreml_predictions_available`).
"""

import os
import platform
from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

from keras_mvit2.utils.files import disk_size

__all__ = [
    "CoreMLReport",
    "coreml_class_names",
    "coreml_predictions_available",
    "inspect_coreml",
    "run_coreml",
]


@dataclass
class CoreMLReport:
    """Structure of a converted ML Program."""

    path: str
    size_bytes: int
    spec_version: int
    op_histogram: dict[str, int]
    max_tensor_rank: int
    inputs: list[dict] = field(default_factory=list)
    outputs: list[dict] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def num_ops(self) -> int:
        """Compute ops of the program: every op but ``const`` (the constants), the same
        definition as `TFLiteReport.num_ops` (a flatbuffer holds constants as tensors)."""
        return sum(n for op, n in self.op_histogram.items() if op != "const")

    @property
    def input_dtype(self) -> str | None:
        """The first input's feature type (``"imageType"``, ``"multiArrayType"``)."""
        return str(self.inputs[0].get("type")) if self.inputs else None

    @property
    def output_dtype(self) -> str | None:
        """The first output's feature type."""
        return str(self.outputs[0].get("type")) if self.outputs else None

    def to_dict(self) -> dict:
        return asdict(self)


def _coremltools():
    """coremltools, imported without TensorFlow on Keras' PyTorch backend
    (`keras_mvit2.export.roads.import_coremltools`)."""
    from keras_mvit2.export.roads import import_coremltools

    return import_coremltools()


def _feature(description) -> dict:
    kind = description.type.WhichOneof("Type")
    entry = {"name": description.name, "type": kind}
    if kind == "imageType":
        image = description.type.imageType
        entry.update(width=image.width, height=image.height,
                     color_space=type(image).ColorSpace.Name(image.colorSpace))
    elif kind == "multiArrayType":
        array = description.type.multiArrayType
        entry.update(shape=list(array.shape),
                     dtype=type(array).ArrayDataType.Name(array.dataType))
    return entry


def inspect_coreml(path: str | os.PathLike) -> CoreMLReport:
    """Reads a saved `.mlpackage` and reports its ops, ranks, inputs and outputs."""
    ct = _coremltools()
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"Core ML model not found: {path!r}")
    spec = ct.models.MLModel(path, skip_model_load=True).get_spec()
    if spec.WhichOneof("Type") != "mlProgram":
        raise ValueError(f"{path!r} is not an ML Program (found {spec.WhichOneof('Type')}).")
    histogram: Counter = Counter()
    max_rank = 0
    for op in _operations(spec):
        histogram[op.type] += 1
        for output in op.outputs:
            if output.type.WhichOneof("type") == "tensorType":
                max_rank = max(max_rank, output.type.tensorType.rank)
    return CoreMLReport(
        path=path,
        size_bytes=disk_size(path),
        spec_version=spec.specificationVersion,
        op_histogram=dict(sorted(histogram.items())),
        max_tensor_rank=max_rank,
        inputs=[_feature(d) for d in spec.description.input],
        outputs=[_feature(d) for d in spec.description.output],
        metadata=dict(spec.description.metadata.userDefined),
    )


def coreml_class_names(path: str | os.PathLike) -> list[str] | None:
    """The class names of a Core ML classifier (its ``classify`` op's classes), or None."""
    ct = _coremltools()
    spec = ct.models.MLModel(os.fspath(path), skip_model_load=True).get_spec()
    for op in _operations(spec):
        if op.type == "classify" and "classes" in op.inputs:
            classes = op.inputs["classes"].arguments[0].value.immediateValue.list
            return [str(v.immediateValue.tensor.strings.values[0]) for v in classes.values]
    return None


def _operations(spec):
    """Every op of the ML Program `spec`, function by function, block by block."""
    for function in spec.mlProgram.functions.values():
        for block in function.block_specializations.values():
            yield from block.operations


def coreml_predictions_available() -> bool:
    """Core ML predictions run only on macOS."""
    return platform.system() == "Darwin"


def run_coreml(path: str | os.PathLike, images: np.ndarray) -> np.ndarray:
    """Runs a batch of images (uint8 or float in [0, 255], `(B, H, W, 3)`) on macOS."""
    if not coreml_predictions_available():
        raise RuntimeError(
            "Core ML predictions need macOS (Core ML's runtime); on "
            f"{platform.system()} use inspect_coreml for structural checks."
        )
    ct = _coremltools()
    from PIL import Image

    mlmodel = ct.models.MLModel(os.fspath(path))
    outputs = []
    for image in images:
        pil = Image.fromarray(np.clip(image, 0, 255).astype("uint8"), "RGB")
        result = mlmodel.predict({"image": pil})
        value = next(v for v in result.values() if not isinstance(v, str))
        if isinstance(value, dict):  # classifier: probabilities keyed by label
            value = np.array(list(value.values()))
        outputs.append(np.asarray(value, "float32").reshape(-1))
    return np.stack(outputs)
