"""Android on-device benchmarks with the official TFLite ``benchmark_model`` over ``adb``.

`run_android_benchmarks` picks the phone (``adb devices``), reads its properties
(``adb shell getprop``), checks that the binary was built for the phone's ABI, pushes
the binary and the models into a work folder under ``/data/local/tmp``, runs every
(model, delegate, threads) configuration ``repeats`` times in interleaved order (so
that thermal drift hits all configurations alike), pulls each run's log back, parses
it (`parse_benchmark_output`) into `BenchResult` records (schema
``keras_mvit2.bench/1``, ``device.platform == "android"``) and removes the work folder.
Every ``adb`` call goes through `Adb.run`.

Command line: ``python -m keras_mvit2.bench.android MODEL.tflite ... --benchmark-model
PATH`` (see `add_arguments`; the results are written as JSON and printed as a table).

What the tool reports and how it lands in the record (times in the log are
microseconds, the record holds milliseconds):

* ``latency_ms.min/max/mean`` and ``runs`` come from the statistics line of the timed
  runs (``count=... min=... max=... avg=... std=...``), ``warmup`` from the warm-up line.
* ``latency_ms.median``: builds of the tool whose statistics keep every run
  (``StatWithPercentiles``: the current LiteRT sources) also print ``p5= median= p95=``;
  their median is the run at index ``n*50/100`` of the sorted runs (the upper median
  for an even count). Older builds print no percentile and the median is ``None``.
* ``latency_ms.p90`` is always ``None``: ``benchmark_model`` does not compute it (it
  prints p5 and p95, kept in ``extra``), and it does not print single runs either.
* ``peak_memory_mb``: "Overall peak memory footprint (MB) via periodic monitoring"
  (``--report_peak_memory_footprint=true``, on by default here; the tool samples the
  footprint from a separate thread every 50 ms).
* ``extra``: init time, first inference, warm-up mean, std, p5/p95, model file size,
  memory footprint deltas, delegate coverage, the exact flags, the binary's SHA-256 and,
  with ``--op-profiling``, the per-op tables (summary by node type and the top ops).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keras_mvit2.bench.schema import BenchResult, LatencyStats, save_results
from keras_mvit2.utils.files import sha256_file

__all__ = [
    "BENCHMARK_MODEL_HELP",
    "DELEGATES",
    "Adb",
    "AndroidBenchConfig",
    "AndroidBenchError",
    "BenchmarkModelOutput",
    "OpProfile",
    "PartialRunError",
    "RunStats",
    "add_arguments",
    "benchmark_flags",
    "format_table",
    "main",
    "parse_benchmark_output",
    "parse_getprop",
    "run_android_benchmarks",
    "run_from_args",
    "to_bench_result",
]

#: Where to get the binary (printed by the command line and its errors).
BENCHMARK_MODEL_HELP = """\
benchmark_model is the official TFLite benchmark tool (a native command-line binary,
not the benchmark .apk). Get the build for your phone's CPU from the LiteRT
performance-measurement page (https://ai.google.dev/edge/litert/models/measurement,
section "Native benchmark binary"), nightly prebuilt binaries:
  64-bit phones (ABI arm64-v8a):   android_aarch64_benchmark_model
  32-bit phones (ABI armeabi-v7a): android_arm_benchmark_model
  https://storage.googleapis.com/tensorflow-nightly-public/prod/tensorflow/release/lite/tools/nightly/latest/<name>
