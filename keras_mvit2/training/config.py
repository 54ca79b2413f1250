"""Training configuration: a validated dataclass tree, loaded from YAML files or dicts.

Every section is a frozen dataclass whose fields are type- and range-checked on
construction, so a config built in Python is checked exactly like one read from YAML.
Unknown keys raise a `ValueError` naming the key and listing the valid ones; a value of
the wrong type or out of range raises a `ValueError` naming the field and the value.

```yaml
model:     {name: mobilevitv2_050, image_size: 64}
data:      {source: fashion_mnist, batch_size: 64}
optimizer: {name: adamw, lr: 0.002, reference_batch_size: 1024, weight_decay: 0.05}
schedule:  {name: cosine, warmup_epochs: 1, warmup_init_lr: 1.0e-6, min_lr: 2.0e-5}
augment:   {random_resized_crop: true, rrc_scale: [0.35, 1.0]}   # keras_mvit2.data.AugmentConfig
ema:       {enabled: true, decay: 0.9995}
multiscale: {enabled: false}
training:  {epochs: 10, precision: auto, strategy: default, label_smoothing: 0.1}
output:    {dir: runs/fashion_mnist}
```

Scaling rule (Goyal et al., 2017, linear scaling): `data.batch_size` is the batch of
one replica (one GPU / TPU core / CPU); the global batch is `batch_size * replicas`, and
every learning rate of the config (`optimizer.lr`, `schedule.warmup_init_lr`,
`schedule.min_lr`) is given for a global batch of `optimizer.reference_batch_size` and
multiplied by `global_batch / reference_batch_size`. The paper's recipe is lr 0.002 at
1024 images (128 per GPU x 8 GPUs).
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any, Literal

import yaml

from keras_mvit2.data import AugmentConfig
from keras_mvit2.utils.files import write_text

Precision = Literal["auto", "float32", "mixed_float16", "mixed_bfloat16"]
Strategy = Literal["default", "mirrored", "multi_worker", "tpu"]
Source = Literal["image_folder", "tfrecords", "tfds", "fashion_mnist"]


# --------------------------------------------------------------------------------------
# Generic validation
# --------------------------------------------------------------------------------------


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        args = typing.get_args(tp)
        inner = _describe(args[0]) if args else "any"
        kind = "a list" if origin is list else f"a list of {len(args)}"
        return f"{kind} of {inner}"
    if tp is type(None):
        return "null"
    if tp is float:
        return "a number"
    if tp is int:
        return "an int"
    if tp is bool:
        return "a bool (true/false)"
    if tp is str:
        return "a string"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any) -> tuple[bool, Any]:
    """(ok, converted value) for a value against a type annotation."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return True, value
    if origin is Literal:
        return value in typing.get_args(tp) and not isinstance(value, bool), value
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            ok, converted = _coerce(value, arg)
            if ok:
                return True, converted
        return False, value
    if tp is type(None):
        return value is None, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return True, float(value)
        return False, value
    if tp is str:
        return isinstance(value, str), value
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            return False, value
        args = typing.get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis and len(args) != len(value):
            return False, value
        items = []
        for i, item in enumerate(value):
            arg = args[0] if origin is list or args[-1] is Ellipsis else args[i]
            ok, converted = _coerce(item, arg)
            if not ok:
                return False, value
            items.append(converted)
        return True, tuple(items) if origin is tuple else items
    return isinstance(value, tp), value


class _Section:
    """Mixin: type-checks every field on construction, then runs `_check` (ranges)."""

    _section: typing.ClassVar[str] = ""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            ok, converted = _coerce(value, hints[field.name])
            if not ok:
                raise ValueError(
                    f"Config field {self._section}.{field.name} must be "
                    f"{_describe(hints[field.name])}. Received: {field.name}={value!r}"
                )
            object.__setattr__(self, field.name, converted)
        self._check()

    def _check(self) -> None:
        pass

    def _fail(self, name: str, rule: str) -> None:
        raise ValueError(
            f"Config field {self._section}.{name} must be {rule}. "
            f"Received: {name}={getattr(self, name)!r}"
        )

    def _require(self, condition: bool, name: str, rule: str) -> None:
        if not condition:
            self._fail(name, rule)


