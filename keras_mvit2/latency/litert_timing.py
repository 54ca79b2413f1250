"""LiteRT interpreters and their timing: `make_interpreter`, `random_inputs` and
`measure_interleaved` (invoke latencies of several models, round-robin)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from ai_edge_litert.interpreter import Interpreter, OpResolverType


def _check_threads(threads: int) -> None:
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int. Received: threads={threads!r}")


def make_interpreter(
    model: str | os.PathLike | bytes, *, threads: int = 1, xnnpack: bool = True
) -> Interpreter:
    """An allocated ``ai_edge_litert`` interpreter for a file path or flatbuffer bytes.

    ``xnnpack=False`` uses ``OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES`` (the
    plain TFLite kernels); ``True`` the default resolver, which applies XNNPACK.
    """
    _check_threads(threads)
    resolver = OpResolverType.AUTO if xnnpack else (
        OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    kwargs: dict[str, Any] = {
        "num_threads": threads,
        "experimental_op_resolver_type": resolver,
    }
    if isinstance(model, bytes | bytearray):
        interpreter = Interpreter(model_content=bytes(model), **kwargs)
    else:
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"TFLite model not found: {path!r}")
        interpreter = Interpreter(model_path=path, **kwargs)
    interpreter.allocate_tensors()
    return interpreter


def random_inputs(interpreter: Interpreter, seed: int = 0) -> list[np.ndarray]:
    """Random valid values for every input: floats in [0, 1), integers over their range.

    Quantized (int8 / uint8 / int16) inputs get uniformly random integers of their
    type, which are all valid quantized values; booleans random bits.
    """
    rng = np.random.default_rng(seed)
    feeds = []
    for detail in interpreter.get_input_details():
        shape = [int(d) for d in detail["shape"]]
        dtype = np.dtype(detail["dtype"])
        if np.issubdtype(dtype, np.floating):
            feeds.append(rng.random(shape, dtype=np.float32).astype(dtype))
        elif dtype == np.bool_:
            feeds.append(rng.integers(0, 2, shape).astype(bool))
        elif np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            low, high = max(info.min, -(2**15)), min(info.max, 2**15 - 1)
            feeds.append(rng.integers(low, high, shape, endpoint=True).astype(dtype))
        else:
            raise ValueError(
                f"Cannot make random values for input {detail['name']!r} of type {dtype}; "
                "benchmark a model with float or integer inputs."
            )
    return feeds


def _set_inputs(interpreter: Interpreter, feeds: Sequence[np.ndarray]) -> None:
    for detail, feed in zip(interpreter.get_input_details(), feeds, strict=True):
        interpreter.set_tensor(detail["index"], feed)


class Samples(NamedTuple):
    """Timed invokes of one model: wall-clock and calling-thread CPU time, in ms."""

    wall_ms: list[float]
    cpu_ms: list[float]


def _time_invokes(interpreter: Interpreter, count: int) -> Samples:
    wall, cpu = [], []
    invoke = interpreter.invoke
    clock, thread_clock = time.perf_counter_ns, time.thread_time_ns
    for _ in range(count):
        start, start_cpu = clock(), thread_clock()
        invoke()
        end_cpu, end = thread_clock(), clock()
        wall.append((end - start) / 1e6)
        cpu.append((end_cpu - start_cpu) / 1e6)
    return Samples(wall, cpu)


def _check_counts(runs: int, warmup: int, rounds: int = 1) -> None:
    for label, value, low in (("runs", runs, 1), ("warmup", warmup, 0), ("rounds", rounds, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(
                f"{label} must be an int >= {low}. Received: {label}={value!r}"
            )


def measure_interleaved(
    interpreters: Mapping[Any, Interpreter],
    *,
    runs: int,
    warmup: int,
    rounds: int = 5,
    seed: int = 0,
) -> dict[Any, Samples]:
    """Invoke latencies (ms) of several models, measured round-robin.

    Each model gets `warmup` untimed runs, then `rounds` rounds in which every
    model in turn runs a block of about ``runs / rounds`` timed invokes, so that a
    slow phase of a shared machine hits all models alike. Returns `runs` samples
    per key: wall-clock time and the CPU time of the calling thread (with 1
    interpreter thread, XNNPACK and the TFLite kernels run in the calling thread, so
    its CPU time is the latency the model would have on an idle core: it leaves
    out the time the thread waited while other processes ran).
    """
    _check_counts(runs, warmup, rounds)
    rounds = min(rounds, runs)
    for index, interpreter in enumerate(interpreters.values()):
        _set_inputs(interpreter, random_inputs(interpreter, seed + index))
        _time_invokes(interpreter, warmup)
    blocks = [runs // rounds + (1 if r < runs % rounds else 0) for r in range(rounds)]
    samples: dict[Any, Samples] = {key: Samples([], []) for key in interpreters}
    for block in blocks:
        for key, interpreter in interpreters.items():
            timed = _time_invokes(interpreter, block)
            samples[key].wall_ms.extend(timed.wall_ms)
            samples[key].cpu_ms.extend(timed.cpu_ms)
    return samples
