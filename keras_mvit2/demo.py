"""The whole job end to end on the built-in example: `mvit2 demo` / `run_demo`.

`run_demo(output_dir)` trains MobileViTV2-0.5 briefly on Fashion-MNIST (Debian's
`dataset-fashion-mnist`, nothing is downloaded) with the packaged `fashion_mnist` recipe
shortened to one short epoch on a subset at a small resolution, then runs every later
step of the pipeline with the library's own functions:

1. train     `keras_mvit2.training.train` -> `run/model.keras` (float32, softmax)
2. evaluate  top-1 / top-5 on the first test images (`training.evaluate`, inside `train`)
3. TFLite    full-integer int8 (`export.to_tflite`), calibrated on training images
4. Core ML   fp16 ML Program (`export.to_coreml`; predictions need macOS, so off macOS
             only its structure is reported); skipped when coremltools is not installed
5. validate  exported vs Keras on the test images (`export.validate`) -> `validation.json`
6. bench     batch-1 latency of the int8 file in LiteRT (`bench.bench_tflite`) -> `bench.json`
7. visualize context-score maps of a test image (`visualize`) -> `context_scores.png`

Everything it measured goes into `summary.json` (written atomically) and the returned
`DemoResult`; `print_summary` prints the one-table summary.

```python
from keras_mvit2.demo import print_summary, run_demo

result = run_demo("mvit2-demo")          # ~3 minutes on 2 CPU cores
print_summary(result)
print(result.accuracy, result.int8_agreement, result.latency_ms)
```
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keras_mvit2.training import TrainConfig

__all__ = ["FULL", "SMALL", "DemoResult", "DemoSettings", "DemoStep", "print_steps",
           "print_summary", "run_demo", "train_config"]

Log = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class DemoSettings:
    """How big the demo runs.

    Attributes:
        image_size: training and export resolution (square; Fashion-MNIST's 28x28 images
            are resized to it and repeated to RGB).
        train_steps: optimizer steps of the one epoch (the first `train_steps * batch_size`
            training images).
        batch_size: training batch.
        learning_rate: peak AdamW learning rate (warm-up over the first 10 % of the steps,
            then cosine).
        test_images: the first N images of the test split, for evaluation and validation.
        calibration_images: training images that calibrate the int8 activation ranges.
        bench_runs, bench_warmup: timed and untimed invokes of the latency benchmark.
    """

    image_size: int = 64
    train_steps: int = 160
    batch_size: int = 64
    learning_rate: float = 0.003
    test_images: int = 1000
    calibration_images: int = 200
    bench_runs: int = 100
    bench_warmup: int = 10

    def __post_init__(self) -> None:
        for name in ("image_size", "train_steps", "batch_size", "test_images",
                     "calibration_images", "bench_runs", "bench_warmup"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"DemoSettings.{name} must be a positive int. "
                                 f"Received: {name}={value!r}")
        if self.image_size < 32:
            raise ValueError("DemoSettings.image_size must be >= 32 (MobileViTv2 downsamples "
                             f"32x). Received: image_size={self.image_size}")
        if not self.learning_rate > 0:
            raise ValueError("DemoSettings.learning_rate must be > 0. "
                             f"Received: learning_rate={self.learning_rate!r}")


#: The default run: 64x64, 160 steps of 64 images (~3 minutes on 2 CPU cores).
FULL = DemoSettings()
#: The quick run of `--small` (tests, CI): 32x32, 128 steps, 500 test images.
SMALL = DemoSettings(image_size=32, train_steps=128, test_images=500, calibration_images=100,
                     bench_runs=20, bench_warmup=3)


@dataclasses.dataclass
class DemoStep:
    """One row of the summary: what the step gave and where it wrote it."""

    name: str
    figure: str
    artefact: str | None
    seconds: float


@dataclasses.dataclass
class DemoResult:
    """What `run_demo` measured and wrote.

    Accuracies and agreements are fractions in [0, 1], measured on the first
    `num_test_images` images of the Fashion-MNIST test split.

    Attributes:
        output_dir: the demo folder (absolute).
        settings: the `DemoSettings` used.
        class_names: the 10 Fashion-MNIST classes, in label order.
        train_images: training images seen (one epoch).
        train_accuracy: running training accuracy over the epoch.
        train_images_per_second: training throughput (tracing excluded).
        accuracy, top5: the Keras model's top-1 / top-5 accuracy.
        num_test_images: test images evaluated.
        int8_accuracy: top-1 accuracy of the int8 TFLite model (LiteRT).
        int8_agreement: fraction of test images where the int8 model picks the Keras
            model's class.
        int8_size_bytes: size of the `.tflite` file.
        int8_float_ops: ops left in float besides the I/O quantize / dequantize (`{}`).
        coreml_size_bytes, coreml_ops: size and compute-op count (constants not counted, as
            for TFLite) of the `.mlpackage` (None when coremltools is not installed).
        latency_ms: median batch-1 latency of the int8 file on this host.
        latency_p90_ms: its 90th percentile.
        peak_memory_mb: peak memory of a fresh LiteRT process running it (None if not
            measurable).
        bench_threads: interpreter threads of the benchmark.
        num_context_maps: context-score maps drawn (one per attention layer).
        paths: artefact name -> path (`model`, `metrics`, `tflite`, `coreml`, `validation`,
            `bench`, `context_scores`, `summary`).
        steps: the summary rows, in order.
        seconds: wall time of the whole demo.
    """

    output_dir: str
    settings: DemoSettings
    class_names: list[str]
    train_images: int
    train_accuracy: float
    train_images_per_second: float
    accuracy: float
    top5: float
    num_test_images: int
    int8_accuracy: float
    int8_agreement: float
    int8_size_bytes: int
    int8_float_ops: dict[str, int]
    coreml_size_bytes: int | None
    coreml_ops: int | None
    latency_ms: float
    latency_p90_ms: float | None
    peak_memory_mb: float | None
    bench_threads: int
    num_context_maps: int
    paths: dict[str, str | None]
    steps: list[DemoStep]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict (what `summary.json` holds)."""
        return dataclasses.asdict(self)


