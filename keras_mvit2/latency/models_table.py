"""Model latency table (the paper's Table 2 / Fig. 2 axes): latency vs MACs vs parameters.

Every model is built with **random weights** (latency does not depend on the
values), converted to float32 and full-integer int8 `.tflite`, and all files are
timed *interleaved* on this machine (`keras_mvit2.latency.host.measure_interleaved`),
so that drift of a shared machine hits all of them alike. Parameters and MACs
come from the Keras model (`keras_mvit2.profiling.profile`).

int8 calibration uses random images (the issue allows it for latency only: the
int8 files benchmarked here are not accurate classifiers), with int8 input and
output, as the on-device full-integer deployments; ops that the converter left
in float are allowed (``allow_float_ops=True``) and listed in the record.

Default models: MobileViTv2-0.5/0.75/1.0 and MobileViT v1 XXS/XS/S at 256x256,
`keras.applications` MobileNetV2 (alpha 1.0) and EfficientNet-B0 at 224x224 (their
native sizes; the paper's Table 2 uses the same), 1000 classes.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from keras_mvit2.latency.attention_sweep import results_label, save_figure
from keras_mvit2.latency.host import (
    Log,
    _histogram_and_report,
    _quiet,
    make_interpreter,
    make_result,
    measure_interleaved,
    peak_memory_mb,
    tflite_model_entry,
)
from keras_mvit2.latency.schema import BenchResult, save_results
from keras_mvit2.utils.files import write_json, write_text

__all__ = [
    "DEFAULT_MODELS",
    "REFERENCE_MODELS",
    "ModelsTable",
    "build_model",
    "convert_for_latency",
    "int8_available",
    "load_models_table",
    "models_markdown",
    "plot_models",
    "primary_ms",
    "run_models_table",
    "write_models_table",
]

#: keras.applications references: name -> (builder attribute, native input size).
REFERENCE_MODELS = {
    "mobilenetv2": ("MobileNetV2", 224),
    "efficientnetb0": ("EfficientNetB0", 224),
}
DEFAULT_MODELS = (
    "mobilevitv2_050",
    "mobilevitv2_075",
    "mobilevitv2_100",
    "mobilevit_xxs",
    "mobilevit_xs",
    "mobilevit_s",
    "mobilenetv2",
    "efficientnetb0",
)
PRECISIONS = ("float32", "int8")


def _ensure_registered() -> None:
    """Imports the optional model families so that their names are registered."""
    import importlib

    for module in ("keras_mvit2.models.mobilevit.mobilevit_builders",
                   "keras_mvit2.models.vit.vit_builders"):
        try:
            importlib.import_module(module)
        except ImportError:
            pass


def build_model(name: str, input_size: int | None = None):
    """`(keras model, input size)` for a registered name or a `REFERENCE_MODELS` name.

    Random weights, 1000 classes; `input_size` defaults to the model's native size
    (256 for keras_mvit2 models, 224 for the keras.applications references).
    """
    import keras

    from keras_mvit2.models.registry import create_model, list_models

    _ensure_registered()
    if name in REFERENCE_MODELS:
        attr, native = REFERENCE_MODELS[name]
        size = input_size or native
        builder = getattr(keras.applications, attr)
        return builder(weights=None, input_shape=(size, size, 3), classes=1000), size
    if name in list_models():
        size = input_size or 256
        return create_model(name, input_shape=(size, size, 3)), size
    raise ValueError(
        f"Unknown model {name!r}: use a registered name ({', '.join(list_models())}) or one "
        f"of the keras.applications references {sorted(REFERENCE_MODELS)}."
    )


def int8_available() -> tuple[bool, str]:
    """Whether `to_tflite` can write full-integer int8 (and why not)."""
    from keras_mvit2.export.tflite import convert as tflite

    params = inspect.signature(tflite.to_tflite).parameters
    if "quantization" not in params or "representative_data" not in params:
        return False, ("keras_mvit2.export.to_tflite has no int8 quantization yet "
                       "(no quantization= / representative_data= arguments)")
    if "int8" not in getattr(tflite, "QUANTIZATIONS", ("int8",)):
        return False, "to_tflite does not offer quantization='int8'"
    return True, ""


def convert_for_latency(model, path: str, precision: str, size: int, seed: int = 0,
                        images: np.ndarray | None = None,
                        images_note: str | None = None) -> dict[str, Any]:
    """Writes `model` as a float32 or full-integer int8 (int8 I/O) `.tflite` for timing.

    int8 is calibrated on `images` (uint8 `(n, size, size, 3)`), or on 8 random images
    when none are given (enough for latency: the file is then not an accurate
    classifier); float ops the converter keeps are allowed and listed. Returns notes
    for the record (`float_ops`, `calibration`).
    """
    from keras_mvit2.export.tflite import convert as tflite

    if precision == "float32":
        tflite.to_tflite(model, path)
        return {}
    if images is None:
        rng = np.random.default_rng(seed)
        images = rng.integers(0, 256, (8, size, size, 3), dtype=np.uint8)
        images_note = "8 random images (latency only, not an accurate int8 model)"
    kwargs: dict[str, Any] = {"quantization": "int8", "representative_data": images}
    params = inspect.signature(tflite.to_tflite).parameters
    if "io_dtype" in params:
        kwargs["io_dtype"] = "int8"
    if "allow_float_ops" in params:
        kwargs["allow_float_ops"] = True
    if "num_calibration_samples" in params:
        kwargs["num_calibration_samples"] = len(images)
    report = tflite.to_tflite(model, path, **kwargs)
    return {"float_ops": getattr(report, "float_ops", None),
            "calibration": images_note or f"{len(images)} images"}


@dataclasses.dataclass
class ModelsTable:
    """Result of `run_models_table`: records plus what was skipped and why."""

    results: list[BenchResult]
    skipped: list[dict[str, str]]
    peer: str | None = None

    def find(self, name: str, precision: str) -> BenchResult | None:
        for r in self.results:
            if r.model["name"] == name and r.model.get("precision") == precision:
                return r
        return None

    def names(self) -> list[str]:
        seen: list[str] = []
        for r in self.results:
            if r.model["name"] not in seen:
                seen.append(r.model["name"])
        return seen


def run_models_table(
    models: Sequence[str] = DEFAULT_MODELS,
    *,
    precisions: Sequence[str] = PRECISIONS,
    input_size: int | None = None,
    threads: int = 1,
    runs: int = 40,
    warmup: int = 5,
    rounds: int = 10,
    measure_memory: bool = True,
    peers: Sequence[str] = (),
    models_dir: str | os.PathLike | None = None,
    seed: int = 0,
    log: Log = _quiet,
) -> ModelsTable:
    """Converts and times every (model, precision), interleaved; see the module docstring.

    Args:
        models: registered names and/or `REFERENCE_MODELS` names.
        precisions: subset of ``("float32", "int8")``.
        input_size: one square size for all (default: each model's native size).
        threads: interpreter threads.
        runs, warmup, rounds: timed invokes per file, untimed first, interleaving rounds.
        measure_memory: peak memory of each file (fresh subprocess each).
        peers: extra `.tflite` files timed in the same interleaved run (e.g. the
            shared kecam anchors), recorded under their file stem.
        models_dir: keep the converted files there (default: a temporary folder).
        seed: seed of the calibration images and inputs.
        log: progress messages.
    """
    from keras_mvit2.profiling import profile

    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown:
        raise ValueError(f"precisions must be among {PRECISIONS}. Received: {list(precisions)}")
    skipped: list[dict[str, str]] = []
    precisions = list(precisions)
    if "int8" in precisions:
        ok, why = int8_available()
        if not ok:
            precisions.remove("int8")
            skipped.append({"model": "*", "precision": "int8", "reason": why})
            log(f"int8 skipped: {why}")
    files: dict[tuple[str, str], str] = {}
    entries: dict[tuple[str, str], dict[str, Any]] = {}
    notes: dict[tuple[str, str], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="keras_mvit2_models_") as tmp:
        folder = os.fspath(models_dir) if models_dir is not None else tmp
        os.makedirs(folder, exist_ok=True)
        for name in models:
            try:
                model, size = build_model(name, input_size)
            except ValueError as err:
                skipped.append({"model": name, "precision": "*", "reason": str(err)})
                log(f"{name}: skipped ({err})")
                continue
            info = profile(model)
            for precision in precisions:
                path = os.path.join(folder, f"{name}_{size}_{precision}.tflite")
                log(f"{name} @{size}: converting to {precision} ...")
                try:
                    note = convert_for_latency(model, path, precision, size, seed)
                except (RuntimeError, ValueError) as err:
                    reason = str(err).splitlines()[0][:300]
                    skipped.append({"model": name, "precision": precision, "reason": reason})
                    log(f"{name} {precision}: skipped ({reason})")
                    continue
                key = (name, precision)
                files[key] = path
                entries[key] = tflite_model_entry(
                    path, name=name, params=info.params, macs=info.macs,
                    source=f"{name} @{size}, random weights")
                entries[key]["precision"] = precision
                notes[key] = {**note, "input_size": size, "weights": "random"}
            del model
        for peer in peers:
            stem = os.path.splitext(os.path.basename(peer))[0]
            entry = tflite_model_entry(peer, name=stem, source="peer file")
            key = (stem, entry["precision"])
            files[key], entries[key] = os.fspath(peer), entry
            notes[key] = {"peer": True}
        if not files:
            raise ValueError("No model could be converted; see the skipped list: "
                             f"{skipped}")
        interpreters = {key: make_interpreter(path, threads=threads)
                        for key, path in files.items()}
        log(f"timing {len(interpreters)} files interleaved ({runs} runs each, "
            f"{rounds} rounds) ...")
        samples = measure_interleaved(interpreters, runs=runs, warmup=warmup, rounds=rounds,
                                      seed=seed)
        del interpreters
        results = []
        for key, path in files.items():
            histogram, extra = _histogram_and_report(path)
            extra.update(notes[key])
            memory = None
            if measure_memory:
                memory, mem_info = peak_memory_mb(path, threads=threads)
                extra["peak_memory_method"] = mem_info.get("method") or mem_info.get("error")
            result = make_result(entries[key], samples[key], warmup=warmup, threads=threads,
                                 xnnpack=True, peak_memory=memory, op_histogram=histogram,
                                 extra=extra)
            if models_dir is None:
                result.model["path"] = None
            results.append(result)
            log(f"  {key[0]:>28s} {key[1]:>8s}: median {result.latency_ms.median:8.2f} ms")
    peer = next((os.path.splitext(os.path.basename(p))[0] for p in peers), None)
    return ModelsTable(results=results, skipped=skipped, peer=peer)


# --------------------------------------------------------------------------------------
# Report


def _cpu(result: BenchResult | None) -> float | None:
    if result is None:
        return None
    return (result.extra.get("cpu_ms") or {}).get("median")


def primary_ms(result: BenchResult) -> float:
    """The median used for ratios and plots: CPU time when recorded, else wall clock."""
    cpu = _cpu(result)
    return cpu if cpu is not None else result.latency_ms.median


def _ms(result: BenchResult | None) -> str:
    if result is None:
        return "-"
    cpu = _cpu(result)
    wall = f"{result.latency_ms.median:.2f}"
    return wall if cpu is None else f"{cpu:.2f} / {wall}"


def models_markdown(table: ModelsTable) -> str:
    """Markdown: one row per model, float32 and int8 medians (ms), ratios, size, memory.

    Latency cells are ``CPU time / wall clock`` medians (CPU time of the invoking
    thread, recorded for 1 thread); ratios use the CPU time when there is one.
    """
    lines = [
        "| model | input | params (M) | MACs (G) | fp32 median ms (cpu / wall) "
        "| int8 median ms (cpu / wall) | int8 / fp32 | fp32 size (MB) | int8 size (MB) "
        "| fp32 peak mem (MB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in table.names():
        fp = table.find(name, "float32")
        q = table.find(name, "int8")
        any_r = fp or q or next(r for r in table.results if r.model["name"] == name)
        m = any_r.model
        shape = m.get("input_shape") or []
        size = f"{shape[1]}x{shape[2]}" if len(shape) == 4 else "-"
        params = f"{m['params'] / 1e6:.2f}" if m.get("params") else "-"
        macs = f"{m['macs'] / 1e9:.3f}" if m.get("macs") else "-"
        ratio = f"{primary_ms(q) / primary_ms(fp):.2f}" if fp and q else "-"
        fp_size = "-" if fp is None else f"{fp.model['size_bytes'] / 1e6:.2f}"
        q_size = "-" if q is None else f"{q.model['size_bytes'] / 1e6:.2f}"
        memory = "-" if fp is None or fp.peak_memory_mb is None else f"{fp.peak_memory_mb:.1f}"
        lines.append(
            f"| {name} | {size} | {params} | {macs} | {_ms(fp)} | {_ms(q)} | {ratio} | "
            f"{fp_size} | {q_size} | {memory} |"
        )
    if table.peer:
        ours = "mobilevitv2_050"
        lines.append("")
        for precision in PRECISIONS:
            mine = table.find(ours, precision)
            peers = [r for r in table.results if r.extra.get("peer")
                     and r.model.get("precision") == precision]
            for peer in peers:
                if mine:
                    lines.append(
                        f"- {ours} {precision} / peer {peer.model['name']}: "
                        f"{primary_ms(mine) / primary_ms(peer):.2f}x "
                        f"({primary_ms(mine):.2f} vs {primary_ms(peer):.2f} ms, "
                        "same interleaved run)")
    if table.skipped:
        lines.append("")
        for s in table.skipped:
            lines.append(f"- skipped {s['model']} {s['precision']}: {s['reason']}")
    return "\n".join(lines) + "\n"


def load_models_table(json_path: str | os.PathLike) -> ModelsTable:
    """A `ModelsTable` back from the files `write_models_table` wrote (to re-render)."""
    from keras_mvit2.latency.schema import load_results

    results = load_results(json_path)
    skipped_path = os.fspath(json_path)[: -len(".json")] + "_skipped.json"
    skipped = []
    if os.path.isfile(skipped_path):
        with open(skipped_path) as f:
            skipped = json.load(f)
    peer = next((r.model["name"] for r in results if r.extra.get("peer")), None)
    return ModelsTable(results=results, skipped=skipped, peer=peer)


def plot_models(table: ModelsTable, path: str | os.PathLike) -> None:
    """PNG: latency vs MACs and latency vs parameters, float32 and int8 markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    markers = {"float32": "o", "int8": "s"}
    for ax, key, label in ((axes[0], "macs", "MACs (G)"), (axes[1], "params", "parameters (M)")):
        for precision in PRECISIONS:
            xs, ys, names = [], [], []
            for r in table.results:
                value = r.model.get(key)
                if r.model.get("precision") != precision or not value or r.extra.get("peer"):
                    continue
                xs.append(value / 1e9 if key == "macs" else value / 1e6)
                ys.append(primary_ms(r))
                names.append(r.model["name"])
            if not xs:
                continue
            ax.scatter(xs, ys, marker=markers[precision], s=50, label=precision)
            for x, y, n in zip(xs, ys, names, strict=True):
                ax.annotate(n, (x, y), fontsize=7, xytext=(4, 3), textcoords="offset points")
        ax.set_xlabel(label)
        ax.set_ylabel("latency (ms, median, batch 1; thread CPU time where recorded)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    axes[0].set_title("latency vs MACs")
    axes[1].set_title("latency vs parameters")
    fig.suptitle(f"{results_label(table.results)}; random weights", fontsize=8)
    save_figure(fig, path)


def write_models_table(table: ModelsTable, out_dir: str | os.PathLike,
                       stem: str = "model_latency") -> dict[str, str]:
    """Writes ``<stem>.json`` (BenchResult list), ``<stem>.md``, ``<stem>.png``, skipped list."""
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    paths = {
        "json": os.path.join(out_dir, f"{stem}.json"),
        "markdown": os.path.join(out_dir, f"{stem}.md"),
        "png": os.path.join(out_dir, f"{stem}.png"),
        "skipped": os.path.join(out_dir, f"{stem}_skipped.json"),
    }
    save_results(table.results, paths["json"])
    write_json(paths["skipped"], table.skipped)
    text = (f"Machine: {results_label(table.results)}. Random weights; int8 calibrated on "
            "random images (latency only).\n\n" + models_markdown(table)
            + f"\n![latency vs MACs and parameters]({os.path.basename(paths['png'])})\n")
    write_text(paths["markdown"], text)
    plot_models(table, paths["png"])
    return paths