or build it from source with bazel and the Android NDK configured:
  bazel build -c opt --config=android_arm64 //tensorflow/lite/tools/benchmark:benchmark_model
  (TensorFlow repository; in the LiteRT repository the target is
  //tflite/tools/benchmark:benchmark_model), then pass
  bazel-bin/tensorflow/lite/tools/benchmark/benchmark_model.
The phone's ABI: adb shell getprop ro.product.cpu.abi"""

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

ADB_HELP = (
    "Install Android SDK Platform-Tools (https://developer.android.com/tools/releases/"
    "platform-tools) and put adb on PATH, or pass --adb PATH."
)
USB_DEBUGGING_HELP = (
    "Connect the phone by USB and enable USB debugging: Settings > About phone > tap "
    "'Build number' 7 times, then Settings > System > Developer options > USB debugging; "
    "accept the 'Allow USB debugging?' prompt on the phone."
)


class AndroidBenchError(OSError):
    """adb or benchmark_model failed; the message says what to do."""


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


# --------------------------------------------------------------------------------------
# Parsing benchmark_model output

_NUM = r"[-+]?(?:nan|inf|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_TIMINGS = re.compile(
    rf"Inference timings in us: Init: (?P<init>{_NUM}), First inference: (?P<first>{_NUM}), "
    rf"Warmup \(avg\): (?P<warmup>{_NUM}), Inference \(avg\): (?P<inference>{_NUM})"
)
_LEGACY_TIMINGS = re.compile(
    rf"Average inference timings in us: Warmup: (?P<warmup>{_NUM}), Init: (?P<init>{_NUM}), "
    rf"Inference: (?P<inference>{_NUM})"
)
_RUNNING = re.compile(
    rf"Running benchmark for at least (?P<runs>\d+) iterations and at least (?P<min>{_NUM}) "
    rf"seconds but terminate if exceeding (?P<max>{_NUM}) seconds"
)
_STAT_FIELD = re.compile(rf"\b(count|first|curr|min|max|avg|std|p5|median|p95)=({_NUM})")
_FOOTPRINT = re.compile(
    rf"Memory footprint delta from the start of the tool \(MB\): init=(?P<init>{_NUM}) "
    rf"overall=(?P<overall>{_NUM})"
)
_PEAK = re.compile(rf"Overall peak memory footprint \(MB\) via periodic monitoring: ({_NUM})")
_MODEL_SIZE = re.compile(rf"The input model file size \(MB\): ({_NUM})")
_INIT_SESSION = re.compile(rf"Initialized session in ({_NUM})ms")
_PARAM = re.compile(r"^(?:INFO: )?(?P<name>[A-Za-z][^:\[\]]*): \[(?P<value>[^\]]*)\]\s*$")
_APPLIED = re.compile(
    r"Explicitly applied (?P<delegate>\S+) delegate, and the model graph will be "
    r"(?P<mode>completely|partially) executed by the delegate(?: w/ (?P<kernels>\d+) "
    r"delegate kernels)?"
)
_NOT_APPLIED = re.compile(
    r"Though (?P<delegate>\S+) delegate is explicitly applied, the model graph will not be "
    r"executed by the delegate"
)
_REPLACING = re.compile(
    r"Replacing (?P<replaced>\d+) out of (?P<total>\d+) node\(s\) with delegate "
    r"\((?P<delegate>[^)]+)\) node, yielding (?P<partitions>\d+) partitions"
)
_SEVERE = re.compile(r"\b(ERROR|FATAL): (?P<message>.*)$")
_TABLE_TITLE = re.compile(r"^=+ (?P<title>.+?) =+\s*$")
_NODES_EXECUTED = re.compile(r"^Number of nodes executed: (\d+)")
_SHORT_TIMINGS = re.compile(r"^Timings \(microseconds\): (.*)$")
_INIT_PROFILE = "Profiling Info for Benchmark Initialization:"
_RUN_PROFILE = "Operator-wise Profiling Info for Regular Benchmark Runs:"


def _number(text: str) -> float | None:
    value = float(text)
    return None if math.isnan(value) else value


@dataclass
class RunStats:
    """One statistics line of `benchmark_model`, in microseconds.

    ``first``/``min``/``max``/``avg`` are filled for a single run too (the tool then
    prints only ``count=1 curr=...``); ``p5``/``median``/``p95`` are ``None`` when the
    build prints no percentiles.
    """

    count: int
    curr: float | None = None
    first: float | None = None
    min: float | None = None
    max: float | None = None
    avg: float | None = None
    std: float | None = None
    p5: float | None = None
    median: float | None = None
    p95: float | None = None

    @classmethod
    def parse(cls, text: str) -> RunStats | None:
        """Parses ``count=50 first=... curr=... min=... max=... avg=... std=...`` (with
        optional `` p5=... median=... p95=...``) or ``count=N curr=X(all same)``."""
        values = {key: _number(num) for key, num in _STAT_FIELD.findall(text)}
        if "count" not in values or values["count"] is None:
            return None
        stats = cls(count=int(values.pop("count")), **values)
        if stats.count > 0 and stats.min is None and stats.curr is not None:
            # "all same": every run took `curr` microseconds.
            stats.first = stats.min = stats.max = stats.avg = stats.curr
            stats.std = 0.0
        return stats


