"""The scripts of `benchmarks/` imported as modules: their pure helpers (statistics, verdicts,
renderers) are tested, and some serve as oracles."""

import importlib.util
import os
from types import ModuleType

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "benchmarks")


def load_benchmark(name: str) -> ModuleType:
    """`benchmarks/<name>.py` as the module `benchmark_<name>` (its `main` is not run)."""
    path = os.path.join(BENCHMARKS, f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
