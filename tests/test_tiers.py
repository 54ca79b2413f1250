"""The test tiers of conftest.py, and the processes a run given no paths gets (one
pytest-xdist worker per core, `--dist loadfile`), run in pytest's own `pytester` on tiny
suites."""

import importlib.util
import json
import os

import pytest

pytest_plugins = ["pytester"]

ROOT_CONFTEST = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "conftest.py")

SUITE = """
import time
import pytest

def test_fast():
    pass

@pytest.mark.slow
def test_slow():
    time.sleep(0.2)

def test_fast_but_sleeps():
    time.sleep(1.0)
"""


@pytest.fixture
def suite(pytester):
    with open(ROOT_CONFTEST) as f:
        pytester.makeconftest(f.read())
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def test_default_run_is_the_fast_tier(suite):
    result = suite.runpytest("-p", "no:cacheprovider", "-k", "not sleeps")
    result.assert_outcomes(passed=1, deselected=2)


def test_run_slow_adds_the_slow_tier_and_m_slow_selects_it(suite):
    suite.runpytest("-p", "no:cacheprovider", "--run-slow", "-k", "not sleeps").assert_outcomes(
        passed=2, deselected=1)
    suite.runpytest("-p", "no:cacheprovider", "--run-slow", "-m", "slow").assert_outcomes(
        passed=1, deselected=2)


def test_a_fast_test_over_the_limit_fails_and_is_named(suite):
    result = suite.runpytest("-p", "no:cacheprovider", "--run-slow", "--fast-limit", "0.1")
    # test_slow sleeps too, but the limit is the fast tier's.
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        ["*test_suite.py::test_fast_but_sleeps took 1.0 s*over the fast tier's limit of 0.1 s*"])
    suite.runpytest("-p", "no:cacheprovider", "--fast-limit", "0").assert_outcomes(
        passed=2, deselected=1)


def _root_conftest_module():
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT_CONFTEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_slower_machine_gets_a_proportionally_longer_limit(pytester, monkeypatch):
    # The reference machine made 20 times faster than this one, whatever this one's speed
    # (the fixed work timed here): the 1 s test fits the 0.1 s limit x its measured slowness
    # (about 20), and fails it against a reference machine slower than this one.
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    with open(ROOT_CONFTEST) as f:
        conftest = f.read()
    reference = "REFERENCE_WORK_S = "
    value = float(conftest.split(reference, 1)[1].split("\n", 1)[0])
    here = min(_root_conftest_module()._reference_work() for _ in range(5))
    pytester.makepyfile(test_suite=SUITE)
    faster = conftest.replace(f"{reference}{value!r}", f"{reference}{here / 20!r}")
    assert faster != conftest
    pytester.makeconftest(faster)
    pytester.runpytest("-p", "no:cacheprovider", "--fast-limit", "0.1").assert_outcomes(
        passed=2, deselected=1)
    slower = conftest.replace(f"{reference}{value!r}", f"{reference}{here * 1000!r}")
    pytester.makeconftest(slower)
    result = pytester.runpytest("-p", "no:cacheprovider", "--fast-limit", "0.1")
    result.assert_outcomes(passed=1, failed=1, deselected=1)
    assert "machine's speed" not in result.stdout.str()  # never below the reference limit


SHARED = """
import time
import pytest

@pytest.fixture(scope="session")
def shared():
    time.sleep(1.0)

@pytest.fixture(scope="module")
def per_module():
    time.sleep(1.0)

def test_asks_for_the_session_fixture(shared):
    pass

def test_asks_for_the_module_fixture(per_module):
    pass
"""