def _quiet(_: str) -> None:
    pass


def _pct(x: float) -> str:
    return f"{100.0 * x:.1f} %"


def _size(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} KB"


def coreml_available() -> bool:
    """Whether the Core ML step can run (coremltools, the `coreml` extra, is installed)."""
    return importlib.util.find_spec("coremltools") is not None


def train_config(
    output_dir: str | os.PathLike, settings: DemoSettings = FULL, *, verbose: int = 1
) -> TrainConfig:
    """The demo's training config: the packaged Fashion-MNIST recipe cut to one short epoch.

    One epoch of `settings.train_steps` steps on the first training images at
    `settings.image_size`, with a short warm-up (10 % of the steps), a higher peak learning
    rate, no random crop and no EMA (it would lag behind after so few steps); the first
    `settings.test_images` test images are evaluated once, at the end. The run folder is
    `output_dir` (started over, not resumed).
    """
    from keras_mvit2 import training

    s = settings
    return training.load_config("fashion_mnist", overrides=[
        f"model.image_size={s.image_size}",
        f"data.batch_size={s.batch_size}",
        f"data.train_limit={s.train_steps * s.batch_size}",
        f"data.validation_limit={s.test_images}",
        f"optimizer.lr={s.learning_rate}",
        f"optimizer.reference_batch_size={s.batch_size}",
        "schedule.warmup_epochs=0.1",
        "augment.random_resized_crop=false",
        "ema.enabled=false",
        "training.epochs=1",
        "training.validate_every=0",
        f"output.dir={json.dumps(os.fspath(output_dir))}",
        "output.resume=false",
        "output.tensorboard=false",
        f"output.verbose={verbose}",
    ])


