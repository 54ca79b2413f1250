"""Where CI's test time goes: the whole suite as `.ci/run` runs it, timed per module and test.

    python benchmarks/test_durations.py [--junit FILE] [--top 25] [--out benchmarks/results]

Runs `.ci/run`'s pytest command (both tiers, `-n 2 --dist loadfile`) with a JUnit XML
report, or reads the report of such a run (`--junit`), and sums each test's time (setup +
call + teardown, pytest's JUnit default: a module fixture counts in the first test that asks
for it) per module. Two processes share the cores, so the wall time is about half the sum.
With `--run-slow`, `conftest.py` collects the modules in the order of this file's seconds,
longest first (pytest-xdist then hands the long ones out first).

Writes ``test_durations.json`` (the command, the host's CPU and cores, the wall time, the
CPU seconds of the run's processes when this script ran it (their ratio to the wall time
says how many cores the run kept busy: whether more workers could help), the outcome
counts, every module's seconds and test count, the `--top` slowest tests) and
``test_durations.md`` (the tables) to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from datetime import datetime, timezone
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
#: `.ci/run`'s pytest command (less `--durations`; `MVIT2_DIST` unset: the packaging test
#: builds the wheel itself).
COMMAND = ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--run-slow", "-n", "2",
           "--dist", "loadfile"]


def _module_of(case: ET.Element, repo: str) -> str:
    """The test file a `<testcase>` was collected from, relative to `repo`. Its `classname` is
    the dotted node path (`tests.test_a.SomeTest`); its `file` is where the test function is
    defined, which for a method a test class inherits from a library (`tf.test.TestCase`'s
    `test_session`) is the library's file, not the module that collected it."""
    parts = case.get("classname", "").split(".")
    for end in range(len(parts), 0, -1):
        for suffix in (".py", ".ipynb"):
            candidate = "/".join(parts[:end]) + suffix
            if os.path.isfile(os.path.join(repo, candidate)):
                return candidate
    return case.get("file") or "/".join(parts) + ".py"


def read_junit(path: str, repo: str = ROOT) -> dict[str, Any]:
    """The run in the JUnit XML report at `path`: its wall seconds and outcome counts, and
    per test its module (the file it was collected from, relative to `repo`), name and
    seconds."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    if not suites:
        raise ValueError(f"{path} holds no <testsuite>: not a pytest --junitxml report")
    counts = {key: sum(int(s.get(key, 0)) for s in suites)
              for key in ("tests", "failures", "errors", "skipped")}
    tests = []
    for case in root.iter("testcase"):
        tests.append({"module": _module_of(case, repo), "name": case.get("name"),
                      "seconds": float(case.get("time", 0.0))})
    return {"wall_seconds": sum(float(s.get("time", 0.0)) for s in suites),
            "timestamp": suites[0].get("timestamp"), "counts": counts, "tests": tests}


def per_module(tests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`{"module", "tests", "seconds"}` per module, longest first."""
    seconds: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for test in tests:
        seconds[test["module"]] += test["seconds"]
        count[test["module"]] += 1
    rows = [{"module": m, "tests": count[m], "seconds": round(s, 1)} for m, s in seconds.items()]
    return sorted(rows, key=lambda row: (-row["seconds"], row["module"]))


def markdown(report: dict[str, Any]) -> str:
    counts, cpu = report["counts"], report["cpu"]
    total = sum(row["seconds"] for row in report["modules"])
    lines = [
        f"`{' '.join(report['command'])}` on {cpu['model']} ({report['cores']} cores), "
        f"{report['timestamp']}: {counts['tests']} tests, {counts['failures']} failed, "
        f"{counts['errors']} errors, {counts['skipped']} skipped; "
        f"wall {report['wall_seconds']:.0f} s, test time {total:.0f} s in all.",
    ]
    if report.get("cpu_seconds") is not None:  # measured when this script ran the suite
        lines += ["", f"CPU time of the run's processes: {report['cpu_seconds']:.0f} s, "
                  f"{report['cpu_seconds'] / report['wall_seconds']:.2f} of the "
                  f"{report['cores']} cores busy on average."]
    lines += [
        "",
        "| module | tests | seconds | share |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {row['module']} | {row['tests']} | {row['seconds']:.0f} | "
              f"{row['seconds'] / total:.1%} |"
              for row in report["modules"] if row["seconds"] >= 10]
    lines += ["", f"The {len(report['slowest'])} slowest tests (a module fixture counts in the "
              "first test that asks for it):", "", "| test | seconds |", "|---|---:|"]
    lines += [f"| {t['module']}::{t['name']} | {t['seconds']:.1f} |" for t in report["slowest"]]
    return "\n".join(lines) + "\n"


def _children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's finished children and the children they
    waited for (pytest, its xdist workers, their subprocesses)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--junit", help="read this --junitxml report instead of running the suite")
    parser.add_argument("--top", type=int, default=25, help="how many slowest tests to list")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)

    sys.path.insert(0, ROOT)
    from keras_mvit2.latency.host_info import cpu_features
    from keras_mvit2.utils.files import write_json, write_text

    status, cpu_seconds = 0, None
    path = args.junit
    if path is None:
        path = os.path.join(tempfile.mkdtemp(prefix="mvit2_durations_"), "junit.xml")
        env = {k: v for k, v in os.environ.items() if k != "MVIT2_DIST"}
        start, before = time.perf_counter(), _children_cpu_seconds()
        status = subprocess.run([*COMMAND, f"--junitxml={path}"], cwd=ROOT, env=env).returncode
        cpu_seconds = round(_children_cpu_seconds() - before, 1)
        print(f"pytest: exit {status} after {time.perf_counter() - start:.0f} s, "
              f"{cpu_seconds:.0f} s of CPU")
    elif not os.path.exists(path):
        parser.error(f"--junit {path}: no such file (pytest writes it with --junitxml=FILE)")
    run = read_junit(path)
    when = run["timestamp"] or datetime.now(timezone.utc).isoformat()
    report = {"benchmark": "test_durations", "command": COMMAND, "cpu": cpu_features(),
              "cores": os.cpu_count(), "timestamp": when,
              "wall_seconds": run["wall_seconds"], "cpu_seconds": cpu_seconds,
              "counts": run["counts"],
              "modules": per_module(run["tests"]),
              "slowest": sorted(run["tests"], key=lambda t: -t["seconds"])[:args.top]}
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "test_durations.json"), report)
    text = markdown(report)
    write_text(os.path.join(args.out, "test_durations.md"), text)
    print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
