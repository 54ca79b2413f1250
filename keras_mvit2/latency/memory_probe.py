"""The peak-memory probe of `keras_mvit2.latency.host.peak_memory_mb`, run as a script in a
fresh process: ``python memory_probe.py MODEL.tflite THREADS XNNPACK(0|1) RUNS``.

It imports only numpy and ``ai_edge_litert`` (run by its path, not with ``-m``, so that
the package's own imports stay out of the measured process), reads its resident set size
(``VmRSS``), resets the kernel's high-water mark (``echo 5 > /proc/self/clear_refs``),
then loads the model, allocates the tensors and runs `RUNS` inferences. It prints one
JSON line: ``peak_mb`` (the high-water mark ``VmHWM`` minus that baseline, or
``ru_maxrss`` minus it where the mark cannot be reset), ``baseline_mb`` and ``method``.
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
