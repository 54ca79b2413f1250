"""The export target interface: what every format (TFLite, Core ML, ...) provides.

`mvit2 export`, `keras_mvit2.export.validate`, `mvit2 bench`, the demo and the optimizer
do not branch on the format: they look the target up (`get_target("tflite")`, or
`target_for_path("model.mlpackage")`) and call its methods. A target is one sub-package of
`keras_mvit2.export` with one `ExportTarget` subclass, registered with `register_target`
when the sub-package is imported (see "Adding a target" in `docs/architecture.md`).
What the packages above export do with a target's files is theirs: `keras_mvit2.latency`
times them (`keras_mvit2.latency.host.bench_file`) and `keras_mvit2.optimizer` lists the
candidates it builds for a target (`keras_mvit2.optimizer.targets`).

The shared vocabulary, one name per idea for every target:

* `quantization`: the numeric format of the file (`formats` lists a target's values,
  `default_format` is used when none is given; the calibrated ones need
  `calibration_data`);
* `class_names`: the names of the output classes, in class-id order, written into the
  file's metadata and read back by `ExportTarget.class_names`;
* `num_ops`: compute ops of the graph, constants and the graph's inputs not counted (one
  definition for every report).
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

__all__ = [
    "ConvertArguments",
    "ExportTarget",
    "available_targets",
    "get_target",
    "register_target",
    "target_for_path",
]


#: Converter arguments that are not options: what a shared argument maps onto
#: (`to_tflite`'s `representative_data`).
_NOT_OPTIONS = frozenset({"representative_data"})


@dataclasses.dataclass(frozen=True)
class ConvertArguments:
    """The arguments of `ExportTarget.convert` that every target takes under the same names,
    as the caller gave them (each target checks them: `ExportTarget.check_format`, ...).

    Attributes:
        quantization: the numeric format (None: the target's default).
        class_names: one name per output class, for the file's metadata.
        calibration_data: images for the calibrated formats.
        metadata: extra JSON-serializable entries for the file's metadata.
        image_size: the input size for a dynamic-size model.
        road: the converter road (`keras_mvit2.export.roads`; None: the backend's).
    """

    quantization: str | None = None
    class_names: Sequence[str] | None = None
    calibration_data: Any = None
    metadata: Mapping[str, Any] | None = None
    image_size: int | tuple[int, int] | None = None
    road: str | None = None


#: The arguments every target's `convert` takes under the same names (`ConvertArguments`),
#: as an error message lists them (`road` is named where a target has more than one).
_SHARED_ARGUMENTS = frozenset(
    field.name for field in dataclasses.fields(ConvertArguments)) - {"road"}


class ExportTarget(abc.ABC):
    """One export format. Subclasses set the class attributes and implement the methods.

    Attributes:
        name: the registry name, also `mvit2 export --format`'s value (`"tflite"`).
        display_name: the name people know it by (`"TFLite"`), for reports.
        suffixes: file or folder suffixes of the target's files (`(".tflite",)`).
        formats: the values `quantization` takes, the default first.
        calibrated_formats: the formats that need `calibration_data` (images).
        runtime: the runtime apps load the file with, for reports (`"LiteRT"`).
    """

    name: ClassVar[str]
    display_name: ClassVar[str]
    suffixes: ClassVar[tuple[str, ...]]
    formats: ClassVar[tuple[str, ...]]
    calibrated_formats: ClassVar[tuple[str, ...]] = ()
    runtime: ClassVar[str]

    @property
    def default_format(self) -> str:
        return self.formats[0]

    def check_format(self, quantization: str | None) -> str:
        """`quantization`, or the default when None; a clear error for an unknown one."""
        if quantization is None:
            return self.default_format
        if quantization not in self.formats:
            raise ValueError(
                f"{self.name} exports take quantization in {list(self.formats)}. "
                f"Received: quantization={quantization!r}"
            )
        return quantization

    def check_options(self, options: Mapping[str, Any], converter: Any) -> None:
        """A TypeError naming the known options when `options` holds one `converter` (the
        target's conversion function) does not take."""
        known = [name for name, p in inspect.signature(converter).parameters.items()
                 if p.kind is p.KEYWORD_ONLY and name not in _SHARED_ARGUMENTS
                 and name not in _NOT_OPTIONS]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise TypeError(
                f"{self.name} exports take no option {unknown}; its own options are "
                f"{sorted(known)} (besides {sorted(_SHARED_ARGUMENTS)})."
            )

    def check_class_names(self, class_names: Any, model: Any) -> list[str] | None:
        """`class_names` as a list, one per output class of `model`, or a clear error
        (`keras_mvit2.export.class_names.check_class_names`, the same for every target)."""
        from keras_mvit2.export.class_names import check_class_names

        return check_class_names(class_names, model)

    def convert(self, model: Any, path: str | os.PathLike, *,
                quantization: str | None = None,
                class_names: Sequence[str] | None = None,
                calibration_data: Any = None,
                metadata: Mapping[str, Any] | None = None,
                image_size: int | tuple[int, int] | None = None,
                road: str | None = None,
                **options: Any) -> Any:
        """Converts a Keras model and writes it to `path` atomically; returns `inspect(path)`.

        The shared arguments (`ConvertArguments`) have the same names and meaning for every
        target; `road` picks the converter (`keras_mvit2.export.roads`; default the Keras
        backend's). `options` are the target's own settings (e.g. TFLite's `io_dtype`, Core
        ML's `weight_compression`); an unknown one is an error naming the known ones. Each
        target implements `_convert`.
        """
        shared = ConvertArguments(
            quantization=quantization, class_names=class_names,
            calibration_data=calibration_data, metadata=metadata, image_size=image_size,
            road=road)
        return self._convert(model, path, shared, dict(options))

    @abc.abstractmethod
    def _convert(self, model: Any, path: str | os.PathLike, shared: ConvertArguments,
                 options: dict[str, Any]) -> Any:
        """`convert` for this target: `shared` as given, `options` its own settings."""

    @abc.abstractmethod
    def inspect(self, path: str | os.PathLike) -> Any:
        """The structure of an exported file: a report with `to_dict()`, `size_bytes`,
        `op_histogram`, `num_ops` and `metadata`."""

    def can_run(self) -> bool:
        """Whether `run` works on this host (Core ML predictions need macOS)."""
        return True

    @abc.abstractmethod
    def run(self, path: str | os.PathLike, images: np.ndarray, *,
            num_threads: int = 1) -> np.ndarray:
        """The file's float outputs for float32 `images` `(N, H, W, 3)` in [0, 1]."""

    @abc.abstractmethod
    def metadata(self, path: str | os.PathLike) -> dict[str, Any]:
        """What keras_mvit2 wrote into the file: at least `quantization` and `class_names`
        (None where absent)."""

    def class_names(self, path: str | os.PathLike) -> list[str] | None:
        """The class names written into the file, or None."""
        names = self.metadata(path).get("class_names")
        return list(names) if names else None

    def host_note(self) -> str | None:
        """What a report should add where `run` cannot work on this host, else None."""
        return None

    def outputs_here(self, model: Any, path: str | os.PathLike,
                     images: np.ndarray) -> np.ndarray:
        """The file's float outputs for `images` `(N, H, W, 3)` in [0, 1], computed on this
        host: by `run` where the runtime works here; a target whose runtime does not may
        compute them another exact way (Core ML: Keras with the package's own weights)."""
        if not self.can_run():
            raise NotImplementedError(self.host_note() or
                                      f"{self.display_name} files cannot run here.")
        return self.run(path, images)

    def add_cli_arguments(self, group: Any) -> None:
        """Adds the target's own `mvit2 export` options to an argparse argument group
        (none by default)."""
        return None

    def cli_arguments(self, args: Any) -> dict[str, Any]:
        """`convert`'s keyword arguments (but `class_names`) from `mvit2 export`'s parsed
        arguments: `quantization` from ``--quantization`` and the target's own options."""
        return {"quantization": self.check_format(args.quantization)}

    @abc.abstractmethod
    def report_rows(self, report: Any) -> list[tuple[str, str]]:
        """(field, value) rows that describe `report` to a person (`mvit2 export` prints them)."""

    def __repr__(self) -> str:
        return f"<ExportTarget {self.name}: {', '.join(self.formats)}>"


#: The registered targets. The built-in ones register when their sub-packages are imported,
#: which `keras_mvit2.export` (this module's package) does before anything here runs.
_TARGETS: dict[str, ExportTarget] = {}


def register_target(target: ExportTarget) -> ExportTarget:
    """Adds `target` to the registry under `target.name` (a second one of that name is an error)."""
    if target.name in _TARGETS:
        raise ValueError(f"An export target named {target.name!r} is already registered.")
    _TARGETS[target.name] = target
    return target


def available_targets() -> list[str]:
    """Names of the registered export targets."""
    return sorted(_TARGETS)


def get_target(name: str) -> ExportTarget:
    """The target registered as `name` (`"tflite"`, `"coreml"`, ...)."""
    if name not in _TARGETS:
        raise ValueError(f"Unknown export target {name!r}. Available: {available_targets()}.")
    return _TARGETS[name]


def target_for_path(path: str | os.PathLike) -> ExportTarget:
    """The target whose files end like `path` (`.tflite`, `.mlpackage`, ...)."""
    text = os.fspath(path).rstrip("/" + os.sep)
    for target in _TARGETS.values():
        if text.endswith(target.suffixes):
            return target
    suffixes = sorted(s for t in _TARGETS.values() for s in t.suffixes)
    raise ValueError(
        f"Cannot tell the export target from {os.fspath(path)!r}: name it with one of "
        f"{suffixes} (or pass the target's name, one of {available_targets()})."
    )
