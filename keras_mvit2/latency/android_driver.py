"""The Android benchmark run: `run_android_benchmarks` pushes ``benchmark_model`` and the
models to the phone, runs every (model, delegate, threads) configuration ``repeats``
times in interleaved order, pulls and parses each log and returns `BenchResult` records.
"""

from __future__ import annotations

import posixpath
import re
import shlex
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keras_mvit2.latency.adb import (
    BENCHMARK_MODEL_HELP,
    Adb,
    AndroidBenchError,
    check_binary_for_device,
    device_info,
    parse_getprop,
)
from keras_mvit2.latency.android_log import BenchmarkModelOutput, parse_benchmark_output
from keras_mvit2.latency.android_record import _ms, to_bench_result
from keras_mvit2.latency.schema import BenchResult
from keras_mvit2.utils.files import sha256_file

#: Runtime configurations: name -> benchmark_model flags, applied in this order (a
#: GPU/NNAPI run gives the ops those delegates reject to XNNPACK, as an app would).
DELEGATES: dict[str, tuple[str, ...]] = {
    "none": ("--use_xnnpack=false",),
    "xnnpack": ("--use_xnnpack=true",),
    "gpu": ("--use_gpu=true", "--use_xnnpack=true"),
    "nnapi": ("--use_nnapi=true", "--use_xnnpack=true"),
}

DEFAULT_REMOTE_DIR = "/data/local/tmp/keras_mvit2_bench"
_EXIT_MARKER = "keras_mvit2_exit="
_RUNTIME_NAME = "tflite benchmark_model"


class PartialRunError(AndroidBenchError):
    """Some configurations failed on the phone; the others were measured.

    Attributes:
        results: the records of the configurations that ran.
        failures: one message per failed configuration.
    """

    def __init__(self, results: list[BenchResult], failures: list[str]):
        super().__init__(
            f"{len(failures)} configuration(s) failed on the phone:\n  " + "\n  ".join(failures)
        )
        self.results = results
        self.failures = failures


@dataclass
class AndroidBenchConfig:
    """What to run: every model x delegate x threads, `repeats` rounds, interleaved."""

    models: list[Path]
    benchmark_model: Path
    delegates: list[str] = field(default_factory=lambda: ["xnnpack"])
    threads: list[int] = field(default_factory=lambda: [1])
    runs: int = 50
    warmup: int = 5
    repeats: int = 1
    peak_memory: bool = True
    op_profiling: bool = False
    taskset: str | None = None
    extra_flags: list[str] = field(default_factory=list)
    serial: str | None = None
    adb: str = "adb"
    remote_dir: str = DEFAULT_REMOTE_DIR
    keep_remote: bool = False
    raw_dir: Path | None = None
    tool_version: str | None = None
    timeout_s: float = 900.0

    def validate(self) -> None:
        if not self.models:
            raise ValueError("Pass at least one .tflite model.")
        for model in self.models:
            if Path(model).suffix != ".tflite":
                raise ValueError(
                    f"benchmark_model runs .tflite files. Received: {model} (export one "
                    "with `mvit2 export`; Core ML packages run with the iPhone harness)."
                )
            if not Path(model).is_file():
                raise FileNotFoundError(f"Model not found: {model}")
        if not Path(self.benchmark_model).is_file():
            raise FileNotFoundError(
                f"benchmark_model binary not found: {self.benchmark_model}\n"
                f"{BENCHMARK_MODEL_HELP}"
            )
        unknown = [d for d in self.delegates if d not in DELEGATES]
        if unknown or not self.delegates:
            raise ValueError(
                f"delegates must be among {sorted(DELEGATES)}. Received: {self.delegates}"
            )
        if not self.threads or any(t < 1 for t in self.threads):
            raise ValueError(f"threads must be >= 1. Received: {self.threads}")
        if self.runs < 1 or self.warmup < 0 or self.repeats < 1:
            raise ValueError(
                "runs and repeats must be >= 1 and warmup >= 0. Received: "
                f"runs={self.runs}, warmup={self.warmup}, repeats={self.repeats}"
            )
        if self.taskset is not None and not re.fullmatch(r"[0-9a-fA-F]+", self.taskset):
            raise ValueError(
                f"taskset must be a hexadecimal CPU mask such as f0. Received: {self.taskset!r}"
            )
        if not self.remote_dir.startswith("/data/local/tmp/"):
            raise ValueError(
                "remote_dir must be a folder under /data/local/tmp/ (it is removed after the "
                f"run). Received: {self.remote_dir!r}"
            )


