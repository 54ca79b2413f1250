"""Writes the sample `benchmark_model` outputs of this folder (see README.md).

No build of the TFLite `benchmark_model` tool could be installed on the Linux machine
where the Android harness was written (no registry package ships it), so these files
are not captured from the tool: they are written here, line by line, the way the
tool's C++ source writes them. Each writer below names the source it follows; the
numbers are illustrative (not a measurement) but internally consistent: the
"count=..." statistics are computed from a list of per-run times exactly as
`Stat` / `StatWithPercentiles` (xla/tsl/util/stats_calculator.h) compute them.

Run from the repository root: ``python tests/data/benchmark_model/make_samples.py``.
"""

from __future__ import annotations

import math
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
REMOTE = "/data/local/tmp/keras_mvit2_bench"


def cpp_g(x: float) -> str:
    """`std::ostream << double` with the default format: like printf "%g" (precision 6)."""
    if math.isnan(x):
        return "nan"
    return format(x, ".6g")


class Stat:
    """`tsl::Stat<int64_t>` / `StatWithPercentiles<int64_t>` over per-run microseconds."""

    def __init__(self, values: list[int], percentiles: bool):
        self.values = list(values)
        self.percentiles = percentiles

    @property
    def first(self) -> int:
        return self.values[0] if self.values else 0

    @property
    def avg(self) -> float:
        return sum(self.values) / len(self.values) if self.values else math.nan

    def std(self) -> int:
        if min(self.values) == max(self.values):
            return 0
        squared = float(sum(v * v for v in self.values))
        variance = int(squared / len(self.values) - self.avg * self.avg)  # int64 ValueType
        return int(math.sqrt(variance))

    def percentile(self, p: int) -> int:
        ordered = sorted(self.values)  # nth_element picks the same element
        return ordered[len(ordered) * p // 100]

    def line(self) -> str:
        v = self.values
        if not v:
            text = "count=0"
        elif min(v) == max(v):
            text = f"count={len(v)} curr={v[-1]}" + ("(all same)" if len(v) > 1 else "")
        else:
            text = (
                f"count={len(v)} first={v[0]} curr={v[-1]} min={min(v)} max={max(v)} "
                f"avg={cpp_g(self.avg)} std={self.std()}"
            )
        if self.percentiles and v:
            text += (
                f" p5={self.percentile(5)} median={self.percentile(50)} "
                f"p95={self.percentile(95)}"
            )
        return text


def runs(seed: int, n: int, base: int, spread: int, first_extra: int = 0) -> list[int]:
    rng = random.Random(seed)
    values = [base + int(abs(rng.gauss(0, spread))) for _ in range(n)]
    values[0] += first_extra
    return values


def field(value, width: int) -> str:
    """`InitField`: a tab, then right-aligned in `width` with fixed 3 decimals."""
    text = f"{value:.3f}" if isinstance(value, float) else str(value)
    return "\t" + text.rjust(width)


# Profile tables: tsl::StatsCalculator (xla/tsl/util/stats_calculator.cc)
def run_order_table(title: str, nodes: list[dict], total_sum: float, limit: int = 0) -> str:
    lines = [f"============================== {title} =============================="]
    lines.append(
        field("[node type]", 40) + field("[first]", 9) + field("[avg ms]", 9)
        + field("[%]", 8) + field("[cdf%]", 8) + field("[mem KB]", 10)
        + field("[times called]", 9) + "\t[Name]"
    )
    cumulative = 0.0
    for i, node in enumerate(nodes):
        if limit and i >= limit:
            break
        cumulative += node["sum_us"]
        lines.append(
            field(node["type"], 40) + field(node["first_us"] / 1000.0, 9)
            + field(node["avg_us"] / 1000.0, 9)
            + field(node["sum_us"] * 100.0 / total_sum, 7) + "%"
            + field(cumulative * 100.0 / total_sum, 7) + "%"
            + field(node.get("mem_kb", 0.0), 10) + field(node.get("times", 1), 9)
            + "\t" + node["name"]
        )
    return "\n".join(lines) + "\n\n"


def node_type_table(nodes: list[dict], runs_count: int) -> str:
    by_type: dict[str, list] = {}
    for node in nodes:
        entry = by_type.setdefault(node["type"], [0, 0, 0.0, 0])
        entry[0] += 1
        entry[1] += int(node["sum_us"] / runs_count)
        entry[2] += node.get("mem_kb", 0.0)
        entry[3] += node.get("times", 1)
    accumulated = sum(e[1] for e in by_type.values())
    lines = [f"Number of nodes executed: {len(nodes)}"]
    lines.append("============================== Summary by node type "
                 "==============================")
    lines.append(
        field("[Node type]", 40) + field("[count]", 9) + field("[avg ms]", 10)
        + field("[avg %]", 11) + field("[cdf %]", 11) + field("[mem KB]", 10)
        + field("[times called]", 10)
    )
    cdf = 0.0
    for node_type, (count, total_us, mem, times) in sorted(
        by_type.items(), key=lambda kv: (kv[1][1], kv[0]), reverse=True
    ):
        pct = total_us / accumulated * 100.0
        cdf += pct
        lines.append(
            field(node_type, 40) + field(count, 9) + field(total_us / 1000.0, 10)
            + field(pct, 10) + "%" + field(cdf, 10) + "%" + field(float(mem), 10)
            + field(times, 9)
        )
    return "\n".join(lines) + "\n\n"


def profile_block(nodes: list[dict], totals: list[int]) -> str:
    """`ProfileSummaryDefaultFormatter` output of one (primary) graph."""
    n = len(totals)
    for node in nodes:
        node["sum_us"] = node["avg_us"] * n
    total_sum = float(sum(totals))
    ordered_by_time = sorted(nodes, key=lambda d: d["avg_us"], reverse=True)
    return (
        run_order_table("Run Order", nodes, total_sum)
        + run_order_table("Top by Computation Time", ordered_by_time, total_sum, limit=10)
        + node_type_table(nodes, n)
        + "Timings (microseconds): " + Stat(totals, percentiles=False).line() + "\n"
        + "Memory (bytes): count=0\n"
        + f"{len(nodes)} nodes observed\n\n\n"
    )


def header(params: list[tuple[str, str]]) -> list[str]:
    """benchmark_main.cc ("STARTING!") and the LogParams of benchmark_model.cc,
    benchmark_tflite_model.cc and the delegate providers, in that order: without
    --verbose only the flags set on the command line are logged (Graph always)."""
    lines = ["INFO: STARTING!", "INFO: Log parameter values verbosely: [0]"]
    return lines + [f"INFO: {name}: [{value}]" for name, value in params]


def run_section(warmup: Stat, regular: Stat, warmup_runs: int, num_runs: int) -> list[str]:
    """`BenchmarkModel::Run`: one "Running benchmark ..." line and one stats line per phase."""
    return [
        f"INFO: Running benchmark for at least {warmup_runs} iterations and at least 0 "
        "seconds but terminate if exceeding 150 seconds.",
        f"INFO: {warmup.line()}",
        "",
        f"INFO: Running benchmark for at least {num_runs} iterations and at least 0 "
        "seconds but terminate if exceeding 150 seconds.",
        f"INFO: {regular.line()}",
        "",
    ]


def end_section(init_us: int, warmup: Stat, regular: Stat, init_kb: float, overall_kb: float,
                peak_mb: float | None, rss: tuple[int, int, int] | None) -> list[str]:
    """`BenchmarkLoggingListener::OnBenchmarkEnd` (benchmark_model.cc)."""
    lines = [
        f"INFO: Inference timings in us: Init: {init_us}, First inference: {warmup.first}, "
        f"Warmup (avg): {cpp_g(warmup.avg)}, Inference (avg): {cpp_g(regular.avg)}",
        "INFO: Note: as the benchmark tool itself affects memory footprint, the following is "
        "only APPROXIMATE to the actual memory footprint of the model at runtime. Take the "
        "information at your discretion.",
        f"INFO: Memory footprint delta from the start of the tool (MB): "
        f"init={cpp_g(init_kb / 1024.0)} overall={cpp_g(overall_kb / 1024.0)}",
    ]
    if peak_mb is not None:
        lines.append(
            f"INFO: Overall peak memory footprint (MB) via periodic monitoring: {cpp_g(peak_mb)}"
        )
        vm, anon, shared = rss
        lines += [
            "INFO: Memory status at the end of exeution:",
            f"INFO: - VmRSS              : {vm} MB",
            f"INFO: + RssAnnon           : {anon} MB",
            f"INFO: + RssFile + RssShmem : {shared} MB",
        ]
    return lines


def write(name: str, lines: list[str]) -> None:
    with open(os.path.join(HERE, name), "w") as f:
        f.write("\n".join(lines) + "\n")


def sample_xnnpack() -> None:
    """Current tool (StatWithPercentiles: p5/median/p95), XNNPACK, 4 threads, peak memory."""
    graph = f"{REMOTE}/m0_mobilevitv2_050.tflite"
    warmup = Stat(runs(1, 5, 23310, 180, first_extra=17900), percentiles=True)
    regular = Stat(runs(2, 50, 22950, 260), percentiles=True)
    lines = header([
        ("Min num runs", "50"), ("Min runs duration (seconds)", "0"), ("Num threads", "4"),
        ("Min warmup runs", "5"), ("Min warmup runs duration (seconds)", "0"),
        ("Report the peak memory footprint", "1"), ("Graph", graph), ("Signature to run", ""),
        ("Use xnnpack", "1"),
    ])
    lines += [
        f"INFO: Loaded model {graph}",
        "INFO: Created TensorFlow Lite XNNPACK delegate for CPU.",
        "VERBOSE: Replacing 443 out of 452 node(s) with delegate (TfLiteXNNPackDelegate) "
        "node, yielding 10 partitions for the whole graph.",
        "INFO: Explicitly applied XNNPACK delegate, and the model graph will be partially "
        "executed by the delegate w/ 10 delegate kernels.",
        "INFO: The input model file size (MB): 5.52125",
        "INFO: Initialized session in 187.654ms.",
    ]
    lines += run_section(warmup, regular, 5, 50)
    lines += end_section(187654, warmup, regular, 21.0 * 1024 + 312, 33.0 * 1024 + 88,
                         61.7305, (58, 44, 14))
    write("tflite_xnnpack_threads4.txt", lines)


def sample_op_profiling() -> None:
    """Current tool, plain TFLite kernels (--use_xnnpack=false), 1 thread, op profiling
    (ProfilingListener::OnBenchmarkEnd, profiling_listener.cc), one warm-up run."""
    graph = f"{REMOTE}/m0_separable_attention_k256.tflite"
    warmup = Stat([5104], percentiles=True)
    regular = Stat(runs(3, 20, 2461, 40), percentiles=True)
    nodes = [
        {"type": "FULLY_CONNECTED", "name": "[attn/qkv_proj/MatMul]:0", "first_us": 1401,
         "avg_us": 1172},
        {"type": "SPLIT_V", "name": "[attn/split]:1", "first_us": 61, "avg_us": 38},
        {"type": "SOFTMAX", "name": "[attn/context_scores]:2", "first_us": 29, "avg_us": 21},
        {"type": "MUL", "name": "[attn/context_vector_mul]:3", "first_us": 158, "avg_us": 131},
        {"type": "SUM", "name": "[attn/context_vector]:4", "first_us": 187, "avg_us": 162},
        {"type": "RELU", "name": "[attn/value_relu]:5", "first_us": 88, "avg_us": 64},
        {"type": "MUL", "name": "[attn/out_mul]:6", "first_us": 141, "avg_us": 127},
        {"type": "FULLY_CONNECTED", "name": "[attn/out_proj/MatMul]:7", "first_us": 731,
         "avg_us": 694},
    ]
    # Per-run totals of the node times: their mean is the sum of the node averages.
    jitter = [37, -12, -8, 5, -3, 44, -20, -9, 2, -15, 11, -6, -14, 3, -10, 8, -7, 1, -4, -3]
    totals = [sum(n["avg_us"] for n in nodes) + d for d in jitter]
    init_nodes = [{"type": "AllocateTensors", "name": "AllocateTensors/0", "first_us": 1356,
                   "avg_us": 1356}]
    lines = header([
        ("Min num runs", "20"), ("Min runs duration (seconds)", "0"), ("Num threads", "1"),
        ("Min warmup runs", "1"), ("Min warmup runs duration (seconds)", "0"),
        ("Graph", graph), ("Signature to run", ""), ("Enable op profiling", "1"),
        ("Use xnnpack", "0"),
    ])
    lines += [
        f"INFO: Loaded model {graph}",
        "INFO: The input model file size (MB): 0.791532",
        "INFO: Initialized session in 3.912ms.",
    ]
    lines += run_section(warmup, regular, 1, 20)
    lines += end_section(3912, warmup, regular, 2.5 * 1024, 6.75 * 1024, None, None)
    text = "\n".join(lines) + "\n"
    text += "INFO: Profiling Info for Benchmark Initialization:\n"
    text += profile_block(init_nodes, [1356]) + "\n"
    text += "INFO: Operator-wise Profiling Info for Regular Benchmark Runs:\n"
    text += profile_block(nodes, totals) + "\n"
    with open(os.path.join(HERE, "tflite_none_op_profiling.txt"), "w") as f:
        f.write(text)


def sample_legacy_gpu() -> None:
    """An older tool (plain `Stat`: no percentiles), GPU delegate then XNNPACK, 4 threads,
    no peak-memory monitor: the GPU delegate takes the whole graph."""
    graph = f"{REMOTE}/m0_mobilevitv2_050.tflite"
    warmup = Stat(runs(5, 5, 14020, 300, first_extra=101000), percentiles=False)
    regular = Stat(runs(6, 50, 13890, 410), percentiles=False)
    lines = header([
        ("Min num runs", "50"), ("Min runs duration (seconds)", "0"), ("Num threads", "4"),
        ("Min warmup runs", "5"), ("Min warmup runs duration (seconds)", "0"),
        ("Graph", graph), ("Use gpu", "1"), ("Use xnnpack", "1"),
    ])
    lines += [
        f"INFO: Loaded model {graph}",
        "INFO: Going to apply 2 delegates one after another.",
        "INFO: Created TensorFlow Lite delegate for GPU.",
        "INFO: Initialized OpenCL-based API.",
        "INFO: Created 1 GPU delegate kernels.",
        "INFO: Explicitly applied GPU delegate, and the model graph will be completely "
        "executed by the delegate.",
        "INFO: Created TensorFlow Lite XNNPACK delegate for CPU.",
        "INFO: Though XNNPACK delegate is explicitly applied, the model graph will not be "
        "executed by the delegate.",
        "INFO: The input model file size (MB): 5.52125",
        "INFO: Initialized session in 1214.38ms.",
    ]
    lines += run_section(warmup, regular, 5, 50)
    lines += end_section(1214380, warmup, regular, 96.25 * 1024, 101.5 * 1024, None, None)
    write("tflite_legacy_gpu.txt", lines)


def sample_nnapi() -> None:
    """Current tool, NNAPI then XNNPACK for the rest, 1 thread, peak memory."""
    graph = f"{REMOTE}/m0_mobilevitv2_050.tflite"
    warmup = Stat(runs(7, 5, 30120, 500, first_extra=9000), percentiles=True)
    regular = Stat(runs(8, 50, 29870, 650), percentiles=True)
    lines = header([
        ("Min num runs", "50"), ("Min runs duration (seconds)", "0"), ("Num threads", "1"),
        ("Min warmup runs", "5"), ("Min warmup runs duration (seconds)", "0"),
        ("Report the peak memory footprint", "1"), ("Graph", graph), ("Signature to run", ""),
        ("Use NNAPI", "1"), ("Use xnnpack", "1"),
    ])
    lines += [
        f"INFO: Loaded model {graph}",
        "INFO: Going to apply 2 delegates one after another.",
        "INFO: Created TensorFlow Lite delegate for NNAPI.",
        "INFO: Explicitly applied NNAPI delegate, and the model graph will be partially "
        "executed by the delegate w/ 4 delegate kernels.",
        "INFO: Created TensorFlow Lite XNNPACK delegate for CPU.",
        "INFO: Explicitly applied XNNPACK delegate, and the model graph will be partially "
        "executed by the delegate w/ 3 delegate kernels.",
        "INFO: The input model file size (MB): 5.52125",
        "INFO: Initialized session in 402.771ms.",
    ]
    lines += run_section(warmup, regular, 5, 50)
    lines += end_section(402771, warmup, regular, 40.5 * 1024, 47.25 * 1024, 88.1055,
                         (86, 61, 25))
    write("tflite_nnapi_threads1.txt", lines)


def sample_failure() -> None:
    """Init fails (BenchmarkTfLiteModel::Init "Failed to apply ... delegate."), then
    benchmark_main.cc logs "Benchmarking failed." and exits with EXIT_FAILURE."""
    graph = f"{REMOTE}/m0_mobilevitv2_050.tflite"
    lines = header([
        ("Min num runs", "50"), ("Min runs duration (seconds)", "0"), ("Num threads", "1"),
        ("Min warmup runs", "5"), ("Min warmup runs duration (seconds)", "0"),
        ("Graph", graph), ("Signature to run", ""), ("Use gpu", "1"),
    ])
    lines += [
        f"INFO: Loaded model {graph}",
        "INFO: Created TensorFlow Lite delegate for GPU.",
        "ERROR: Failed to apply GPU delegate.",
        "ERROR: Benchmarking failed.",
    ]
    write("tflite_gpu_failed.txt", lines)


if __name__ == "__main__":
    sample_xnnpack()
    sample_op_profiling()
    sample_legacy_gpu()
    sample_nnapi()
    sample_failure()