# --------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelConfig(_Section):
    """The network.

    Attributes:
        name: a model of `keras_mvit2.list_models()` (e.g. `mobilevitv2_050`).
        image_size: training and evaluation resolution (square), >= 32.
        num_classes: classifier size; `null` takes the number of classes of the data.
        dropout: dropout before the classifier (reference 0).
        drop_path_rate: stochastic depth of the deepest transformer layer, growing
            linearly from 0 (`MobileViTV2(drop_path_rate=...)`); the paper uses 0.
        weights: pretrained weights to start from (fine-tuning): an ml-cvnets/timm
            checkpoint or a Keras `.weights.h5`; the classifier is new unless the file's
            classifier has `num_classes` outputs and `new_head` is false.
        new_head: with `weights`, always start from a new (randomly initialized) classifier.
        freeze_backbone: with `weights`, train only the classifier (frozen BN statistics).
        sync_batch_norm: synchronize BatchNorm statistics across replicas (SyncBN). Makes
            multi-replica training match one replica at the same global batch.
        attention: the attention inside every transformer layer: `null` keeps the model's
            own (`separable` for `mobilevitv2_*`, `mha` for `mobilevit_*` and `deit_*`), a
            name of `keras_mvit2.attention.available()` or an alias (stored as its
            canonical name), or a mapping with its arguments, e.g.
            `{name: linformer, projected_tokens: 16}` (`--set model.attention=mha`).
    """

    _section: typing.ClassVar[str] = "model"

    name: str = "mobilevitv2_100"
    image_size: int = 256
    num_classes: int | None = None
    dropout: float = 0.0
    drop_path_rate: float = 0.0
    weights: str | None = None
    new_head: bool = True
    freeze_backbone: bool = False
    sync_batch_norm: bool = False
    attention: str | dict | None = None

    def _check(self) -> None:
        from keras_mvit2.models import list_models

        self._require(self.name in list_models(), "name", f"one of {list_models()}")
        self._require(self.image_size >= 32, "image_size", "an int >= 32")
        self._require(self.num_classes is None or self.num_classes >= 1, "num_classes",
                      "null or an int >= 1")
        self._require(0.0 <= self.dropout < 1.0, "dropout", "in [0, 1)")
        self._require(0.0 <= self.drop_path_rate < 1.0, "drop_path_rate", "in [0, 1)")
        self._require(not self.freeze_backbone or self.weights is not None, "freeze_backbone",
                      "false unless model.weights is set (a frozen random backbone)")
        if self.attention is not None:
            object.__setattr__(self, "attention", self._checked_attention())

    def _checked_attention(self) -> str | dict:
        """`attention` with its canonical name; its arguments checked by building it once."""
        from keras_mvit2.layers import attention_registry

        value = self.attention
        args = dict(value) if isinstance(value, dict) else {}
        name = args.pop("name", None) if isinstance(value, dict) else value
        rule = (f"null, one of {attention_registry.available()} (or an alias), or a mapping "
                "such as {name: linformer, projected_tokens: 16}")
        try:
            name = attention_registry.canonical_name(str(name)) if name is not None else None
        except ValueError:
            name = None
        self._require(name is not None, "attention", rule)
        try:
            attention_registry.get(name, **args)
        except (TypeError, ValueError) as err:
            self._fail("attention", f"a mapping of arguments that {name!r} accepts ({err})")
        return {"name": name, **args} if args else name


