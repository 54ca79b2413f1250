"""The log of the TFLite ``benchmark_model`` tool: `parse_benchmark_output` reads one run's
output (statistics lines, timings, memory, delegates, op-profiling tables) into a
`BenchmarkModelOutput` (times in microseconds, sizes in MB)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

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
