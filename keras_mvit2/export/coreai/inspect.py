"""What a Core AI model asset (`.aimodel`) holds, read on any OS; predictions on macOS.

`inspect_coreai` reads the asset's program summary (functions, inputs, outputs, the
operation histogram, storage types) and its metadata with ``coreai-core``, which runs on
Linux; loading the program for predictions (`run_coreai`) needs Core AI's runtime on macOS.
TensorFlow-free, PyTorch-free.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np

from keras_mvit2.utils.files import disk_size

__all__ = ["CoreAIReport", "coreai_predictions_available", "inspect_coreai", "run_coreai"]

#: How to install coreai-torch and coreai-core (they install beside the project's pins).
COREAI_INSTALL = 'pip install -e ".[torch,coreai]"'


@dataclasses.dataclass
class CoreAIReport:
    """A saved Core AI asset.

    Attributes:
        path: the ``.aimodel`` folder.
        size_bytes: its size on disk.
        functions: the program's functions (``["main"]``).
        inputs: ``(name, type)`` of ``main``'s inputs, e.g. ``("image", "NDArray (Float32,
            1 × 256 × 256 × 3)")``.
        outputs: ``(name, type)`` of its outputs.
        op_histogram: Core AI op -> count, as the asset's summary counts them.
        storage_types: ``(dtype, element count)`` of the stored tensors.
        minimum_os: the OS version the program needs (``"27.0"``).
        description: the asset's model description.
        metadata: its creator-defined metadata (JSON values).
    """

    path: str
    size_bytes: int
    functions: list[str]
    inputs: list[tuple[str, str]]
    outputs: list[tuple[str, str]]
    op_histogram: dict[str, int]
    storage_types: list[str]
    minimum_os: str | None
    description: str
    metadata: dict[str, Any]

    @property
    def num_ops(self) -> int:
        """All ops of the program, constants included."""
        return sum(self.op_histogram.values())

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _asset(path: str | os.PathLike) -> Any:
    if importlib.util.find_spec("coreai") is None:
        raise ImportError(f"Reading a Core AI asset needs coreai-core: {COREAI_INSTALL}")
    from coreai.authoring.asset import AIModelAsset

    if not os.path.isdir(path):
        raise FileNotFoundError(f"No Core AI model asset at {os.fspath(path)!r}")
    return AIModelAsset.load(Path(path))


def inspect_coreai(path: str | os.PathLike) -> CoreAIReport:
    """Reads a `.aimodel` asset's program summary and metadata (any OS)."""
    asset = _asset(path)
    summary = asset.summary(include_statistics=True)
    main = summary.function_names[0]
    meta = asset.metadata
    return CoreAIReport(
        path=os.fspath(path), size_bytes=disk_size(path),
        functions=list(summary.function_names),
        inputs=[tuple(i) for i in summary.function_inputs(main)],
        outputs=[tuple(o) for o in summary.function_outputs(main)],
        op_histogram={str(op): int(n) for op, n in summary.operation_distribution},
        storage_types=[str(t) for t in summary.storage_types],
        minimum_os=summary._compatibility_version,
        description=meta.model_description,
        metadata=dict(meta.creator_defined_metadata),
    )


def coreai_predictions_available() -> bool:
    """Core AI's runtime loads and runs assets on macOS only."""
    return platform.system() == "Darwin"


def run_coreai(path: str | os.PathLike, images: np.ndarray) -> np.ndarray:
    """Runs images ``(B, H, W, 3)`` float32 in [0, 1] through the asset's ``main``, one at
    a time (the program's batch is 1), on macOS; returns its first output ``(B, ...)``."""
    if not coreai_predictions_available():
        raise RuntimeError(
            "Core AI predictions need macOS (Core AI's runtime); on "
            f"{platform.system()} inspect_coreai reads the asset's structure and metadata.")
    from coreai import runtime

    async def predict() -> np.ndarray:
        model = await runtime.AIModel.load(os.fspath(path))
        function = model.load_function("main")
        outputs = []
        for image in np.asarray(images, np.float32):
            result = await function({"image": runtime.NDArray(np.ascontiguousarray(image[None]))})
            outputs.append(np.asarray(next(iter(result.values())).numpy())[0])
        return np.stack(outputs)

    return asyncio.run(predict())
