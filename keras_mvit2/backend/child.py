"""The one child-process runner: a job in JSON, the output streamed, the errors re-raised.

Two steps run in a process of their own because the parent's process cannot load what they
need: the phone-files export on JAX / PyTorch (`keras_mvit2.ship.export_step`: TensorFlow's
converters, which would crash a PyTorch convolution beside them) and the TFMOT work of
`keras_mvit2.quantize` (`keras_mvit2.quantize._worker_client`: TFMOT flips `tf.keras` to
tf_keras for the whole process). Both talk to their child the same way:

* the parent writes ``job.json`` in a private folder, the job's options and the path of
  the result file under `result_key`, and starts ``argv + [job.json]``;
* the child's output lines are passed to `on_line` as they come (its standard error too,
  or kept in ``stderr.txt`` beside the job);
* the child writes the result file (`write_result`): ``{"ok": true, ...}``, or
  `failure_result`'s ``{"ok": false, "type", "message", "traceback"}``;
* the parent gets a `ChildRun` (the result, the exit status, the last lines of output) and
  raises its own error from it (`ChildRun.raise_passed_on` re-raises the child's bad-input
  errors as themselves).
"""

from __future__ import annotations

import builtins
import collections
import dataclasses
import json
import os
import subprocess
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = ["ChildRun", "failure_result", "run_child", "write_result"]


@dataclasses.dataclass(frozen=True)
class ChildRun:
    """How a child process ended (`run_child`).

    Attributes:
        result: its result file (None: it wrote none, e.g. it crashed or was killed).
        returncode: its exit status.
        tail: the last lines it wrote (its standard error where that was kept apart),
            joined by newlines.
        timed_out: it ran past the time limit and was stopped.
    """

    result: dict[str, Any] | None
    returncode: int
    tail: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        """The child reported success and exited with status 0."""
        return self.result is not None and bool(self.result.get("ok")) and self.returncode == 0

    @property
    def failed(self) -> bool:
        """The child reported an exception (`result` says which)."""
        return self.result is not None and not self.result.get("ok")

    def raise_passed_on(self, names: Iterable[str]) -> None:
        """Re-raises the child's exception as itself when its type is one of the builtin
        exceptions `names` (bad input the child found: the message is the user's)."""
        if self.failed and self.result["type"] in tuple(names):
            raise getattr(builtins, self.result["type"])(self.result["message"])


def run_child(
    argv: Sequence[str],
    job: Mapping[str, Any],
    workdir: str,
    *,
    result_key: str,
    env: Mapping[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
    merge_stderr: bool = True,
    tail_lines: int = 60,
    timeout: float | None = None,
) -> ChildRun:
    """Runs ``argv + [workdir/job.json]`` and waits for it.

    Args:
        argv: the child's command line before the job file (e.g. ``[sys.executable, "-u",
            "-m", "package.module"]``).
        job: the job, written to ``workdir/job.json`` with the result file's path
            (``workdir/result.json``) under `result_key`.
        workdir: a private folder for the job, the result (and ``stderr.txt``).
        result_key: the job's key of the result file's path.
        env: the child's environment (None: this process's).
        on_line: called with each output line (its newline removed) as it comes.
        merge_stderr: the child's standard error goes with its output (else it is kept in
            ``workdir/stderr.txt``, for `ChildRun.tail`).
        tail_lines: how many last lines `ChildRun.tail` keeps.
        timeout: seconds after which the child is stopped (checked as its lines come).

    Returns:
        The `ChildRun`.
    """
    result_path = os.path.join(workdir, "result.json")
    job_path = os.path.join(workdir, "job.json")
    with open(job_path, "w") as f:
        json.dump({**job, result_key: result_path}, f)
    errors_path = os.path.join(workdir, "stderr.txt")
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    start = time.monotonic()
    timed_out = False
    with open(os.devnull if merge_stderr else errors_path, "w") as errors:
        process = subprocess.Popen(
            [*argv, job_path], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else errors, stdin=subprocess.DEVNULL,
            env=None if env is None else dict(env), text=True, errors="replace", bufsize=1)
        try:
            assert process.stdout is not None
            for line in process.stdout:
                line = line.rstrip("\n")
                if merge_stderr:
                    tail.append(line)
                if on_line is not None:
                    on_line(line)
                if timeout is not None and time.monotonic() - start > timeout:
                    timed_out = True
                    process.kill()
                    break
            returncode = process.wait()
        except BaseException:
            process.kill()
            process.wait()
            raise
    if not merge_stderr:
        with open(errors_path, errors="replace") as f:
            tail.extend(line.rstrip("\n") for line in f)
    result = None
    if os.path.exists(result_path):
        with open(result_path) as f:
            result = json.load(f)
    return ChildRun(result, returncode, "\n".join(tail), timed_out)


def failure_result(err: BaseException, traceback_lines: int | None = None) -> dict[str, Any]:
    """The result file of a child whose job raised `err` (call it in the ``except`` block):
    its type, message and traceback (the last `traceback_lines` lines; None: all)."""
    text = traceback.format_exc()
    if traceback_lines is not None:
        text = "".join(text.splitlines(True)[-traceback_lines:])
    return {"ok": False, "type": type(err).__name__, "message": str(err), "traceback": text}


def write_result(path: str, result: Mapping[str, Any],
                 default: Callable[[Any], Any] | None = None) -> None:
    """Writes the child's result file at `path` in one step (a temporary file, renamed):
    the parent reads a whole file or none."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, default=default)
    os.replace(tmp, path)