@dataclass
class OpProfile:
    """The op-profiling tables of one section (``--enable_op_profiling=true``).

    Each table is a list of rows (dicts keyed ``node_type``, ``first``, ``avg_ms``,
    ``pct``, ``cdf_pct``, ``mem_kb``, ``times_called``, ``name`` for the per-node tables;
    ``node_type``, ``count``, ``avg_ms``, ``avg_pct``, ``cdf_pct``, ``mem_kb``,
    ``times_called`` for the summary by node type).
    """

    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    nodes_executed: int | None = None
    timings: RunStats | None = None
    delegate_internal: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def by_node_type(self) -> list[dict[str, Any]]:
        """The "Summary by node type" rows (time per run by op type, largest first)."""
        return self.tables.get("Summary by node type", [])

    @property
    def top_by_time(self) -> list[dict[str, Any]]:
        """The "Top by Computation Time" rows (slowest nodes first)."""
        return self.tables.get("Top by Computation Time", [])

    @property
    def run_order(self) -> list[dict[str, Any]]:
        return self.tables.get("Run Order", [])


@dataclass
class BenchmarkModelOutput:
    """What one run of `benchmark_model` printed (times in microseconds, sizes in MB)."""

    params: dict[str, str] = field(default_factory=dict)
    model_size_mb: float | None = None
    init_us: float | None = None
    first_inference_us: float | None = None
    warmup_avg_us: float | None = None
    inference_avg_us: float | None = None
    warmup: RunStats | None = None
    inference: RunStats | None = None
    init_footprint_mb: float | None = None
    overall_footprint_mb: float | None = None
    peak_memory_mb: float | None = None
    delegates_applied: list[dict[str, Any]] = field(default_factory=list)
    replaced_nodes: list[dict[str, Any]] = field(default_factory=list)
    init_profile: OpProfile | None = None
    op_profile: OpProfile | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def completed(self) -> bool:
        """True when the tool reached the end of its timed runs."""
        return self.inference is not None and self.inference.count > 0 and (
            self.inference_avg_us is not None
        )


def _cells(line: str) -> list[str]:
    if "\t" in line:
        cells = line.split("\t")
    else:  # tabs lost (e.g. copied from a terminal): columns are 2+ spaces apart
        cells = re.split(r"\s{2,}", line)
    return [c.strip() for c in cells if c.strip()]


def _column_key(header: str) -> str:
    name = header.strip().strip("[]").strip().lower()
    name = name.replace("%", " pct").replace("kb", " kb")
    return re.sub(r"[^a-z0-9]+", "_", name).strip("_")


def _table_value(key: str, text: str) -> Any:
    if key in ("node_type", "name"):
        return text
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        return text
    return int(value) if key in ("count", "times_called") else value


def _parse_table_rows(header: str, rows: list[str]) -> list[dict[str, Any]]:
    keys = [_column_key(h) for h in _cells(header)]
    parsed = []
    for row in rows:
        cells = _cells(row)
        if len(cells) > len(keys):  # a name with separators in it
            cells = cells[: len(keys) - 1] + [" ".join(cells[len(keys) - 1:])]
        if len(cells) < len(keys) - (1 if keys and keys[-1] == "name" else 0):
            continue
        parsed.append({k: _table_value(k, c) for k, c in zip(keys, cells, strict=False)})
    return parsed


def _parse_profile(lines: list[str]) -> OpProfile:
    profile = OpProfile()
    target = profile.tables
    i = 0
    while i < len(lines):
        line = lines[i].rstrip("\n")
        stripped = line.strip()
        title = _TABLE_TITLE.match(stripped)
        if stripped.startswith("Delegate internal"):
            target = profile.delegate_internal
        elif title and i + 1 < len(lines):
            header = lines[i + 1]
            rows = []
            j = i + 2
            while j < len(lines) and lines[j].strip():
                rows.append(lines[j])
                j += 1
            target.setdefault(title.group("title"), _parse_table_rows(header, rows))
            i = j
            continue
        elif (match := _NODES_EXECUTED.match(stripped)) and target is profile.tables:
            profile.nodes_executed = profile.nodes_executed or int(match.group(1))
        elif (match := _SHORT_TIMINGS.match(stripped)) and target is profile.tables:
            profile.timings = profile.timings or RunStats.parse(match.group(1))
        i += 1
    return profile


