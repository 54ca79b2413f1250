"""The ``device`` and ``runtime`` entries of a host record (this machine, its LiteRT) and
the record's timestamp."""

from __future__ import annotations

import datetime
import os
import platform
import socket
from typing import Any

#: CPU flags that decide which kernels XNNPACK picks (x86 `flags`, Arm `Features`).
KERNEL_FLAGS = ("sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw",
                "avx512dq", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16",
                "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16", "asimd", "asimddp",
                "i8mm", "bf16", "fphp", "sve", "sve2")


def cpu_features(path: str = "/proc/cpuinfo") -> dict[str, Any]:
    """The CPU model and which of `KERNEL_FLAGS` it has (read from `path`):
    ``{"model", "flags", "flags_checked", "source"}``."""
    model, flags = None, set()
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "hardware", "cpu model") and model is None:
                    model = value.strip()
                elif key in ("flags", "features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return {"model": model or platform.processor() or platform.machine(),
            "flags": [f for f in KERNEL_FLAGS if f in flags],
            "flags_checked": list(KERNEL_FLAGS), "source": path}


def host_device() -> dict[str, Any]:
    """The `device` entry of a host record: name, platform, machine, os, cpu (its model),
    cpu_flags (those of `KERNEL_FLAGS` it has), cores."""
    cpu = cpu_features()
    return {
        "name": socket.gethostname(),
        "platform": "host",
        "machine": platform.machine(),
        "os": platform.platform(),
        "cpu": cpu["model"],
        "cpu_flags": cpu["flags"],
        "cores": os.cpu_count(),
        "python": platform.python_version(),
    }


def _litert_version() -> str:
    try:
        from importlib.metadata import version

        return version("ai-edge-litert")
    except Exception:  # pragma: no cover - metadata missing
        return "unknown"


def litert_runtime(threads: int, xnnpack: bool) -> dict[str, Any]:
    """The `runtime` entry of a host LiteRT record."""
    return {
        "name": "litert",
        "version": _litert_version(),
        "threads": threads,
        "delegate": "xnnpack" if xnnpack else "none",
        "batch_size": 1,
    }


def _timestamp() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
