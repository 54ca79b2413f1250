"""One published checkpoint, as the weights machinery reads it: `PretrainedWeights` (where
the file lives, its input size and evaluation transform, its published top-1).

The rows live beside the family's builders (MobileViTv2's:
`keras_mvit2.models.mobilevitv2.mobilevitv2_presets`); `keras_mvit2.weights.download` fetches
and checks a row's file.
"""

from __future__ import annotations

import dataclasses
import math

__all__ = ["APPLE_BASE_URL", "PretrainedWeights"]

#: Apple's ml-cvnets MobileViTv2 classification folder (README-model-zoo.md); the
#: `MVIT2_APPLE_URL` mirror of `keras_mvit2.weights.download` replaces this prefix.
APPLE_BASE_URL = (
    "https://docs-assets.developer.apple.com/ml-research/models/cvnets-v2/classification/"
    "mobilevitv2"
)


@dataclasses.dataclass(frozen=True)
class PretrainedWeights:
    """One published checkpoint.

    Attributes:
        model: registered model name, e.g. `"mobilevitv2_050"`.
        tag: the `weights=` value that selects it, e.g. `"imagenet"`.
        width_multiplier: the model's width.
        source: `"timm"` (Hugging Face hub, safetensors) or `"apple"` (ml-cvnets `.pt`,
            needs the `torch` extra).
        location: the hub repo id (timm) or the URL (apple).
        filename: the file in the repo (timm) or the name of the downloaded file (apple).
        timm_tag: timm's pretrained tag (`cvnets_in1k`, ...), `None` for Apple-only files.
        input_size: the checkpoint's square input size (256 or 384).
        crop_pct: evaluation center-crop fraction: the shorter side is resized to
            `floor(input_size / crop_pct)`, then the center `input_size` square is kept.
        interpolation: resize interpolation of the evaluation transform.
        top1: published ImageNet-1k validation top-1 (%).
        top1_source: where `top1` comes from.
        file_size_mb: download size in MB as shown by the hub (`None`: not published).
        trained_on: the training data, in words.
    """

    model: str
    tag: str
    width_multiplier: float
    source: str
    location: str
    filename: str
    timm_tag: str | None
    input_size: int
    crop_pct: float
    interpolation: str
    top1: float
    top1_source: str
    file_size_mb: float | None
    trained_on: str

    @property
    def resize_size(self) -> int:
        """The shorter side before the center crop: `floor(input_size / crop_pct)` (timm)."""
        return math.floor(self.input_size / self.crop_pct)

    @property
    def needs_torch(self) -> bool:
        """Whether reading the download needs torch (Apple's pickled `.pt`)."""
        return self.source == "apple"

    @property
    def preset(self) -> str:
        """The KerasHub preset name of the checkpoint: `"<model>_<tag>"`, e.g.
        `"mobilevitv2_050_imagenet"`."""
        return f"{self.model}_{self.tag}"

    @property
    def url(self) -> str:
        """A browsable address of the file."""
        if self.source == "timm":
            return f"https://huggingface.co/{self.location}/blob/main/{self.filename}"
        return self.location

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
