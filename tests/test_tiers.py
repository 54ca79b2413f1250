"""The test tiers of conftest.py, run in pytest's own `pytester` on a tiny suite."""

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