def run_demo(
    output_dir: str | os.PathLike = "mvit2-demo",
    *,
    small: bool = False,
    settings: DemoSettings | None = None,
    threads: int = 1,
    verbose: int = 1,
    log: Log | None = None,
) -> DemoResult:
    """Trains, evaluates, exports (int8 TFLite, Core ML), validates, benchmarks and
    visualizes MobileViTV2-0.5 on Fashion-MNIST, writing every artefact to `output_dir`.

    Args:
        output_dir: the demo folder (created; a previous demo there is replaced, the
            training run starts over).
        small: the quick settings (`SMALL`: 32x32, fewer steps and images) instead of
            `FULL`.
        settings: explicit `DemoSettings` (overrides `small`).
        threads: interpreter threads of the latency benchmark.
        verbose: Keras progress output of the training (0 silent, 1 bar, 2 one line).
        log: called with one progress line per step (default: silent).

    Returns:
        A `DemoResult` (also written to `output_dir/summary.json`).

    Raises:
        FileNotFoundError: Fashion-MNIST is not installed (the message says how).
        ValueError: invalid settings.
    """
    import keras

    from keras_mvit2 import training, visualize
    from keras_mvit2.export import get_target, load_labelled_images, save_reports, validate
    from keras_mvit2.export.validate import reference_outputs
    from keras_mvit2.latency.host import bench_tflite
    from keras_mvit2.latency.schema import save_results
    from keras_mvit2.utils.files import write_json

    if settings is not None and not isinstance(settings, DemoSettings):
        raise ValueError(f"settings must be a DemoSettings. Received: {settings!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int. Received: threads={threads!r}")
    s = settings or (SMALL if small else FULL)
    log = log or _quiet
    start = time.monotonic()
    out = os.path.abspath(os.fspath(output_dir))
    os.makedirs(out, exist_ok=True)
    paths: dict[str, str | None] = {
        "model": None, "metrics": None,
        "tflite": os.path.join(out, "model_int8.tflite"),
        "coreml": os.path.join(out, "model.mlpackage") if coreml_available() else None,
        "validation": os.path.join(out, "validation.json"),
        "bench": os.path.join(out, "bench.json"),
        "context_scores": os.path.join(out, "context_scores.png"),
        "summary": os.path.join(out, "summary.json"),
    }
    steps: list[DemoStep] = []
    total = 7

    def step(index: int, name: str) -> float:
        log(f"[{index}/{total}] {name} ...")
        return time.monotonic()

    # 1-2. train, evaluate ------------------------------------------------------------
    t = step(1, "training MobileViTV2-0.5 on Fashion-MNIST")
    train = training.train(train_config(os.path.join(out, "run"), s, verbose=verbose))
    paths["model"] = train.model_path
    paths["metrics"] = os.path.join(train.output_dir, "metrics.json")
    class_names = list(train.metrics["raw"].class_names)
    last = train.history[-1]
    train_images = s.train_steps * s.batch_size
    steps.append(DemoStep(
        "train",
        f"{train_images:,} images x 1 epoch at {s.image_size}x{s.image_size}, "
        f"{train.images_per_second:.0f} images/s",
        train.model_path, time.monotonic() - t))
    metrics = train.metrics["raw"]
    steps.append(DemoStep(
        "evaluate",
        f"top-1 {_pct(metrics.top1)} (chance {100 / len(class_names):.0f} %), top-5 "
        f"{_pct(metrics.top5)}, {metrics.num_examples:,} test images",
        paths["metrics"], 0.0))
    model = keras.saving.load_model(train.model_path, compile=False)

    # 3. int8 TFLite ------------------------------------------------------------------
    t = step(3, "exporting full-integer int8 TFLite")
    tflite_target = get_target("tflite")
    tflite = tflite_target.convert(
        model, paths["tflite"], quantization="int8", calibration_data="fashion_mnist",
        num_calibration_samples=s.calibration_images, class_names=class_names,
    )
    left = ", ".join(f"{k} x{v}" for k, v in tflite.float_ops.items()) or "none"
    steps.append(DemoStep(
        "export TFLite int8",
        f"{_size(tflite.size_bytes)}, {tflite.num_ops} ops, float ops: {left}",
        tflite.path, time.monotonic() - t))

    # 4. Core ML ----------------------------------------------------------------------
    t = step(4, "exporting Core ML")
    coreml = None
    if paths["coreml"] is not None:
        coreml = get_target("coreml").convert(model, paths["coreml"], class_names=class_names)
        steps.append(DemoStep(
            "export Core ML",
            f"{_size(coreml.size_bytes)} fp16, {coreml.num_ops} ops, "
            "iOS 16+",
            coreml.path, time.monotonic() - t))
    else:
        steps.append(DemoStep(
            "export Core ML", "skipped: pip install 'keras_mvit2[coreml]'", None, 0.0))

    # 5. validate ---------------------------------------------------------------------
    t = step(5, "validating the exports against Keras")
    test = load_labelled_images("fashion_mnist:test", image_size=(s.image_size, s.image_size),
                                limit=s.test_images)
    reference = reference_outputs(model, test.images)
    reports = [validate(tflite.path, model, test.images, test.labels,
                        class_names=class_names, reference_outputs=reference)]
    if coreml is not None:
        reports.append(validate(coreml.path, model, test.images, test.labels,
                                class_names=class_names, reference_outputs=reference))
    save_reports(reports, paths["validation"])
    int8 = reports[0]
    figure = (f"int8: top-1 {_pct(int8.accuracy)} (Keras {_pct(int8.reference_accuracy)}), "
              f"agrees with Keras on {_pct(int8.top1_agreement)}")
    if coreml is not None and not reports[1].numeric:
        figure += "; Core ML: structure only (needs macOS)"
    elif coreml is not None:  # pragma: no cover - macOS
        figure += f"; Core ML agrees on {_pct(reports[1].top1_agreement)}"
    steps.append(DemoStep("validate", figure, paths["validation"], time.monotonic() - t))

    # 6. benchmark --------------------------------------------------------------------
    t = step(6, "benchmarking the int8 TFLite file on this host")
    bench = bench_tflite(tflite.path, threads=threads, runs=s.bench_runs,
                         warmup=s.bench_warmup)
    save_results([bench], paths["bench"])
    latency = bench.latency_ms
    memory = "" if bench.peak_memory_mb is None else f", {bench.peak_memory_mb:.1f} MB peak"
    steps.append(DemoStep(
        "benchmark",
        f"int8 {latency.median:.2f} ms median (p90 {latency.p90:.2f}), batch 1, "
        f"{threads} thread{'s' if threads > 1 else ''}, XNNPACK{memory}",
        paths["bench"], time.monotonic() - t))

    # 7. context scores ---------------------------------------------------------------
    t = step(7, "drawing context-score maps")
    image = test.images[0]
    maps = visualize.context_scores(model, image)
    visualize.plot_context_scores(image, maps, paths["context_scores"])
    steps.append(DemoStep(
        "visualize",
        f"{len(maps)} maps (one per attention layer), test image 0: "
        f"{class_names[int(test.labels[0])]}",
        paths["context_scores"], time.monotonic() - t))

    result = DemoResult(
        output_dir=out,
        settings=s,
        class_names=class_names,
        train_images=train_images,
        train_accuracy=float(last["accuracy"]),
        train_images_per_second=float(train.images_per_second),
        accuracy=metrics.top1,
        top5=metrics.top5,
        num_test_images=metrics.num_examples,
        int8_accuracy=float(int8.accuracy),
        int8_agreement=float(int8.top1_agreement),
        int8_size_bytes=tflite.size_bytes,
        int8_float_ops=dict(tflite.float_ops),
        coreml_size_bytes=None if coreml is None else coreml.size_bytes,
        coreml_ops=None if coreml is None else coreml.num_ops,
        latency_ms=float(latency.median),
        latency_p90_ms=None if latency.p90 is None else float(latency.p90),
        peak_memory_mb=bench.peak_memory_mb,
        bench_threads=threads,
        num_context_maps=len(maps),
        paths=paths,
        steps=steps,
        seconds=time.monotonic() - start,
    )
    write_json(paths["summary"], result.to_dict())
    return result


