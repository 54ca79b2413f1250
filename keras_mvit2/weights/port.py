"""Porting a PyTorch checkpoint into a Keras model, the part every family shares: a Keras
variable and the layout transform of its torch tensor (`PortTarget`), the check of a whole
state dict against the expected tensors before anything is assigned (`match_state`), and
the assignment (`assign_values`).

Each model family walks its own layers to list its expected tensors under timm's names:
`keras_mvit2.models.mobilevitv2.mobilevitv2_port` (MobileViTv2: ml-cvnets, timm and HF
names) and `keras_mvit2.models.timm_port` (MobileViT v1, ViT / DeiT).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["TRANSFORMS", "PortTarget", "assign_values", "listing", "match_state"]

#: torch -> Keras permutations, by kind of tensor.
TRANSFORMS: dict[str, tuple[int, ...] | None] = {
    "conv": (2, 3, 1, 0),       # (O, I, kh, kw) -> (kh, kw, I, O)
    "depthwise": (2, 3, 0, 1),  # (C, 1, kh, kw) -> (kh, kw, C, 1)
    "dense": (1, 0),            # (out, in) -> (in, out)
    "copy": None,
}

_MAX_LISTED = 10


@dataclass(frozen=True)
class PortTarget:
    """One Keras variable and how a torch tensor is turned into it."""

    variable: Any  # keras.Variable
    transform: str  # a key of TRANSFORMS

    @property
    def keras_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.variable.shape)

    @property
    def torch_shape(self) -> tuple[int, ...]:
        """The torch shape that transforms into `keras_shape`."""
        perm = TRANSFORMS[self.transform]
        if perm is None:
            return self.keras_shape
        shape = [0] * len(perm)
        for keras_axis, torch_axis in enumerate(perm):
            shape[torch_axis] = self.keras_shape[keras_axis]
        return tuple(shape)

    def to_keras(self, array: np.ndarray) -> np.ndarray:
        perm = TRANSFORMS[self.transform]
        if perm is None:
            return array
        if array.ndim != len(perm):
            raise ValueError(f"expected a rank-{len(perm)} tensor")
        return np.transpose(array, perm)



def match_state(
    state: Mapping[str, Any], targets: Mapping[str, PortTarget], label=repr
) -> tuple[list[str], list[str], list[tuple[PortTarget, np.ndarray]]]:
    """Checks every target tensor of `state` before anything is assigned.

    Returns `(missing, mismatched, values)`: the target keys absent from `state`, one
    message per tensor whose shape does not convert to its variable's (named with
    `label(key)`), and the `(target, converted array)` pairs ready to assign.
    """
    missing = [k for k in targets if k not in state]
    mismatched: list[str] = []
    values: list[tuple[PortTarget, np.ndarray]] = []
    for key, target in targets.items():
        if key not in state:
            continue
        array = np.asarray(state[key])
        try:
            converted = target.to_keras(array)
        except ValueError:
            converted = None
        if converted is None or tuple(converted.shape) != target.keras_shape:
            mismatched.append(
                f"{label(key)}: torch shape {tuple(array.shape)}, but Keras variable "
                f"{target.variable.path!r} has shape {target.keras_shape} "
                f"(expects torch shape {target.torch_shape}, {target.transform} transform)"
            )
            continue
        values.append((target, converted))
    return missing, mismatched, values


def assign_values(values: list[tuple[PortTarget, np.ndarray]]) -> None:
    """Assigns each converted array to its variable (after `match_state` found no problem)."""
    for target, converted in values:
        target.variable.assign(converted.astype(target.variable.dtype, copy=False))


def listing(items: list[str]) -> str:
    """`items` one per indented line, the first ten, then how many more."""
    shown = "\n".join(f"    {item}" for item in items[:_MAX_LISTED])
    if len(items) > _MAX_LISTED:
        shown += f"\n    ... and {len(items) - _MAX_LISTED} more"
    return shown