@dataclasses.dataclass(frozen=True)
class DataConfig(_Section):
    """Where the images come from, and batching.

    Attributes:
        source: `image_folder` (class sub-folders, the ImageNet layout), `tfrecords`
            (shards of `tf.train.Example`), `tfds` (a TensorFlow Datasets name) or
            `fashion_mnist` (Debian's `dataset-fashion-mnist`).
        train: image folder / TFRecord file pattern / TFDS data_dir / Fashion-MNIST
            folder of the training data (`null`: the source's default where it has one).
        validation: the same for the validation data; `null` with `image_folder` and
            `validation_fraction > 0` holds out a stratified part of `train`.
        tfds_name: the TFDS dataset name (source `tfds`).
        train_split, validation_split: split names for `tfds` and `fashion_mnist`
            (Fashion-MNIST: `train` / `test`; TFDS e.g. `train` / `validation`);
            `validation_split: null` means no validation data.
        validation_fraction: fraction of an image folder held out for validation.
        class_names: class names of a `tfrecords` source (label order).
        train_limit, validation_limit: use only the first N examples (quick runs).
        batch_size: images per replica and step (global batch = batch_size x replicas).
        eval_batch_size: images per replica for evaluation (`null`: `batch_size`).
        crop_ratio: evaluation crop (resize the shorter side to size / crop_ratio, then
            center crop); the reference crops 256 from 288 (0.889).
        shuffle_buffer: record-level shuffle buffer (index-based sources shuffle fully).
        seed: seed of the data order and augmentation (epoch e uses `seed + e`).
    """

    _section: typing.ClassVar[str] = "data"

    source: Source = "fashion_mnist"
    train: str | None = None
    validation: str | None = None
    tfds_name: str | None = None
    train_split: str = "train"
    validation_split: str | None = "test"
    validation_fraction: float = 0.0
    class_names: list[str] | None = None
    train_limit: int | None = None
    validation_limit: int | None = None
    batch_size: int = 128
    eval_batch_size: int | None = None
    crop_ratio: float = 0.875
    shuffle_buffer: int = 10_000
    seed: int = 0

    def _check(self) -> None:
        self._require(self.batch_size >= 1, "batch_size", "an int >= 1")
        self._require(self.eval_batch_size is None or self.eval_batch_size >= 1,
                      "eval_batch_size", "null or an int >= 1")
        self._require(0.0 <= self.validation_fraction < 1.0, "validation_fraction", "in [0, 1)")
        self._require(0.0 < self.crop_ratio <= 1.0, "crop_ratio", "in (0, 1]")
        self._require(self.shuffle_buffer >= 1, "shuffle_buffer", "an int >= 1")
        for name in ("train_limit", "validation_limit"):
            value = getattr(self, name)
            self._require(value is None or value >= 1, name, "null or an int >= 1")
        if self.source in ("image_folder", "tfrecords"):
            self._require(self.train is not None, "train",
                          f"the path of the training data for source {self.source!r}")
        if self.source == "tfds":
            self._require(self.tfds_name is not None, "tfds_name",
                          "a TFDS dataset name (e.g. 'imagenette/320px-v2') for source 'tfds'")
        if self.validation_fraction > 0:
            self._require(self.source == "image_folder" and self.validation is None,
                          "validation_fraction", "0 unless source is image_folder with "
                          "validation: null (it holds out part of the training folder)")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(_Section):
    """Optimizer, loss-independent.

    Attributes:
        name: `adamw` (the paper's ImageNet recipe) or `sgd` (with momentum; fine-tuning).
        lr: peak learning rate at a global batch of `reference_batch_size`.
        reference_batch_size: the global batch `lr` is given for (linear scaling).
        weight_decay: decoupled weight decay (AdamW 0.05; SGD 4e-5 in Table 10).
        no_decay_1d: exclude norms, biases and every other 1-D weight from weight decay
            (ml-cvnets' `no_decay_bn_filter_bias`).
        beta1, beta2, epsilon: AdamW moments (torch's defaults 0.9, 0.999, 1e-8).
        momentum, nesterov: SGD.
        clip_global_norm: clip the global norm of the gradient of the whole (global) batch
            to this value (the paper: 10); `null` turns it off.
    """

    _section: typing.ClassVar[str] = "optimizer"

    name: Literal["adamw", "sgd"] = "adamw"
    lr: float = 0.002
    reference_batch_size: int = 1024
    weight_decay: float = 0.05
    no_decay_1d: bool = True
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    momentum: float = 0.9
    nesterov: bool = False
    clip_global_norm: float | None = 10.0

    def _check(self) -> None:
        self._require(self.lr > 0, "lr", "> 0")
        self._require(self.reference_batch_size >= 1, "reference_batch_size", "an int >= 1")
        self._require(self.weight_decay >= 0, "weight_decay", ">= 0")
        for name in ("beta1", "beta2", "momentum"):
            self._require(0.0 <= getattr(self, name) < 1.0, name, "in [0, 1)")
        self._require(self.epsilon > 0, "epsilon", "> 0")
        self._require(self.clip_global_norm is None or self.clip_global_norm > 0,
                      "clip_global_norm", "null or > 0")