def print_summary(result: DemoResult, console: Any = None) -> None:
    """Prints the one-table summary (rich): each step's key figure and its artefact."""
    print_steps(f"mvit2 demo: MobileViTV2-0.5 on Fashion-MNIST, {result.seconds:.0f} s",
                result.steps, result.output_dir, "summary.json: all figures", console)


def print_steps(title: str, steps: list[DemoStep], output_dir: str, where_all: str,
                console: Any = None) -> None:
    """The summary table of a pipeline (rich): step, result, file (relative to
    `output_dir`), time; the caption names `output_dir` and `where_all`."""
    from rich.markup import escape
    from rich.table import Table

    from keras_mvit2.utils.console import output_console

    table = Table(title=title,
                  caption=f"files in {escape(_display_path(output_dir))}/ ({where_all})")
    table.add_column("step")
    table.add_column("result")
    table.add_column("file")
    table.add_column("time", justify="right")
    for row in steps:
        where = "-" if row.artefact is None else os.path.relpath(row.artefact, output_dir)
        table.add_row(row.name, escape(row.figure), escape(where),
                      f"{row.seconds:.0f} s" if row.seconds else "")
    console = console or output_console()  # off a terminal: the table at full width
    console.print(table)


def _display_path(path: str) -> str:
    """`path` relative to the working directory when it is below it, else absolute."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative
