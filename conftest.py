"""Test tiers (the KerasHub way), the fast tier's time limit, and its processes.

`python -m pytest` runs the fast tier: every test not marked `slow`. The slow tier (training,
the notebooks, the PyTorch oracle / TFMOT worker / MediaPipe client subprocesses, wheel
builds, many conversions) runs with `--run-slow` (both tiers) or `--run-slow -m slow` (only
it); `.ci/run` runs both, in parallel (`-n 2`, pytest-xdist).

A run given no paths (the `testpaths`: `python -m pytest -q`, the README's command) uses
every core, at most `MAX_AUTO_WORKERS`, when pytest-xdist is installed (the `test` extra):
the `mvit2_workers` setting of pyproject.toml (`auto`) becomes `-n N --dist loadfile`, so a
module's tests and module fixtures stay in one process (the run-wide fixtures are made
once in all, `tests/shared_fixtures.py`). `-n N` or `--dist` on the command line, `-p
no:xdist`, `--pdb`, a run of named files or folders, and a machine with one core run as
given (one process unless `-n`).

Long-lived objects are moved out of the garbage collector's sight (`gc.freeze`) once
collection has imported the stack, and again after each module's teardown, when that
module's fixtures and Keras state are freed. coremltools runs a full `gc.collect()` three
to four times per conversion and Keras' `clear_session` once, and a full collection walks
every live object (about a million after the imports alone): `tests/test_coreml_package_weights.py`
with `--run-slow` spent 20.9 of its 87.7 s in the collector, 8.8 of 74.8 s with the freeze
(one process). Frozen objects are still freed when their last reference goes; only a
reference cycle among them would outlive its module.

A fast test whose setup + call take longer than `--fast-limit` seconds (default 15,
`MVIT2_FAST_LIMIT` in the environment) fails and is named; the limit is the reference
machine's (2 AMD EPYC cores, alone) and is scaled up by how much slower this machine is
(`_slowness`: a fixed piece of work timed when a test is over the limit) or by its load
when it is busier than its cores, whichever is larger, so the fast tier stays fast as the
project grows: make it faster, or mark it `@pytest.mark.slow`. The setup of session-scoped
fixtures (the run-wide ones, and `ct`'s import of coremltools) is not counted: it is paid
once per process by whichever test asks first, and is shared by every later one.
"""

import gc
import json
import os
import platform
import time

import pytest

# TensorFlow's oneDNN kernels in every test process (and the subprocesses the tests start),
# set before anything imports TensorFlow. TensorFlow turns them on by itself only on x86
# CPUs with AVX-512 VNNI / BF16 or AMX; without them (an AVX2-only EPYC, as CI hosts can
# be) its CPU Conv2D runs only NHWC, and the Core ML channels-first traces
# (`keras_mvit2.export.coreml.layout`: NCHW 1x1 convolutions, which coremltools converts
# and never runs) could not be checked against Keras there. With oneDNN every x86 host runs
# them, and the suite sees the same kernels on every host. A value in the environment wins
# (`TF_ENABLE_ONEDNN_OPTS=0 python -m pytest`: Eigen's kernels; the NCHW tests then fail).
if platform.machine() in ("x86_64", "AMD64"):
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

SLOW = "slow"
DEFAULT_FAST_LIMIT_S = 15.0
#: The most pytest-xdist workers `mvit2_workers = auto` starts (each imports TensorFlow).
MAX_AUTO_WORKERS = 4
_SETUP_SECONDS = pytest.StashKey[float]()
#: Seconds spent setting up session-scoped fixtures during the current test's setup.
_SESSION_SETUP_SECONDS = pytest.StashKey[float]()
_IN_SESSION_SETUP = pytest.StashKey[bool]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("keras_mvit2", "keras_mvit2 test tiers")
    group.addoption(
        "--run-slow", action="store_true", default=False,
        help="also run the slow tier (tests marked slow, and the notebooks); "
             "add -m slow for the slow tier alone",
    )
    group.addoption(
        "--fast-limit", type=float,
        default=float(os.environ.get("MVIT2_FAST_LIMIT", DEFAULT_FAST_LIMIT_S)),
        help="seconds (setup + call) a fast-tier test may take before it fails; 0: no limit "
             f"(default {DEFAULT_FAST_LIMIT_S:g}, or MVIT2_FAST_LIMIT)",
    )
    parser.addini(
        "mvit2_workers", default="1",
        help="pytest-xdist workers of a run given no paths: 'auto' (the machine's cores, at "
             f"most {MAX_AUTO_WORKERS}) or a number; 1: one process. -n on the command line "
             "wins.",
    )


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_workers(config: pytest.Config) -> int:
    """The pytest-xdist workers this run gets without `-n` (see the module docstring): 0
    when it runs in one process."""
    if (not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput")
            or config.option.numprocesses is not None or config.option.dist != "no"
            or config.option.usepdb or config.option.collectonly
            or config.args_source != pytest.Config.ArgsSource.TESTPATHS):
        return 0
    value = str(config.getini("mvit2_workers")).strip().lower()
    try:
        workers = min(_cores(), MAX_AUTO_WORKERS) if value == "auto" else int(value)
    except ValueError:
        raise pytest.UsageError(
            f"mvit2_workers must be 'auto' or a number of processes. Received: {value!r}"
        ) from None
    return workers if workers > 1 else 0


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """`python -m pytest` on a machine with several cores: `-n N --dist loadfile` (before
    pytest-xdist reads them)."""
    workers = default_workers(config)
    if workers:
        config.option.numprocesses = workers
        config.option.dist = "loadfile"
    if getattr(config.option, "dist", None) == "loadfile" and _orders_longest_first(config):
        # pytest-xdist would otherwise hand out the modules by their number of tests.
        config.option.loadscopereorder = False


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{SLOW}: the slow tier (trains, runs a notebook or a subprocess, builds a wheel, "
        "converts many files, or takes over ~10 s); runs with --run-slow",
    )