def parse_benchmark_output(text: str) -> BenchmarkModelOutput:
    """Parses the log of one `benchmark_model` run (stdout and stderr together).

    Lines are recognized wherever they sit in a line, so log prefixes (``INFO: ``,
    logcat's ``I tflite  : ``) do not matter. The statistics line of a phase is the
    first ``count=`` line after its "Running benchmark for at least ..." line: the
    first phase is the warm-up, the second the timed runs.
    """
    out = BenchmarkModelOutput()
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    phases: list[RunStats] = []
    awaiting_stats = False
    section: list[str] | None = None
    sections: dict[str, list[str]] = {}
    for line in lines:
        if _INIT_PROFILE in line:
            section = sections.setdefault("init", [])
            continue
        if _RUN_PROFILE in line:
            section = sections.setdefault("run", [])
            continue
        if section is not None:
            if line.startswith(("INFO: ", "WARNING: ", "ERROR: ", "VERBOSE: ")):
                section = None
            else:
                section.append(line)
                continue
        if _RUNNING.search(line):
            awaiting_stats = True
            continue
        if awaiting_stats and "count=" in line:
            stats = RunStats.parse(line[line.index("count="):])
            if stats is not None:
                phases.append(stats)
                awaiting_stats = False
                continue
        if match := _TIMINGS.search(line):
            out.init_us = _number(match.group("init"))
            out.first_inference_us = _number(match.group("first"))
            out.warmup_avg_us = _number(match.group("warmup"))
            out.inference_avg_us = _number(match.group("inference"))
        elif match := _LEGACY_TIMINGS.search(line):
            out.init_us = _number(match.group("init"))
            out.warmup_avg_us = _number(match.group("warmup"))
            out.inference_avg_us = _number(match.group("inference"))
        elif match := _FOOTPRINT.search(line):
            out.init_footprint_mb = _number(match.group("init"))
            out.overall_footprint_mb = _number(match.group("overall"))
        elif match := _PEAK.search(line):
            out.peak_memory_mb = _number(match.group(1))
        elif match := _MODEL_SIZE.search(line):
            out.model_size_mb = _number(match.group(1))
        elif match := _APPLIED.search(line):
            kernels = match.group("kernels")
            out.delegates_applied.append({
                "delegate": match.group("delegate"),
                "graph": "complete" if match.group("mode") == "completely" else "partial",
                "delegate_kernels": int(kernels) if kernels else 1,
            })
        elif match := _NOT_APPLIED.search(line):
            out.delegates_applied.append(
                {"delegate": match.group("delegate"), "graph": "none", "delegate_kernels": 0}
            )
        elif match := _REPLACING.search(line):
            out.replaced_nodes.append({
                "delegate": match.group("delegate"),
                "replaced": int(match.group("replaced")),
                "total": int(match.group("total")),
                "partitions": int(match.group("partitions")),
            })
        elif match := _SEVERE.search(line):
            out.errors.append(match.group("message").strip())
        elif match := _PARAM.match(line.strip()):
            out.params.setdefault(match.group("name").strip(), match.group("value"))
        elif out.init_us is None and (match := _INIT_SESSION.search(line)):
            out.init_us = _number(match.group(1)) * 1000.0
    if phases:
        out.warmup = phases[0] if len(phases) > 1 else None
        out.inference = phases[-1]
    if out.first_inference_us is None and out.warmup is not None:
        out.first_inference_us = out.warmup.first
    if "init" in sections:
        out.init_profile = _parse_profile(sections["init"])
    if "run" in sections:
        out.op_profile = _parse_profile(sections["run"])
    return out


# --------------------------------------------------------------------------------------
# Records


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1000.0


def _top_ops(profile: OpProfile, k: int = 5) -> list[dict[str, Any]]:
    rows = sorted(profile.by_node_type, key=lambda r: r.get("avg_ms", 0.0), reverse=True)
    return [
        {"node_type": r.get("node_type"), "count": r.get("count"), "avg_ms": r.get("avg_ms"),
         "pct": r.get("avg_pct")}
        for r in rows[:k]
    ]