@dataclasses.dataclass(frozen=True)
class ScheduleConfig(_Section):
    """Learning-rate schedule: linear warm-up, then cosine decay or constant.

    Attributes:
        name: `cosine` (warm-up then cosine from the peak to `min_lr` at the last step) or
            `constant` (warm-up then the peak, Table 10's "fixed").
        warmup_epochs: warm-up length in epochs (batch-size independent).
        warmup_steps: warm-up length in optimizer steps; overrides `warmup_epochs`.
        warmup_init_lr: learning rate at step 0 of the warm-up (the paper: 1e-6).
        min_lr: final learning rate of the cosine (ml-cvnets: 0.0002 = peak / 10).
    """

    _section: typing.ClassVar[str] = "schedule"

    name: Literal["cosine", "constant"] = "cosine"
    warmup_epochs: float = 0.0
    warmup_steps: int | None = None
    warmup_init_lr: float = 1e-6
    min_lr: float = 0.0

    def _check(self) -> None:
        self._require(self.warmup_epochs >= 0, "warmup_epochs", ">= 0")
        self._require(self.warmup_steps is None or self.warmup_steps >= 0, "warmup_steps",
                      "null or an int >= 0")
        self._require(self.warmup_init_lr >= 0, "warmup_init_lr", ">= 0")
        self._require(self.min_lr >= 0, "min_lr", ">= 0")


@dataclasses.dataclass(frozen=True)
class EMAConfig(_Section):
    """Exponential moving average of the weights (evaluated and saved separately).

    Attributes:
        enabled: keep an EMA of every weight (BatchNorm statistics included).
        decay: `ema = decay * ema + (1 - decay) * weight` after every step (ml-cvnets'
            momentum 0.0005 is decay 0.9995).
        warmup: use `min(decay, (1 + step) / (10 + step))` (TF's `num_updates` rule), so
            short runs get a useful average.
    """

    _section: typing.ClassVar[str] = "ema"

    enabled: bool = True
    decay: float = 0.9995
    warmup: bool = False

    def _check(self) -> None:
        self._require(0.0 <= self.decay < 1.0, "decay", "in [0, 1)")


@dataclasses.dataclass(frozen=True)
class MultiScaleConfig(_Section):
    """Multi-scale training (ml-cvnets' variable batch sampler).

    Each batch takes one of the sizes `model.image_size * scale` (rounded to a multiple of
    `size_divisor`) with the batch scaled by `(image_size / size)**2`, so memory stays
    constant. One classifier built for any size (`input_shape=(None, None, 3)`) trains on
    every size. Evaluation and the saved models use `model.image_size` (`mvit2 eval
    --image-size` runs a saved model at another size).

    Attributes:
        enabled: turn it on.
        scales: factors of `model.image_size` (ml-cvnets: 160..320 around 256).
        size_divisor: sizes are multiples of this (32: the model's output stride).
    """

    _section: typing.ClassVar[str] = "multiscale"

    enabled: bool = False
    scales: list[float] = dataclasses.field(
        default_factory=lambda: [0.625, 0.75, 1.0, 1.125, 1.25]
    )
    size_divisor: int = 32

    def _check(self) -> None:
        self._require(len(self.scales) >= 1 and all(s > 0 for s in self.scales), "scales",
                      "a non-empty list of positive factors")
        self._require(self.size_divisor >= 1, "size_divisor", "an int >= 1")


