"""What `finetune(..., weights=...)` and `mvit2 finetune --weights` start from, resolved to
a local file with its provenance.

One value names the source, in this order:

* `None`, `"none"` or `"random"`: random initialization (no file);
* an existing file: an ml-cvnets `.pt`, a timm `.pth` / `.bin` / `.safetensors`, or a
  Keras `.weights.h5` or `.keras` model (checked to be what its name says);
* a published tag (`"imagenet"`, `"imagenet22k_ft_in1k"`, ... as `weights=` of the
  builders, `keras_mvit2.list_weights()`), for the model being fine-tuned;
* a KerasHub preset name of ours (`"mobilevitv2_050_imagenet"`,
  `PretrainedWeights.preset`, `keras_mvit2.kerashub.PRESETS`): the same checkpoints by name;
* an `hf://<owner>/<repo>` id: a Hugging Face hub repository holding a timm MobileViTv2
  (`model.safetensors`, and `config.json` for its architecture and input size).

Downloads go through `keras_mvit2.weights.download` (huggingface_hub's cache,
`HF_ENDPOINT`, `HF_HUB_OFFLINE`, the format checks and their one-line errors).

```python
source = resolve_weights_source("imagenet", "mobilevitv2_050")
source.path, source.sha256, source.input_size, source.license
```
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from keras_mvit2.models.mobilevitv2.mobilevitv2_presets import (
    PRETRAINED_WEIGHTS,
    find_preset,
    find_weights,
    is_weights_tag,
    list_weights,
)
from keras_mvit2.weights.pretrained import PretrainedWeights

__all__ = [
    "APPLE_LICENSE",
    "HF_PREFIX",
    "WeightsSource",
    "resolve_weights_source",
]

#: The prefix of Hugging Face hub ids (KerasHub's spelling).
HF_PREFIX = "hf://"
#: Values that mean "no pretrained weights".
RANDOM_INIT = ("none", "random")
#: Apple's checkpoints as published: ml-cvnets' licence (timm's hub cards say `license: other`
#: and "See license details at" this file).
APPLE_LICENSE = {
    "id": "other",
    "name": "apple-ml-cvnets",
    "link": "https://github.com/apple/ml-cvnets/blob/main/LICENSE",
    "summary": "Apple's ml-cvnets licence (Apple sample-code terms: use, reproduce, modify "
               "and redistribute, with or without modifications; keep Apple's notice when "
               "redistributing unmodified; no use of Apple's name or marks; no patent "
               "licence; provided AS IS)",
}
_FILE_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".h5", ".keras")


@dataclasses.dataclass(frozen=True)
class WeightsSource:
    """Where the starting weights of a fine-tuning run come from.

    Attributes:
        kind: `"random"`, `"file"`, `"tag"`, `"preset"` or `"hf"`.
        value: what the user passed (`"imagenet"`, `"hf://timm/..."`, a path).
        model: the registered model the weights belong to (None: not known, a file).
        path: the local file to load (None for random init).
        sha256: SHA-256 of `path` (None for random init).
        tag: the published tag, where there is one.
        repo_id: the hub repository (`timm/mobilevitv2_050.cvnets_in1k`) or Apple's URL.
        input_size: the checkpoint's input side (None: not known).
        license: `{"id", "name", "link", "summary"}` of the weights as published, or None.
        trained_on: the checkpoint's training data, in words (None: not known).
        top1: its published ImageNet-1k top-1 (%), where there is one.
    """

    kind: str
    value: str | None
    model: str | None = None
    path: str | None = None
    sha256: str | None = None
    tag: str | None = None
    repo_id: str | None = None
    input_size: int | None = None
    license: dict[str, str] | None = None
    trained_on: str | None = None
    top1: float | None = None

    @property
    def pretrained(self) -> bool:
        return self.path is not None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _from_entry(kind: str, value: str, entry: PretrainedWeights) -> WeightsSource:
    from keras_mvit2.weights.download import download_weights

    resolved = download_weights(entry)
    return WeightsSource(
        kind=kind, value=value, model=entry.model, path=resolved.path,
        sha256=resolved.sha256, tag=entry.tag, repo_id=entry.location,
        input_size=entry.input_size, license=dict(APPLE_LICENSE),
        trained_on=entry.trained_on, top1=entry.top1)


def _hub_config(repo_id: str) -> dict | None:
    """The repo's timm `config.json`, or None where it has none (or cannot be read)."""
    from huggingface_hub import hf_hub_download

    try:
        path = hf_hub_download(repo_id, "config.json", library_name="keras_mvit2")
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except Exception:  # no config.json: the strict port still checks every tensor
        return None
    return config if isinstance(config, dict) else None