def benchmark_flags(graph: str, *, delegate: str, threads: int, runs: int, warmup: int,
                    peak_memory: bool = True, op_profiling: bool = False,
                    extra_flags: Sequence[str] = ()) -> list[str]:
    """The benchmark_model flags of one run: exactly `runs` timed runs after `warmup`
    warm-up runs (``--min_secs=0``/``--warmup_min_secs=0`` turn off the tool's minimum
    durations), batch 1 as exported."""
    flags = [
        f"--graph={graph}",
        f"--num_threads={threads}",
        f"--warmup_runs={warmup}",
        "--warmup_min_secs=0",
        f"--num_runs={runs}",
        "--min_secs=0",
        *DELEGATES[delegate],
    ]
    if peak_memory:
        flags.append("--report_peak_memory_footprint=true")
    if op_profiling:
        flags.append("--enable_op_profiling=true")
    return flags + list(extra_flags)


def _job_flags(config: AndroidBenchConfig, job: _Job, remote_model: str) -> list[str]:
    return benchmark_flags(
        remote_model, delegate=job.delegate, threads=job.threads, runs=config.runs,
        warmup=config.warmup, peak_memory=config.peak_memory,
        op_profiling=config.op_profiling, extra_flags=config.extra_flags,
    )


class _RunError(Exception):
    """One configuration failed on the phone (collected, the others go on)."""


@dataclass
class _Job:
    model_index: int
    delegate: str
    threads: int