def to_bench_result(
    output: BenchmarkModelOutput,
    *,
    model: dict[str, Any],
    device: dict[str, Any],
    runtime: dict[str, Any],
    op_histogram: dict[str, int] | None = None,
    extra: dict[str, Any] | None = None,
    timestamp: str | None = None,
) -> BenchResult:
    """Turns a parsed run into a `BenchResult` (milliseconds; see the module docstring
    for which statistic comes from where)."""
    stats = output.inference
    if not output.completed or stats is None:
        raise ValueError(
            "The benchmark_model output has no timed runs (no 'count=' line after the "
            "second 'Running benchmark for at least ...' line, or no 'Inference timings in "
            "us' line). Errors it printed: " + ("; ".join(output.errors) or "none")
        )
    latency = LatencyStats(
        runs=stats.count,
        warmup=output.warmup.count if output.warmup is not None else 0,
        min=_ms(stats.min),
        median=_ms(stats.median),
        p90=None,
        max=_ms(stats.max),
        mean=_ms(stats.avg),
    )
    unavailable = ["p90"] + ([] if stats.median is not None else ["median"])
    info: dict[str, Any] = {
        "init_ms": _ms(output.init_us),
        "first_inference_ms": _ms(output.first_inference_us),
        "warmup_mean_ms": _ms(output.warmup_avg_us),
        "std_ms": _ms(stats.std),
        "p5_ms": _ms(stats.p5),
        "p95_ms": _ms(stats.p95),
        "first_run_ms": _ms(stats.first),
        "model_size_mb": output.model_size_mb,
        "init_footprint_mb": output.init_footprint_mb,
        "overall_footprint_mb": output.overall_footprint_mb,
        "delegates_applied": output.delegates_applied,
        "replaced_nodes": output.replaced_nodes,
        "unavailable_stats": unavailable,
        "stats_source": (
            "benchmark_model statistics line of the timed runs; "
            + ("median = the run at index n*50/100 of the sorted runs; "
               if stats.median is not None else
               "this build prints no percentile, so no median; ")
            + "benchmark_model computes no p90"
        ),
    }
    if output.op_profile is not None:
        info["op_profile"] = {
            "by_node_type": output.op_profile.by_node_type,
            "top_by_time": output.op_profile.top_by_time,
            "top_ops": _top_ops(output.op_profile),
            "nodes_executed": output.op_profile.nodes_executed,
            "profiled_run_mean_ms": _ms(
                output.op_profile.timings.avg if output.op_profile.timings else None
            ),
        }
    info.update(extra or {})
    return BenchResult(
        model=dict(model),
        device=dict(device),
        runtime=dict(runtime),
        latency_ms=latency,
        peak_memory_mb=output.peak_memory_mb,
        op_histogram=dict(op_histogram or {}),
        extra=info,
        timestamp=timestamp or _now(),
    )


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# --------------------------------------------------------------------------------------
# adb


class Adb:
    """Runs ``adb [-s SERIAL] ...``: every adb call of this module goes through `run`."""

    def __init__(self, executable: str = "adb", serial: str | None = None,
                 timeout: float = 900.0):
        resolved = shutil.which(executable)
        if resolved is None:
            raise AndroidBenchError(f"adb not found ({executable!r}). {ADB_HELP}")
        self.executable = resolved
        self.serial = serial
        self.timeout = timeout

    def run(self, *args: str, check: bool = True, device: bool = True,
            timeout: float | None = None) -> str:
        """Runs adb with `args` (for the selected device unless ``device=False``) and
        returns its standard output; raises `AndroidBenchError` on a non-zero exit."""
        command = [self.executable]
        if device and self.serial:
            command += ["-s", self.serial]
        command += list(args)
        try:
            proc = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout or self.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as err:
            raise AndroidBenchError(
                f"`{shlex.join(command)}` did not finish in {err.timeout:.0f} s."
            ) from err
        if check and proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise AndroidBenchError(
                f"`{shlex.join(command)}` failed (exit {proc.returncode}): "
                + (" | ".join(detail) or "no output")
            )
        return proc.stdout

    def shell(self, command: str, **kwargs: Any) -> str:
        return self.run("shell", command, **kwargs)

    def push(self, local: str | os.PathLike, remote: str) -> None:
        self.run("push", os.fspath(local), remote)

    def pull(self, remote: str, local: str | os.PathLike) -> None:
        self.run("pull", remote, os.fspath(local))

    def select_device(self) -> str:
        """Checks the attached devices and fixes `serial` (the only one, or the given one)."""
        listing = self.run("devices", device=False)
        states: dict[str, str] = {}
        for line in listing.splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 2:
                states[parts[0]] = parts[1]
        if self.serial is not None:
            state = states.get(self.serial)
            if state is None:
                raise AndroidBenchError(
                    f"Device {self.serial!r} is not attached (adb devices lists "
                    f"{sorted(states) or 'nothing'}). {USB_DEBUGGING_HELP}"
                )
        else:
            if not states:
                raise AndroidBenchError(f"No Android device found by `adb devices`. "
                                        f"{USB_DEBUGGING_HELP}")
            if len(states) > 1:
                raise AndroidBenchError(
                    f"Several devices are attached ({', '.join(sorted(states))}); "
                    "pass --serial with one of them."
                )
            self.serial, state = next(iter(states.items()))
        if state == "unauthorized":
            raise AndroidBenchError(
                f"Device {self.serial} is unauthorized: unlock it and accept the 'Allow USB "
                "debugging?' prompt, then run again."
            )
        if state != "device":
            raise AndroidBenchError(
                f"Device {self.serial} is {state!r}, not ready. Reconnect the cable or run "
                "`adb kill-server`, then run again."
            )
        return self.serial