@dataclasses.dataclass(frozen=True)
class TrainingConfig(_Section):
    """The training loop.

    Attributes:
        epochs: number of epochs.
        steps_per_epoch: optimizer steps per epoch (`null`: one pass over the data).
        validation_steps: batches per validation (`null`: the whole validation data).
        validate_every: validate (raw and EMA weights) every N epochs; 0: only at the end.
        label_smoothing: label smoothing of the cross-entropy (the paper: 0.1).
        precision: `auto` (mixed_bfloat16 on TPU and GPUs of compute capability >= 8.0,
            mixed_float16 on GPUs >= 7.0, float32 otherwise, e.g. on CPU), or a Keras
            dtype policy name.
        strategy: `default` (one device), `mirrored` (all local GPUs), `multi_worker`
            (TF_CONFIG), `tpu`.
        tpu: TPU address for `TPUClusterResolver` (`null`/`local`: the local TPU VM).
        seed: seed of the weight initialization and dropout/stochastic depth.
        deterministic: `tf.config.experimental.enable_op_determinism()` and one
            intra-op and one inter-op thread (bitwise reproducible runs; slower). Start
            the process with `determinism.DETERMINISTIC_ENV` (TensorFlow reads it when it
            loads); a warning names what is missing.
        steps_per_execution: Keras' steps per `tf.function` call.
        jit_compile: compile the train step with XLA (`fit(jit_compile=True)`); off by
            default (single-device only: the step contains the replica all-reduce).
            TensorFlow's switch: JAX always compiles its step, PyTorch runs it eagerly.
    """

    _section: typing.ClassVar[str] = "training"

    epochs: int = 300
    steps_per_epoch: int | None = None
    validation_steps: int | None = None
    validate_every: int = 1
    label_smoothing: float = 0.1
    precision: Precision = "auto"
    strategy: Strategy = "default"
    tpu: str | None = None
    seed: int = 0
    deterministic: bool = False
    steps_per_execution: int = 1
    jit_compile: bool = False

    def _check(self) -> None:
        self._require(self.epochs >= 1, "epochs", "an int >= 1")
        for name in ("steps_per_epoch", "validation_steps"):
            value = getattr(self, name)
            self._require(value is None or value >= 1, name, "null or an int >= 1")
        self._require(self.validate_every >= 0, "validate_every", "an int >= 0")
        self._require(0.0 <= self.label_smoothing < 1.0, "label_smoothing", "in [0, 1)")
        self._require(self.steps_per_execution >= 1, "steps_per_execution", "an int >= 1")


@dataclasses.dataclass(frozen=True)
class OutputConfig(_Section):
    """Where the run writes, and what.

    Attributes:
        dir: run folder: `config.yaml`, `run.json`, `checkpoints/`, `tensorboard/`,
            `model.keras`, `model_ema.keras`, `metrics.json`.
        resume: continue from the last checkpoint in `dir` when there is one (a run of
            another length or schedule only with `train(..., replan=True)`, `mvit2 train
            --resume`); `false` starts over, after moving the earlier run's files to
            `dir/previous-<date>-<time>/` (`keras_mvit2.training.run_folder`).
        keep_checkpoints: number of epoch checkpoints kept (the newest).
        tensorboard: write TensorBoard logs.
        verbose: 0 silent, 1 progress bar (one line per epoch when standard output is not
            a terminal: a log file, a pipe, CI), 2 one line per epoch (Keras' `verbose`).
            Unless 0, the line saying what happens with the run folder is printed first.
    """

    _section: typing.ClassVar[str] = "output"

    dir: str = "runs/mvit2"
    resume: bool = True
    keep_checkpoints: int = 2
    tensorboard: bool = True
    verbose: Literal[0, 1, 2] = 1

    def _check(self) -> None:
        self._require(bool(self.dir), "dir", "a non-empty path")
        self._require(self.keep_checkpoints >= 1, "keep_checkpoints", "an int >= 1")


_SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "optimizer": OptimizerConfig,
    "schedule": ScheduleConfig,
    "augment": AugmentConfig,
    "ema": EMAConfig,
    "multiscale": MultiScaleConfig,
    "training": TrainingConfig,
    "output": OutputConfig,
}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The whole training configuration (see the module docstring for the YAML layout)."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = dataclasses.field(default_factory=ScheduleConfig)
    augment: AugmentConfig = dataclasses.field(default_factory=AugmentConfig)
    ema: EMAConfig = dataclasses.field(default_factory=EMAConfig)
    multiscale: MultiScaleConfig = dataclasses.field(default_factory=MultiScaleConfig)
    training: TrainingConfig = dataclasses.field(default_factory=TrainingConfig)
    output: OutputConfig = dataclasses.field(default_factory=OutputConfig)

    def __post_init__(self) -> None:
        for name, cls in _SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise ValueError(
                    f"TrainConfig.{name} must be a {cls.__name__}. "
                    f"Received: {name}={getattr(self, name)!r}"
                )
        if self.multiscale.enabled and self.model.image_size % self.multiscale.size_divisor:
            raise ValueError(
                "Multi-scale training needs model.image_size to be a multiple of "
                f"multiscale.size_divisor={self.multiscale.size_divisor}. "
                f"Received: image_size={self.model.image_size}"
            )
        if self.multiscale.enabled and self.training.steps_per_execution != 1:
            raise ValueError(
                "Multi-scale training runs one step per call (one trace per batch shape): "
                "set training.steps_per_execution to 1. "
                f"Received: steps_per_execution={self.training.steps_per_execution}"
            )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> TrainConfig:
        """Builds and validates a config from nested dicts (missing keys keep defaults)."""
        d = {} if d is None else d
        if not isinstance(d, Mapping):
            raise ValueError(f"A training config must be a mapping of sections. Received: {d!r}")
        _check_keys(d, list(_SECTIONS), "the config")
        sections = {}
        for name, section_cls in _SECTIONS.items():
            values = d.get(name) or {}
            if not isinstance(values, Mapping):
                raise ValueError(
                    f"Config section {name!r} must be a mapping of fields. "
                    f"Received: {name}={values!r}"
                )
            if section_cls is AugmentConfig:
                try:
                    sections[name] = AugmentConfig.from_dict(values)
                except ValueError as e:
                    raise ValueError(f"Config section 'augment': {e}") from None
                continue
            valid = [f.name for f in dataclasses.fields(section_cls)]
            _check_keys(values, valid, f"section {name!r}", prefix=f"{name}.")
            sections[name] = section_cls(**values)
        return cls(**sections)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (YAML-ready; tuples become lists); `from_dict` inverts it."""
        out = {}
        for name in _SECTIONS:
            section = getattr(self, name)
            values = section.to_dict() if isinstance(section, AugmentConfig) else (
                dataclasses.asdict(section)
            )
            out[name] = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=False)

    def save(self, path: str | os.PathLike) -> None:
        """Writes the config as YAML, atomically."""
        write_text(path, self.to_yaml())

    def replace(self, **sections: Mapping[str, Any]) -> TrainConfig:
        """A validated copy with some fields changed: `config.replace(model={"weights": p})`."""
        d = self.to_dict()
        for name, values in sections.items():
            _check_keys({name: None}, list(_SECTIONS), "the config")
            d[name] = {**d[name], **dict(values)}
        return TrainConfig.from_dict(d)


def _check_keys(d: Mapping[str, Any], valid: Sequence[str], where: str, prefix: str = ""):
    unknown = [k for k in d if k not in valid]
    if unknown:
        names = ", ".join(repr(f"{prefix}{k}") for k in unknown)
        raise ValueError(
            f"Unknown config key {names} in {where}. Valid keys: {', '.join(valid)}. "
            f"Received: {unknown}"
        )


# --------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading numbers as YAML 1.2 does.

    PyYAML follows YAML 1.1, whose floats need a dot and a signed exponent: `1e-3`, `1E-3`,
    `3e4` and `1.0e9` come back as strings. YAML 1.2 (and everyone writing a learning
    rate) reads them as floats.
    """


