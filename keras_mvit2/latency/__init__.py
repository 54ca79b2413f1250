"""Benchmark harnesses: host LiteRT, Android `benchmark_model`, iPhone Core ML.

Host side (this package): `bench` / `bench_tflite` (one model), `bench_file` (an exported
file, timed in its export target's runtime), `run_attention_sweep` (the paper's Fig. 1),
`run_models_table` (Table 2 / Fig. 2 axes), `compare` (merge records from several
devices). All write the shared `BenchResult` record.
"""

from keras_mvit2.backend import lazy_attributes
from keras_mvit2.latency.schema import (
    SCHEMA,
    BenchResult,
    LatencyStats,
    load_results,
    save_results,
)

#: Imported on first use, so that `keras_mvit2.latency.schema` loads without ai_edge_litert.
_LAZY = {name: (f"keras_mvit2.latency.{module}", name) for module, names in (
    ("host", ("bench", "bench_tflite", "bench_coreml", "bench_file", "op_profile",
              "peak_memory_mb", "tflite_macs")),
    ("attention_sweep", ("run_attention_sweep",)),
    ("models_table", ("run_models_table",)),
    ("report", ("compare", "load_many")),
) for name in names}
__getattr__ = lazy_attributes(__name__, _LAZY)

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