_GETPROP_LINE = re.compile(r"^\[(?P<key>[^\]]+)\]: \[(?P<value>.*)\]\s*$")


def parse_getprop(text: str) -> dict[str, str]:
    """Parses ``adb shell getprop`` (``[key]: [value]`` lines)."""
    props = {}
    for line in text.splitlines():
        if match := _GETPROP_LINE.match(line.strip()):
            props[match.group("key")] = match.group("value")
    return props


def device_info(props: dict[str, str]) -> dict[str, Any]:
    """The record's ``device`` dict from getprop: model name, Android version, SoC."""
    soc_model = props.get("ro.soc.model", "")
    soc_maker = props.get("ro.soc.manufacturer", "")
    soc = " ".join(p for p in (soc_maker, soc_model) if p) or next(
        (props[k] for k in ("ro.hardware.chipname", "ro.board.platform", "ro.hardware")
         if props.get(k)), "unknown",
    )
    release = props.get("ro.build.version.release", "?")
    sdk = props.get("ro.build.version.sdk", "?")
    return {
        "name": props.get("ro.product.model") or "unknown Android device",
        "platform": "android",
        "machine": props.get("ro.product.cpu.abi", "unknown"),
        "os": f"Android {release} (API {sdk})",
        "cpu": soc,
        "manufacturer": props.get("ro.product.manufacturer", ""),
        "device": props.get("ro.product.device", ""),
        "build": props.get("ro.build.id", ""),
    }


_ELF_MACHINES = {3: "x86", 40: "32-bit ARM", 62: "x86-64", 183: "AArch64 (64-bit ARM)"}
_ABI_MACHINES = {"arm64-v8a": 183, "armeabi-v7a": 40, "armeabi": 40, "x86_64": 62, "x86": 3}


def check_binary_for_device(path: Path, props: dict[str, str]) -> None:
    """Raises when `path` is not an ELF executable for one of the phone's ABIs."""
    with open(path, "rb") as f:
        head = f.read(20)
    if head[:4] != b"\x7fELF":
        hint = " (an .apk is the benchmark app, not the binary)" if head[:2] == b"PK" else ""
        raise AndroidBenchError(
            f"{path} is not a native executable (no ELF header){hint}.\n{BENCHMARK_MODEL_HELP}"
        )
    machine = int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")
    abis = [a for a in props.get("ro.product.cpu.abilist", "").split(",") if a]
    abis = abis or [props.get("ro.product.cpu.abi", "")]
    wanted = {_ABI_MACHINES[a] for a in abis if a in _ABI_MACHINES}
    if wanted and machine not in wanted:
        built = _ELF_MACHINES.get(machine, f"ELF machine {machine}")
        raise AndroidBenchError(
            f"{path} is built for {built}, but the phone runs {', '.join(abis)}: use "
            "android_aarch64_benchmark_model for arm64-v8a (android_arm_benchmark_model for "
            f"armeabi-v7a).\n{BENCHMARK_MODEL_HELP}"
        )