def test_the_limit_counts_module_fixtures_not_session_ones(pytester, monkeypatch):
    # An idle machine's limit (the load factor is 1): beside other work the scaled limit
    # would let the 1 s module fixture pass too.
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    with open(ROOT_CONFTEST) as f:
        pytester.makeconftest(f.read())
    pytester.makepyfile(test_shared=SHARED)
    result = pytester.runpytest("-p", "no:cacheprovider", "--fast-limit", "0.5")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*test_asks_for_the_module_fixture took 1.0 s (setup 1.0 s*over the fast tier's*"])


WHERE = """
import os

def _record(name):
    folder = os.environ["WHERE_DIR"]
    with open(os.path.join(folder, name), "w") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "main"))

def test_{0}_one():
    _record("{0}_one")

def test_{0}_two():
    _record("{0}_two")
"""


def _where(pytester, monkeypatch, *args, subprocess=False):
    """Runs the two-module suite of WHERE; returns ({test: process}, result)."""
    folder = pytester.path / "where"
    folder.mkdir(exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    monkeypatch.setenv("WHERE_DIR", str(folder))
    # this very test may run in a pytest-xdist worker: the inner run is not one
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    run = pytester.runpytest_subprocess if subprocess else pytester.runpytest
    result = run("-p", "no:cacheprovider", *args)
    return {p.name: p.read_text() for p in folder.iterdir()}, result


@pytest.fixture
def where_suite(pytester):
    with open(ROOT_CONFTEST) as f:
        pytester.makeconftest(f.read())
    pytester.makepyfile(test_a=WHERE.format("a"), test_b=WHERE.format("b"))
    pytester.makeini("[pytest]\ntestpaths = .\nmvit2_workers = 2\n")
    return pytester


def test_a_run_given_no_paths_uses_two_workers_and_keeps_each_module_in_one(where_suite,
                                                                            monkeypatch):
    pytest.importorskip("xdist")
    ran, result = _where(where_suite, monkeypatch, subprocess=True)
    result.assert_outcomes(passed=4)
    assert sorted(ran) == ["a_one", "a_two", "b_one", "b_two"], ran
    assert set(ran.values()) <= {"gw0", "gw1"}, ran  # pytest-xdist workers, not the main one
    assert ran["a_one"] == ran["a_two"] and ran["b_one"] == ran["b_two"]  # --dist loadfile
    result.stdout.fnmatch_lines(["*2 workers*"])


def test_named_paths_minus_n_and_no_xdist_run_as_given(where_suite, monkeypatch):
    pytest.importorskip("xdist")  # without it every run is one process anyway
    for args in (["test_a.py", "test_b.py"], ["-n", "0"], ["-p", "no:xdist"]):
        ran, result = _where(where_suite, monkeypatch, *args)
        result.assert_outcomes(passed=4)
        assert set(ran.values()) == {"main"}, (args, ran)
    where_suite.makeini("[pytest]\ntestpaths = .\nmvit2_workers = many\n")
    _, result = _where(where_suite, monkeypatch)
    result.stderr.fnmatch_lines(["*mvit2_workers must be 'auto' or a number*'many'*"])


# --------------------------------------------------------------------------------------
# The modules handed out first are the measured longest (benchmarks/test_durations.py)
# --------------------------------------------------------------------------------------

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">
<testsuite name="pytest" errors="0" failures="1" skipped="1" tests="4" time="30.5"
 timestamp="2026-12-03T01:00:00+00:00" hostname="vm">
<testcase classname="tests.test_a" name="test_one" file="tests/test_a.py" time="12.25" />
<testcase classname="tests.test_b" name="test_two" file="tests/test_b.py" time="20.0" />
<testcase classname="tests.test_a" name="test_three" file="tests/test_a.py" time="9.5" />
<testcase classname="notebooks.01" name="01.ipynb" file="notebooks/01.ipynb" time="1.0" />
</testsuite></testsuites>"""


ORDER = """
import os

def _record(name):
    with open(os.environ["ORDER_FILE"], "a") as f:
        f.write(name + "\\n")

{tests}
"""


@pytest.mark.slow  # a pytest-xdist run in a subprocess
def test_pytest_xdist_hands_out_the_measured_longest_module_first(pytester, monkeypatch):
    """pytest-xdist's --dist loadfile would hand out the module with the most tests first
    (its `--loadscope-reorder`, on by default): with the slow tier, the measured longest
    comes first. One worker runs the modules in the order they are handed out."""
    pytest.importorskip("xdist")
    with open(ROOT_CONFTEST) as f:
        pytester.makeconftest(f.read())
    tests = "\n".join(f"def test_{i}():\n    _record('{{0}}_{i}')\n" for i in range(3))
    pytester.makepyfile(test_many=ORDER.format(tests=tests).format("many"),
                        test_long=ORDER.format(tests=tests.split("\n\n")[0]).format("long"))
    results = pytester.path / "benchmarks" / "results"
    results.mkdir(parents=True)
    (results / "test_durations.json").write_text(json.dumps({"modules": [
        {"module": "test_long.py", "tests": 1, "seconds": 100.0},
        {"module": "test_many.py", "tests": 3, "seconds": 1.0}]}))
    order = pytester.path / "order.txt"
    monkeypatch.setenv("ORDER_FILE", str(order))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--run-slow", "-n", "1",
                                           "--dist", "loadfile")
    result.assert_outcomes(passed=4)
    assert order.read_text().split() == ["long_0", "many_0", "many_1", "many_2"]


def test_durations_sums_each_modules_tests_from_the_junit_report(tmp_path):
    from benchmark_scripts import load_benchmark

    durations = load_benchmark("test_durations")
    (tmp_path / "junit.xml").write_text(JUNIT)
    assert durations.main(["--junit", str(tmp_path / "junit.xml"), "--top", "2",
                           "--out", str(tmp_path)]) == 0
    with open(tmp_path / "test_durations.json") as f:
        report = json.load(f)
    assert report["modules"] == [
        {"module": "tests/test_a.py", "tests": 2, "seconds": 21.8},  # 12.25 + 9.5
        {"module": "tests/test_b.py", "tests": 1, "seconds": 20.0},
        {"module": "notebooks/01.ipynb", "tests": 1, "seconds": 1.0}]
    assert [t["name"] for t in report["slowest"]] == ["test_two", "test_one"]
    assert report["wall_seconds"] == 30.5
    assert report["counts"] == {"tests": 4, "failures": 1, "errors": 0, "skipped": 1}
    assert "| tests/test_a.py | 2 | 22 |" in (tmp_path / "test_durations.md").read_text()
    with pytest.raises(SystemExit):  # argparse's error: names the file and how to make it
        durations.main(["--junit", str(tmp_path / "missing.xml"), "--out", str(tmp_path)])


def test_durations_count_an_inherited_library_method_in_the_module_that_collected_it(tmp_path):
    """`tf.test.TestCase` (under Keras' and KerasHub's harnesses) brings `test_session`, which
    pytest collects in our module but JUnit files under TensorFlow's `test_util.py`, a path
    relative to wherever the run happened."""
    from benchmark_scripts import load_benchmark

    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_harness.py").write_text("")
    (tmp_path / "junit.xml").write_text(
        '<testsuites><testsuite tests="2" time="3.0">'
        '<testcase classname="tests.test_harness.LayerTest" name="test_session" time="0.5" '
        'file="../../site-packages/tensorflow/python/framework/test_util.py" />'
        '<testcase classname="tests.test_harness.LayerTest" name="test_layer" time="2.5" '
        'file="tests/test_harness.py" /></testsuite></testsuites>')
    run = load_benchmark("test_durations").read_junit(str(tmp_path / "junit.xml"),
                                                       repo=str(tmp_path))
    assert [t["module"] for t in run["tests"]] == ["tests/test_harness.py"] * 2


def test_modules_are_collected_longest_first_as_measured(tmp_path):
    """With --run-slow the modules come in the order of their seconds in the durations
    report, longest first, each whole; a module the report does not name comes last."""
    from types import SimpleNamespace

    root = _root_conftest_module()
    report = tmp_path / "test_durations.json"
    report.write_text(json.dumps({"modules": [
        {"module": "tests/test_b.py", "tests": 1, "seconds": 30.0},
        {"module": "notebooks/01.ipynb", "tests": 1, "seconds": 20.0},
        {"module": "tests/test_a.py", "tests": 2, "seconds": 10.0}]}))
    seconds = root._measured_seconds(str(report))
    assert seconds == {"tests/test_b.py": 30.0, "notebooks/01.ipynb": 20.0,
                       "tests/test_a.py": 10.0}
    items = [SimpleNamespace(nodeid=n) for n in (
        "tests/test_a.py::test_one", "tests/test_a.py::test_two", "tests/test_new.py::test_x",
        "notebooks/01.ipynb::01.ipynb", "tests/test_b.py::test_y")]
    root._longest_modules_first(items, seconds)
    assert [item.nodeid for item in items] == [
        "tests/test_b.py::test_y", "notebooks/01.ipynb::01.ipynb", "tests/test_a.py::test_one",
        "tests/test_a.py::test_two", "tests/test_new.py::test_x"]
    assert root._measured_seconds(str(tmp_path / "missing.json")) == {}
    # The committed report names the suite's modules (a removed module: measure again).
    committed = root._measured_seconds()
    folder = os.path.dirname(ROOT_CONFTEST)
    assert len(committed) > 50
    for module in committed:
        assert os.path.exists(os.path.join(folder, module)), module
