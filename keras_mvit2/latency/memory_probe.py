"""The peak-memory probe of `keras_mvit2.latency.host.peak_memory_mb` (the method is in
that module's docstring), run by its path in a fresh process so that the package's own
imports stay out of it: ``python memory_probe.py MODEL.tflite THREADS XNNPACK(0|1) RUNS``.
Prints one JSON line: ``peak_mb``, ``baseline_mb`` and ``method``.
"""

import json
import resource
import sys

import numpy as np
from ai_edge_litert.interpreter import Interpreter, OpResolverType


def status_kb(field):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def maxrss_kb():
    value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return value / 1024 if sys.platform == "darwin" else value


def main(argv: list[str]) -> None:
    """Measures the model of `argv` (path, threads, xnnpack "1"/"0", runs); prints JSON."""
    path, threads, xnnpack, runs = argv[1], int(argv[2]), argv[3] == "1", int(argv[4])
    resolver = OpResolverType.AUTO if xnnpack else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    baseline = status_kb("VmRSS")
    reset = False
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        reset = status_kb("VmHWM") is not None
    except OSError:
        pass
    if baseline is None:
        baseline = maxrss_kb()
    interpreter = Interpreter(model_path=path, num_threads=threads,
                              experimental_op_resolver_type=resolver)
    interpreter.allocate_tensors()
    for detail in interpreter.get_input_details():
        view = interpreter.tensor(detail["index"])()
        view.fill(1 if np.issubdtype(view.dtype, np.integer) else 0.5)
        del view
    for _ in range(runs):
        interpreter.invoke()
    peak = status_kb("VmHWM") if reset else maxrss_kb()
    method = ("VmHWM after clear_refs reset minus VmRSS before loading" if reset
              else "ru_maxrss minus RSS before loading (high-water mark not resettable)")
    print(json.dumps({"peak_mb": (peak - baseline) / 1024.0, "baseline_mb": baseline / 1024.0,
                      "method": method}))


if __name__ == "__main__":
    main(sys.argv)