# --------------------------------------------------------------------------------------
# Driver


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
    from keras_mvit2.bench.host import tflite_model_entry
    from keras_mvit2.export.tflite import inspect_tflite

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
    serial = adb.select_device()
    props = parse_getprop(adb.shell("getprop"))
    check_binary_for_device(Path(config.benchmark_model), props)
    device = device_info(props)
    log(f"Device {serial}: {device['name']}, {device['os']}, {device['cpu']}, "
        f"{device['machine']}")
    infos = [_model_info(m) for m in models]
    binary_sha = sha256_file(Path(config.benchmark_model))

    remote = config.remote_dir.rstrip("/")
    remote_binary = posixpath.join(remote, "benchmark_model")
    remote_models = [posixpath.join(remote, f"m{i}_{m.name}") for i, m in enumerate(models)]
    jobs = [_Job(i, d, t) for i in range(len(models)) for d in config.delegates
            for t in config.threads]
    outputs: dict[int, list[BenchmarkModelOutput]] = {k: [] for k in range(len(jobs))}
    failures: dict[int, str] = {}
    raw_dir = Path(config.raw_dir) if config.raw_dir else None
    local_tmp = Path(tempfile.mkdtemp(prefix="keras_mvit2_android_"))
    try:
        adb.shell(f"mkdir -p {shlex.quote(remote)}")
        adb.push(config.benchmark_model, remote_binary)
        adb.shell(f"chmod +x {shlex.quote(remote_binary)}")
        for model, remote_model in zip(models, remote_models, strict=True):
            adb.push(model, remote_model)
        for round_index in range(config.repeats):
            for k, job in enumerate(jobs):
                if k in failures:
                    continue
                name = models[job.model_index].name
                log(f"[round {round_index + 1}/{config.repeats}] {name}: "
                    f"{job.delegate}, {job.threads} thread(s)")
                try:
                    outputs[k].append(_run_one(
                        adb, config, job, k, round_index, remote, remote_binary,
                        remote_models[job.model_index], local_tmp, raw_dir,
                    ))
                except _RunError as err:
                    failures[k] = str(err)
                    log(f"  failed: {err}")
    finally:
        if not config.keep_remote:
            adb.shell(f"rm -rf {shlex.quote(remote)}", check=False)
        shutil.rmtree(local_tmp, ignore_errors=True)

    results = []
    for k, job in enumerate(jobs):
        if k in failures:
            continue
        runs = outputs[k]
        chosen, repeats = _pick_median_run(runs)
        model_info, histogram = infos[job.model_index]
        runtime = {
            "name": _RUNTIME_NAME,
            "version": config.tool_version or "unknown",
            "threads": job.threads,
            "delegate": job.delegate,
            "batch_size": 1,
        }
        flags = benchmark_flags(
            remote_models[job.model_index], delegate=job.delegate, threads=job.threads,
            runs=config.runs, warmup=config.warmup, peak_memory=config.peak_memory,
            op_profiling=config.op_profiling, extra_flags=config.extra_flags,
        )
        extra = {
            "flags": flags,
            "taskset": config.taskset,
            "binary_sha256": binary_sha,
            "op_profiling": config.op_profiling,
            "repeats": repeats,
        }
        if config.op_profiling:
            extra["note"] = "op profiling on: latencies include the profiler's overhead"
        results.append(to_bench_result(
            runs[chosen], model=model_info, device=device, runtime=runtime,
            op_histogram=histogram, extra=extra,
        ))
    if failures:
        raise PartialRunError(results, [failures[k] for k in sorted(failures)])
    return results


def _run_one(adb: Adb, config: AndroidBenchConfig, job: _Job, k: int, round_index: int,
             remote: str, remote_binary: str, remote_model: str, local_tmp: Path,
             raw_dir: Path | None) -> BenchmarkModelOutput:
    flags = benchmark_flags(
        remote_model, delegate=job.delegate, threads=job.threads, runs=config.runs,
        warmup=config.warmup, peak_memory=config.peak_memory,
        op_profiling=config.op_profiling, extra_flags=config.extra_flags,
    )
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


