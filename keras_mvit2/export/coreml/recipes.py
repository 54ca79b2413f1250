"""The Core ML compression candidates, as a table an optimizer iterates.

Each `CoreMLRecipe` is a set of `to_coreml` keyword arguments (``arguments``) and what its
accuracy measurement on this host is worth (``measurement``, see
`keras_mvit2.export.coreml.package_weights`): every candidate is a float16 program (what
the Neural Engine runs) except ``fp32``, so the weight-only candidates are measured with
their exact weights and float32 activations (``"approximate: float16 activations"``);
W8A8 is simulated (``measurable`` False). Use::

    for name, recipe in COMPRESSION_RECIPES.items():
        images = recipe.calibration_images(held_in) if recipe.needs_calibration else None
        to_coreml(model, f"{name}.mlpackage", **recipe.options(images))
        scores = predict_with_package_weights(model, f"{name}.mlpackage", held_out)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

__all__ = ["COMPRESSION_RECIPES", "CoreMLRecipe"]

EXACT = "exact"
FLOAT16_ACTIVATIONS = "approximate: float16 activations"
SIMULATED = "simulated: activation quantization"


@dataclasses.dataclass(frozen=True)
class CoreMLRecipe:
    """One Core ML compression candidate.

    Attributes:
        name: the table key (``"palettize_4bit_grouped"``).
        arguments: the `to_coreml` keyword arguments (besides `calibration_images`).
        measurement: what `predict_with_package_weights` measures for it: ``"exact"``,
            ``"approximate: float16 activations"`` (exact weights, float32 activations)
            or ``"simulated: activation quantization"`` (not measurable here).
        description: one line for a report.
    """

    name: str
    arguments: Mapping[str, Any]
    measurement: str
    description: str

    @property
    def measurable(self) -> bool:
        """Its accuracy is measured here with the package's own weights (exactly, or with
        float32 activations for a float16 program); False for activation quantization."""
        return self.measurement != SIMULATED

    @property
    def needs_calibration(self) -> bool:
        return self.arguments.get("activation_quantization") is not None

    def options(self, calibration_images: np.ndarray | None = None) -> dict[str, Any]:
        """`to_coreml`'s keyword arguments, with `calibration_images` `(N, H, W, 3)` in
        [0, 1] where the recipe calibrates (W8A8): a ValueError if they are missing."""
        options = dict(self.arguments)
        if self.needs_calibration:
            if calibration_images is None:
                raise ValueError(f"Core ML recipe {self.name!r} calibrates its activations: "
                                 "pass calibration_images (held-in images, not the test ones).")
            options["calibration_images"] = calibration_images
        return options


def _recipe(name: str, measurement: str, description: str, **options: Any) -> CoreMLRecipe:
    return CoreMLRecipe(name, MappingProxyType({"quantization": "float16", **options}),
                        measurement, description)


def _palettize(bits: int, grouped: bool) -> CoreMLRecipe:
    name = f"palettize_{bits}bit" + ("_grouped" if grouped else "")
    granularity = ("per_grouped_channel", "iOS18") if grouped else ("per_tensor", "iOS16")
    where = "one table per 16 output channels (iOS 18+)" if grouped else "one table per weight"
    return _recipe(name, FLOAT16_ACTIVATIONS,
                   f"k-means palettization, {bits} bits, {where}; float16 compute",
                   weight_compression="palettize", palettize_bits=bits,
                   palettize_granularity=granularity[0], palettize_group_size=16,
                   minimum_deployment_target=granularity[1])


#: name -> `CoreMLRecipe`, from the largest file to the smallest (roughly).
COMPRESSION_RECIPES: dict[str, CoreMLRecipe] = {
    recipe.name: recipe for recipe in (
        CoreMLRecipe("fp32", MappingProxyType({"quantization": "float32"}), EXACT,
                     "float32 weights and compute (reference; CPU / GPU only)"),
        _recipe("fp16", FLOAT16_ACTIVATIONS, "float16 weights and compute"),
        _recipe("int8_linear", FLOAT16_ACTIVATIONS,
                "int8 weights, linear symmetric, one scale per output channel; float16 compute",
                weight_compression="int8"),
        _recipe("w8a8", SIMULATED,
                "int8 weights and int8 activations (calibrated; iOS 17+); accuracy not "
                "measurable here", weight_compression="int8", activation_quantization="int8",
                minimum_deployment_target="iOS17"),
        *(_palettize(bits, grouped) for bits in (8, 6, 4) for grouped in (False, True)),
    )
}