def _model_info(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """The record's ``model`` entry as the host harness writes it (same name, precision
    and MACs, so `mvit2 bench-report` puts phone and host results in one row) and the
    file's op histogram."""
    from keras_mvit2.export.tflite.inspect import inspect_tflite
    from keras_mvit2.latency.host import tflite_model_entry

    return tflite_model_entry(path), dict(inspect_tflite(path).op_histogram)


def _pick_median_run(outputs: list[BenchmarkModelOutput]) -> tuple[int, dict[str, Any]]:
    means = [o.inference.avg for o in outputs]
    order = sorted(range(len(means)), key=lambda i: means[i])
    chosen = order[(len(order) - 1) // 2]
    return chosen, {
        "count": len(outputs),
        "chosen": chosen,
        "means_ms": [_ms(m) for m in means],
        "medians_ms": [_ms(o.inference.median) for o in outputs],
        "rule": "the repeat whose mean is the (lower) median of the repeats' means",
    }


def run_android_benchmarks(
    config: AndroidBenchConfig, *, log: Callable[[str], None] = print
) -> list[BenchResult]:
    """Runs every configuration on the phone and returns one `BenchResult` per
    (model, delegate, threads), in the order of `config.models`."""
    config.validate()
    models = [Path(m) for m in config.models]
    adb = Adb(config.adb, config.serial, timeout=config.timeout_s)
    device = _connect(adb, config, log)
    infos = [_model_info(m) for m in models]
    binary_sha = sha256_file(Path(config.benchmark_model))

    remote = _Remote.of(config.remote_dir, models)
    jobs = [_Job(i, d, t) for i in range(len(models)) for d in config.delegates
            for t in config.threads]
    outputs: dict[int, list[BenchmarkModelOutput]] = {k: [] for k in range(len(jobs))}
    failures: dict[int, str] = {}
    local_tmp = Path(tempfile.mkdtemp(prefix="keras_mvit2_android_"))
    try:
        _push(adb, config, models, remote)
        for round_index in range(config.repeats):
            _run_round(adb, config, models, jobs, round_index, remote, local_tmp,
                       outputs, failures, log)
    finally:
        if not config.keep_remote:
            adb.shell(f"rm -rf {shlex.quote(remote.folder)}", check=False)
        shutil.rmtree(local_tmp, ignore_errors=True)

    results = [
        _record(config, job, outputs[k], infos[job.model_index], device, binary_sha,
                remote.models[job.model_index])
        for k, job in enumerate(jobs) if k not in failures
    ]
    if failures:
        raise PartialRunError(results, [failures[k] for k in sorted(failures)])
    return results


@dataclass
class _Remote:
    """The work folder on the phone and where the binary and each model go in it."""

    folder: str
    binary: str
    models: list[str]

    @classmethod
    def of(cls, remote_dir: str, models: list[Path]) -> _Remote:
        folder = remote_dir.rstrip("/")
        return cls(folder, posixpath.join(folder, "benchmark_model"),
                   [posixpath.join(folder, f"m{i}_{m.name}") for i, m in enumerate(models)])


def _connect(adb: Adb, config: AndroidBenchConfig, log: Callable[[str], None]) -> dict[str, Any]:
    """Selects the phone, checks the binary against its ABI; the record's ``device``."""
    serial = adb.select_device()
    props = parse_getprop(adb.shell("getprop"))
    check_binary_for_device(Path(config.benchmark_model), props)
    device = device_info(props)
    log(f"Device {serial}: {device['name']}, {device['os']}, {device['cpu']}, "
        f"{device['machine']}")
    return device


def _push(adb: Adb, config: AndroidBenchConfig, models: list[Path], remote: _Remote) -> None:
    """Creates the work folder and pushes the binary (executable) and the models."""
    adb.shell(f"mkdir -p {shlex.quote(remote.folder)}")
    adb.push(config.benchmark_model, remote.binary)
    adb.shell(f"chmod +x {shlex.quote(remote.binary)}")
    for model, remote_model in zip(models, remote.models, strict=True):
        adb.push(model, remote_model)


def _run_round(adb: Adb, config: AndroidBenchConfig, models: list[Path], jobs: list[_Job],
               round_index: int, remote: _Remote, local_tmp: Path,
               outputs: dict[int, list[BenchmarkModelOutput]], failures: dict[int, str],
               log: Callable[[str], None]) -> None:
    """One round over the configurations that have not failed yet."""
    raw_dir = Path(config.raw_dir) if config.raw_dir else None
    for k, job in enumerate(jobs):
        if k in failures:
            continue
        name = models[job.model_index].name
        log(f"[round {round_index + 1}/{config.repeats}] {name}: "
            f"{job.delegate}, {job.threads} thread(s)")
        try:
            outputs[k].append(_run_one(
                adb, config, job, k, round_index, remote.folder, remote.binary,
                remote.models[job.model_index], local_tmp, raw_dir,
            ))
        except _RunError as err:
            failures[k] = str(err)
            log(f"  failed: {err}")


def _record(config: AndroidBenchConfig, job: _Job, runs: list[BenchmarkModelOutput],
            info: tuple[dict[str, Any], dict[str, int]], device: dict[str, Any],
            binary_sha: str, remote_model: str) -> BenchResult:
    """The record of one configuration: its median repeat, with the flags and repeats."""
    chosen, repeats = _pick_median_run(runs)
    model_info, histogram = info
    runtime = {
        "name": _RUNTIME_NAME,
        "version": config.tool_version or "unknown",
        "threads": job.threads,
        "delegate": job.delegate,
        "batch_size": 1,
    }
    extra = {
        "flags": _job_flags(config, job, remote_model),
        "taskset": config.taskset,
        "binary_sha256": binary_sha,
        "op_profiling": config.op_profiling,
        "repeats": repeats,
    }
    if config.op_profiling:
        extra["note"] = "op profiling on: latencies include the profiler's overhead"
    return to_bench_result(
        runs[chosen], model=model_info, device=device, runtime=runtime,
        op_histogram=histogram, extra=extra,
    )


def _run_one(adb: Adb, config: AndroidBenchConfig, job: _Job, k: int, round_index: int,
             remote: str, remote_binary: str, remote_model: str, local_tmp: Path,
             raw_dir: Path | None) -> BenchmarkModelOutput:
    flags = _job_flags(config, job, remote_model)
    log_name = f"run{k}_r{round_index}.log"
    remote_log = posixpath.join(remote, log_name)
    prefix = f"taskset {config.taskset} " if config.taskset else ""
    command = (
        f"cd {shlex.quote(remote)} && {prefix}{shlex.quote(remote_binary)} "
        + " ".join(shlex.quote(f) for f in flags)
        + f" > {shlex.quote(remote_log)} 2>&1; echo {_EXIT_MARKER}$?"
    )
    answer = adb.shell(command, check=False)
    match = re.search(rf"{_EXIT_MARKER}(\d+)", answer)
    local_log = local_tmp / log_name
    adb.pull(remote_log, local_log)
    text = local_log.read_text(errors="replace")
    if raw_dir is not None:
        raw_dir.mkdir(parents=True, exist_ok=True)
        model_stem = Path(remote_model).stem
        (raw_dir / f"{model_stem}_{job.delegate}_t{job.threads}_r{round_index}.log").write_text(
            text
        )
    output = parse_benchmark_output(text)
    status = int(match.group(1)) if match else None
    if status != 0 or not output.completed:
        errors = output.errors or text.strip().splitlines()[-5:]
        raise _RunError(
            f"benchmark_model failed on {Path(remote_model).name} with delegate "
            f"{job.delegate!r} and {job.threads} thread(s) (exit status {status}): "
            + " | ".join(errors)
            + (" -- the GPU delegate needs OpenCL/OpenGL ES support on the phone; try "
               "--delegate xnnpack" if job.delegate == "gpu" else "")
        )
    threads_logged = output.params.get("Num threads")
    if threads_logged is not None and threads_logged != str(job.threads):
        raise _RunError(
            f"benchmark_model ran with {threads_logged} threads instead of {job.threads}."
        )
    return output