# --------------------------------------------------------------------------------------
# Table and command line


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def format_table(results: Sequence[BenchResult]) -> str:
    """A plain-text table: one row per record, latencies in ms."""
    header = ("model", "device", "delegate", "threads", "runs", "min", "median", "mean",
              "max", "peak MB")
    rows = [header]
    for r in results:
        lat = r.latency_ms
        rows.append((
            str(r.model.get("name")), str(r.device.get("name")), str(r.runtime.get("delegate")),
            str(r.runtime.get("threads")), str(lat.runs), _fmt(lat.min), _fmt(lat.median),
            _fmt(lat.mean), _fmt(lat.max), _fmt(r.peak_memory_mb, 1),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i < 3 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command-line arguments (for ``mvit2 bench-android`` or ``python -m``)."""
    parser.add_argument("models", nargs="+", type=Path, metavar="MODEL.tflite",
                        help="one or more .tflite models (e.g. from `mvit2 export`)")
    parser.add_argument("--benchmark-model", required=True, type=Path, metavar="PATH",
                        help="the Android benchmark_model binary (see below where to get it)")
    parser.add_argument("--delegate", nargs="+", default=["xnnpack"], choices=sorted(DELEGATES),
                        help="runtime configurations (default: xnnpack); gpu and nnapi give "
                             "the ops they reject to XNNPACK")
    parser.add_argument("--threads", nargs="+", type=int, default=[1],
                        help="CPU thread counts (default: 1)")
    parser.add_argument("--runs", type=int, default=50, help="timed runs (default: 50)")
    parser.add_argument("--warmup", type=int, default=5, help="warm-up runs (default: 5)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds over all configurations, interleaved; the record keeps "
                             "the round with the median mean (default: 1)")
    parser.add_argument("--op-profiling", action="store_true",
                        help="per-op timings (--enable_op_profiling=true; adds overhead)")
    parser.add_argument("--no-peak-memory", action="store_true",
                        help="do not pass --report_peak_memory_footprint=true")
    parser.add_argument("--taskset", metavar="MASK",
                        help="CPU affinity mask for the run, e.g. f0 for the big cores")
    parser.add_argument("--extra-flag", action="append", default=[], metavar="FLAG",
                        help="more benchmark_model flags, e.g. --extra-flag=--gpu_backend=cl")
    parser.add_argument("--serial", help="the device's serial (adb devices) if several")
    parser.add_argument("--adb", default="adb", help="the adb executable (default: adb)")
    parser.add_argument("--remote-dir", default=DEFAULT_REMOTE_DIR,
                        help=f"work folder on the phone (default: {DEFAULT_REMOTE_DIR})")
    parser.add_argument("--keep-remote", action="store_true",
                        help="leave the work folder on the phone")
    parser.add_argument("--raw-dir", type=Path,
                        help="also keep each run's benchmark_model log in this folder")
    parser.add_argument("--tool-version", help="label of the binary (e.g. nightly-2026-10-01)")
    parser.add_argument("-o", "--output", type=Path, default=Path("android_bench.json"),
                        help="results JSON (default: android_bench.json)")


def run_from_args(args: argparse.Namespace) -> int:
    """Runs the command line's configuration, writes the JSON and prints the table."""
    config = AndroidBenchConfig(
        models=list(args.models), benchmark_model=args.benchmark_model,
        delegates=list(args.delegate), threads=list(args.threads), runs=args.runs,
        warmup=args.warmup, repeats=args.repeats, peak_memory=not args.no_peak_memory,
        op_profiling=args.op_profiling, taskset=args.taskset,
        extra_flags=list(args.extra_flag), serial=args.serial, adb=args.adb,
        remote_dir=args.remote_dir, keep_remote=args.keep_remote, raw_dir=args.raw_dir,
        tool_version=args.tool_version,
    )
    try:
        results = run_android_benchmarks(config, log=lambda m: print(m, file=sys.stderr))
    except PartialRunError as err:
        if err.results:
            save_results(err.results, args.output)
            print(format_table(err.results))
            print(f"Wrote {len(err.results)} record(s) to {args.output}")
        print(f"error: {err}", file=sys.stderr)
        return 1
    save_results(results, args.output)
    print(format_table(results))
    print(f"Wrote {len(results)} record(s) to {args.output}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m keras_mvit2.bench.android``."""
    parser = argparse.ArgumentParser(
        prog="python -m keras_mvit2.bench.android",
        description="Benchmark .tflite models on an Android phone with benchmark_model "
                    "over adb; writes keras_mvit2.bench/1 JSON records.",
        epilog=BENCHMARK_MODEL_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_from_args(args)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