def _is_slow(item: pytest.Item) -> bool:
    return item.get_closest_marker(SLOW) is not None


#: Each module's seconds under `.ci/run`'s pytest command, as `benchmarks/test_durations.py`
#: last measured them (`python benchmarks/test_durations.py` rewrites the file).
DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "benchmarks", "results",
                         "test_durations.json")


def _measured_seconds(path: str = DURATIONS) -> dict[str, float]:
    """The seconds of each module (``tests/test_x.py``, a notebook) in the report at `path`;
    none where there is no report."""
    try:
        with open(path) as f:
            return {row["module"]: float(row["seconds"]) for row in json.load(f)["modules"]}
    except FileNotFoundError:
        return {}


def _orders_longest_first(config: pytest.Config) -> bool:
    """Whether the run takes the slow tier, whose modules come longest first."""
    return bool(config.getoption("--run-slow")
                or SLOW in (config.getoption("markexpr", "") or ""))


def _longest_modules_first(items: list[pytest.Item], seconds: dict[str, float]) -> None:
    """Reorders `items` (stable) by their module's measured `seconds`, longest first, each
    module whole; modules not measured (new ones) last. pytest-xdist hands out a module at a
    time (--dist loadfile): longest first, no process ends alone on a long module."""
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0.0))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.suffix == ".ipynb":  # nbmake: every notebook executes end to end
            item.add_marker(SLOW)
    if _orders_longest_first(config):
        _longest_modules_first(items, _measured_seconds())
        return
    fast = [item for item in items if not _is_slow(item)]
    if len(fast) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if _is_slow(item)])
        items[:] = fast


def _freeze_survivors() -> None:
    """Collects what is garbage now, then freezes what survives (see the module doc)."""
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session: pytest.Session) -> None:
    _freeze_survivors()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test of a file (its module fixtures finalized): `_freeze_survivors`."""
    if nextitem is None or nextitem.path != item.path:
        _freeze_survivors()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.config.stash[_SESSION_SETUP_SECONDS] = 0.0


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
    """Times the outermost session-scoped fixture setups (`_SESSION_SETUP_SECONDS`)."""
    stash = request.config.stash
    if fixturedef.scope != "session" or stash.get(_IN_SESSION_SETUP, False):
        return (yield)
    stash[_IN_SESSION_SETUP] = True
    start = time.perf_counter()
    try:
        return (yield)
    finally:
        stash[_IN_SESSION_SETUP] = False
        stash[_SESSION_SETUP_SECONDS] = (stash.get(_SESSION_SETUP_SECONDS, 0.0)
                                         + time.perf_counter() - start)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.when == "setup":
        shared = item.config.stash.get(_SESSION_SETUP_SECONDS, 0.0)
        item.stash[_SETUP_SECONDS] = max(0.0, report.duration - shared)
    limit = item.config.getoption("--fast-limit")
    if report.when != "call" or not report.passed or not limit or _is_slow(item):
        return report
    setup = item.stash.get(_SETUP_SECONDS, 0.0)
    took = setup + report.duration
    if took <= limit:
        return report
    # One factor, not their product: the timed work shares the cores with the load, so its
    # time already holds what the load average says (the load alone covers a moment when
    # the work happened to find a core free).
    load, slowness = _load_factor(), _slowness()
    factor, why = max((load, "the machine's load"), (slowness, "the machine's speed"))
    if took > limit * factor:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} took {took:.1f} s (setup {setup:.1f} s without "
            f"session fixtures, call {report.duration:.1f} s), over the fast tier's limit of "
            f"{limit:g} s"
            + (f" x {factor:.1f} ({why})" if factor > 1 else "")
            + ": make it faster, share an expensive fixture, or mark it @pytest.mark.slow"
        )
    return report


#: Seconds `_reference_work` takes on the machine the limit is set for (the best of 10 on
#: 2 AMD EPYC cores, nothing else running).
REFERENCE_WORK_S = 0.22


def _reference_work() -> float:
    """Seconds a fixed piece of work takes: a Python loop and vectorized float32 maths."""
    import numpy as np

    values = np.linspace(0.0, 1.0, 1_000_000, dtype=np.float32)
    start = time.perf_counter()
    sum(i * i for i in range(1_000_000))
    for _ in range(20):
        values = np.exp(-values)
    return time.perf_counter() - start


def _slowness() -> float:
    """How many times slower than the reference machine this one is now (at least 1): the
    best of 5 runs of `_reference_work`, timed when a test is over the limit, so a slower
    CPU (or one shared with other machines) gets a proportionally longer limit."""
    return max(1.0, min(_reference_work() for _ in range(5)) / REFERENCE_WORK_S)


def _load_factor() -> float:
    """How many times busier than its cores the machine is (the 1-minute load average per
    core, at least 1): the limit is for a machine that runs the tests alone, and a test run
    beside another job (or in more pytest-xdist workers than cores) waits for the cores."""
    try:
        return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    except OSError:  # no load average on this system
        return 1.0