_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def load_yaml(text: str) -> Any:
    """Parses YAML text (safe, with YAML 1.2 floats such as `1e-3`, see `_Yaml12Loader`)."""
    return yaml.load(text, Loader=_Yaml12Loader)  # a SafeLoader subclass: safe


def packaged_configs() -> list[str]:
    """Names of the configs shipped in `keras_mvit2/configs` (e.g. `fashion_mnist`)."""
    folder = resources.files("keras_mvit2") / "configs"
    if not folder.is_dir():
        return []
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def _read_yaml(path_or_name: str | os.PathLike) -> dict[str, Any]:
    path = os.fspath(path_or_name)
    if not os.path.exists(path):
        name = os.path.basename(path)
        name = name[: -len(".yaml")] if name.endswith(".yaml") else name
        if os.sep in path or name not in packaged_configs():
            raise FileNotFoundError(
                f"Config file not found: {path!r}. Pass a YAML path or the name of a "
                f"packaged config: {', '.join(packaged_configs())}."
            )
        text = (resources.files("keras_mvit2") / "configs" / f"{name}.yaml").read_text()
    else:
        with open(path) as f:
            text = f.read()
    try:
        data = load_yaml(text)
    except yaml.YAMLError as e:
        raise ValueError(f"Config {path!r} is not valid YAML: {e}") from None
    if data is not None and not isinstance(data, dict):
        raise ValueError(f"Config {path!r} must be a mapping of sections. Received: {data!r}")
    return data or {}


def apply_overrides(d: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Applies `"section.field=value"` overrides (values parsed as YAML) to a config dict."""
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in d.items()}
    for item in overrides:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or len(parts) != 2 or not all(parts):
            raise ValueError(
                "Overrides look like 'section.field=value' (e.g. 'optimizer.lr=0.001'). "
                f"Received: {item!r}"
            )
        section, field = parts
        _check_keys({section: None}, list(_SECTIONS), "the config")
        try:
            value = load_yaml(text)
        except yaml.YAMLError as e:
            raise ValueError(f"Override {item!r} has a value that is not YAML: {e}") from None
        current = out.get(section) or {}
        if not isinstance(current, Mapping):
            raise ValueError(f"Config section {section!r} must be a mapping. Received: {current!r}")
        out[section] = {**current, field: value}
    return out


def load_config(
    path_or_dict: str | os.PathLike | Mapping[str, Any] | TrainConfig,
    overrides: list[str] | None = None,
) -> TrainConfig:
    """Loads and validates a training config.

    Args:
        path_or_dict: a YAML file, the name of a packaged config (`packaged_configs()`,
            e.g. `"fashion_mnist"`), a dict of sections, or a `TrainConfig`.
        overrides: `"section.field=value"` strings applied on top, values parsed as YAML
            (`"optimizer.lr=0.001"`, `"augment.rrc_scale=[0.35, 1]"`, `"model.weights=null"`).

    Returns:
        A validated `TrainConfig`.

    Raises:
        FileNotFoundError: no such file or packaged config.
        ValueError: an unknown key (named, with the valid keys), or a field of the wrong type
            or out of range (named, with the value).
    """
    if isinstance(path_or_dict, TrainConfig):
        data: Mapping[str, Any] = path_or_dict.to_dict()
    elif isinstance(path_or_dict, Mapping):
        data = path_or_dict
    elif isinstance(path_or_dict, str | os.PathLike):
        data = _read_yaml(path_or_dict)
    else:
        raise ValueError(
            "load_config takes a YAML path, a packaged config name, a dict or a TrainConfig. "
            f"Received: {path_or_dict!r}"
        )
    if overrides:
        data = apply_overrides(data, overrides)
    return TrainConfig.from_dict(data)