def _from_hf(value: str, model: str) -> WeightsSource:
    repo_id = value[len(HF_PREFIX):].strip("/")
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ValueError(
            f"weights {value!r}: a Hugging Face id is hf://<owner>/<repo>, e.g. "
            "hf://timm/mobilevitv2_050.cvnets_in1k.")
    for entry in PRETRAINED_WEIGHTS:  # a published one: its table row (tag, top-1, licence)
        if entry.source == "timm" and entry.location == repo_id:
            _check_model(value, entry.model, model)
            return _from_entry("hf", value, entry)
    from keras_mvit2.weights.download import download_weights

    config = _hub_config(repo_id) or {}
    architecture = config.get("architecture")
    if isinstance(architecture, str):
        _check_model(value, architecture.split(".")[0], model)
    cfg = config.get("pretrained_cfg") or {}
    size = cfg.get("input_size")
    entry = PretrainedWeights(
        model=model, tag=repo_id.replace("/", "--"), width_multiplier=0.0, source="timm",
        location=repo_id,
        filename="model.safetensors", timm_tag=cfg.get("tag"),
        input_size=int(size[-1]) if size else 0, crop_pct=float(cfg.get("crop_pct", 1.0)),
        interpolation=str(cfg.get("interpolation", "bicubic")), top1=float("nan"),
        top1_source="", file_size_mb=None, trained_on="")
    resolved = download_weights(entry)
    return WeightsSource(kind="hf", value=value, model=model, path=resolved.path,
                         sha256=resolved.sha256, repo_id=repo_id,
                         input_size=int(size[-1]) if size else None)


def _check_model(value: str, weights_model: str, model: str) -> None:
    if weights_model != model:
        raise ValueError(
            f"weights {value!r} holds a {weights_model}, but the model is {model}: pass "
            f"--model {weights_model}, or weights of {model} "
            f"(its tags: {[w.tag for w in list_weights(model)] if _published(model) else []}).")


def _published(model: str) -> bool:
    return any(w.model == model for w in PRETRAINED_WEIGHTS)


def _looks_like_a_path(value: str) -> bool:
    return os.sep in value or "/" in value or value.lower().endswith(_FILE_SUFFIXES)


def _unknown(value: str, model: str) -> ValueError:
    tags = sorted({w.tag for w in list_weights(model)}) if _published(model) else []
    return ValueError(
        f"weights {value!r} is neither a file nor a published tag of {model} "
        f"({tags or 'none'}), a KerasHub preset name (e.g. {model}_imagenet) or an "
        "hf://<owner>/<repo> id; pass one of those, or 'none' for random initialization.")


def resolve_weights_source(value: str | os.PathLike | None, model: str) -> WeightsSource:
    """Resolves `value` (see the module docstring) for `model`, downloading if needed.

    Args:
        value: None / "none" / "random", a file, a tag, a preset name or an `hf://` id.
        model: the registered model being fine-tuned (`"mobilevitv2_050"`).

    Returns:
        A `WeightsSource` (`path` is the local file to load, None for random init).

    Raises:
        FileNotFoundError: a path that does not exist.
        ValueError: a value that names nothing, weights of another model, or a file that
            is not what its name says (`.keras` that is no Keras archive, say).
        WeightsDownloadError: the download failed or is not a checkpoint.
    """
    if value is None:
        return WeightsSource(kind="random", value=None, model=model)
    text = os.fspath(value)
    if text.strip().lower() in RANDOM_INIT:
        return WeightsSource(kind="random", value=text, model=model)
    if os.path.isfile(text):
        from keras_mvit2.utils.files import sha256_file
        from keras_mvit2.utils.model_files import check_file_format

        check_file_format(text, what=f"weights {text!r}")  # before any training starts
        return WeightsSource(kind="file", value=text, path=os.path.abspath(text),
                             sha256=sha256_file(text))
    if text.startswith(HF_PREFIX):
        return _from_hf(text, model)
    if is_weights_tag(text) and not os.path.exists(text):
        return _from_entry("tag", text, find_weights(model, text))
    preset = find_preset(text)
    if preset is not None:
        _check_model(text, preset.model, model)
        return _from_entry("preset", text, preset)
    if os.path.isdir(text):
        raise ValueError(f"weights {text!r} is a folder; pass the checkpoint file in it.")
    if _looks_like_a_path(text):
        raise FileNotFoundError(
            f"Pretrained weights not found: {text!r}. Pass an ml-cvnets .pt, a timm "
            ".pth/.bin/.safetensors, a Keras .weights.h5 or .keras, a published tag "
            "(imagenet), a KerasHub preset name or an hf:// id.")
    raise _unknown(text, model)
