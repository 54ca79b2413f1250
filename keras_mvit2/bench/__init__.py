"""Benchmark harnesses: host LiteRT, Android `benchmark_model`, iPhone Core ML."""

from keras_mvit2.bench.schema import (
    SCHEMA,
    BenchResult,
    LatencyStats,
    load_results,
    save_results,
)

__all__ = ["SCHEMA", "BenchResult", "LatencyStats", "load_results", "save_results"]
