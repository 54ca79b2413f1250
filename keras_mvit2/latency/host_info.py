"""The ``device`` and ``runtime`` entries of a host record (this machine, its LiteRT) and
the record's timestamp."""

from __future__ import annotations

import datetime
import os
import platform
import socket
from typing import Any


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_device() -> dict[str, Any]:
    """The `device` entry of a host record: name, platform, machine, os, cpu, cores."""
    return {
        "name": socket.gethostname(),
        "platform": "host",
        "machine": platform.machine(),
        "os": platform.platform(),
        "cpu": _cpu_model(),
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
