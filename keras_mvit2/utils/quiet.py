"""Keeping TensorFlow's start-up chatter and library progress output off the user's terminal.

TensorFlow 2.21 (and LiteRT's interpreter) log a few INFO lines from C++ when they load
(oneDNN is on, no CUDA driver found, CPU instructions), before absl's logging starts, so
`TF_CPP_MIN_LOG_LEVEL` does not filter them. `native_info_held_back` captures what native
code writes to the stderr file descriptor in a block and writes back everything except
those INFO entries: warnings and errors still reach the user.

`quiet_libraries` and `native_chatter_filtered` are what the `mvit2` command line applies
unless `--verbose`: TensorFlow's, absl's and coremltools' Python loggers at ERROR,
coremltools' progress bars off, Keras' warning about the structure of model inputs (about
our own graphs, never the user's data) muted, and native INFO/WARNING lines, the CUDA
probe's error on a machine without a GPU and the converter's debug prints filtered out of
stderr as they come. Everything else on stderr (our warnings, errors) passes unchanged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator

# An absl/TF log entry: severity letter, MMDD, time ... ; continuation lines follow it.
_ENTRY = re.compile(r"^(?:[IWEF]\d{4} |WARNING: All log messages before absl::InitializeLog)")
# Held back at import: INFO entries and absl's banner.
_STARTUP_INFO = re.compile(r"^(?:I\d{4} |WARNING: All log messages before absl::InitializeLog)")
# Dropped by the CLI unless --verbose: native INFO/WARNING entries, the CUDA probe's error,
# the TFLite converter's and delegate's prints.
_CHATTER = re.compile(
    r"^(?:[IW]\d{4} |E\d{4} .*(?:cuInit|cuda_|CUDA)|WARNING: All log messages before absl"
    r"|fully_quantize: |INFO: Created TensorFlow Lite)"
)


class _EntryFilter:
    """Drops the log entries that `pattern` matches, with their continuation lines."""

    def __init__(self, pattern: re.Pattern):
        self.pattern, self.dropping = pattern, False

    def keep(self, line: str) -> bool:
        if _ENTRY.match(line) or self.pattern.match(line):
            self.dropping = bool(self.pattern.match(line))
        return not self.dropping


def drop_entries(text: str, pattern: re.Pattern = _STARTUP_INFO) -> str:
    """`text` without the log entries `pattern` matches (default: native INFO lines)."""
    entries = _EntryFilter(pattern)
    return "".join(line for line in text.splitlines(keepends=True) if entries.keep(line))


def _stderr_fd() -> int | None:
    """The file descriptor of the process's stderr; None without a real one (some notebook
    hosts)."""
    try:
        return sys.__stderr__.fileno() if sys.__stderr__ else 2
    except (AttributeError, OSError, ValueError):
        return None


def _flush(*streams) -> None:
    for stream in streams:
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()


@contextlib.contextmanager
def native_info_held_back() -> Iterator[None]:
    """Captures file descriptor 2 in the block; writes it back without native INFO lines."""
    stderr_fd = _stderr_fd()
    if stderr_fd is None:
        yield
        return
    _flush(sys.stderr, sys.__stderr__)
    saved = os.dup(stderr_fd)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), stderr_fd)
        try:
            yield
        finally:
            _flush(sys.stderr)
            os.dup2(saved, stderr_fd)
            os.close(saved)
            captured.seek(0)
            rest = drop_entries(captured.read().decode("utf-8", errors="replace"))
            if rest:
                sys.stderr.write(rest)
                sys.stderr.flush()


@contextlib.contextmanager
def native_chatter_filtered() -> Iterator[None]:
    """Routes file descriptor 2 through a line filter that drops `_CHATTER` entries."""
    stderr_fd = _stderr_fd()
    if stderr_fd is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(stderr_fd)
    read_end, write_end = os.pipe()
    os.dup2(write_end, stderr_fd)
    os.close(write_end)

    def pump() -> None:
        entries = _EntryFilter(_CHATTER)
        with os.fdopen(read_end, "rb") as pipe:
            for raw in pipe:
                if entries.keep(raw.decode("utf-8", errors="replace")):
                    os.write(saved, raw)

    thread = threading.Thread(target=pump, name="mvit2-stderr-filter", daemon=True)
    thread.start()
    try:
        yield
    finally:
        _flush(sys.stderr)
        os.dup2(saved, stderr_fd)  # closes the pipe's last write end: the pump ends
        thread.join(timeout=5)
        os.close(saved)


def quiet_libraries() -> None:
    """Mutes TensorFlow's, absl's, coremltools' and huggingface_hub's chatter (its retry
    warnings) for the rest of the process."""
    for name in ("tensorflow", "absl", "coremltools", "h5py", "matplotlib", "huggingface_hub"):
        logging.getLogger(name).setLevel(logging.ERROR)
    with contextlib.suppress(ImportError):
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    # coremltools draws its conversion passes with tqdm, which reads this at each bar.
    os.environ["TQDM_DISABLE"] = "1"
    # huggingface_hub sets its logger's level when first imported (after this, maybe).
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")
    warnings.filterwarnings("ignore", message=r"The structure of `inputs` doesn't match")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
