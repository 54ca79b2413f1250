"""Benchmark harnesses: host LiteRT, Android `benchmark_model`, iPhone Core ML.

Host side (this package): `bench` / `bench_tflite` (one model), `bench_file` (an exported
file, timed in its export target's runtime), `run_attention_sweep` (the paper's Fig. 1),
`run_models_table` (Table 2 / Fig. 2 axes), `compare` (merge records from several
devices). All write the shared `BenchResult` record.
"""

from keras_mvit2.latency.schema import (
    SCHEMA,
    BenchResult,
    LatencyStats,
    load_results,
    save_results,
)

_LAZY = {
    "bench": "keras_mvit2.latency.host",
    "bench_tflite": "keras_mvit2.latency.host",
    "bench_coreml": "keras_mvit2.latency.host",
    "bench_file": "keras_mvit2.latency.host",
    "op_profile": "keras_mvit2.latency.host",
    "peak_memory_mb": "keras_mvit2.latency.host",
    "tflite_macs": "keras_mvit2.latency.host",
    "run_attention_sweep": "keras_mvit2.latency.attention_sweep",
    "run_models_table": "keras_mvit2.latency.models_table",
    "compare": "keras_mvit2.latency.report",
    "load_many": "keras_mvit2.latency.report",
}


def __getattr__(name: str):
    # The harness modules are imported on first use, so `keras_mvit2.latency.schema`
    # stays importable without ai_edge_litert.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'keras_mvit2.latency' has no attribute {name!r}")


__all__ = [
    "SCHEMA",
    "BenchResult",
    "LatencyStats",
    "bench",
    "bench_coreml",
    "bench_file",
    "bench_tflite",
    "compare",
    "load_many",
    "load_results",
    "op_profile",
    "peak_memory_mb",
    "run_attention_sweep",
    "run_models_table",
    "save_results",
    "tflite_macs",
]
