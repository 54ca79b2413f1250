"""The backend seam (`keras_mvit2.backend`): the variants table, the backend read as Keras
reads it, and the one child-process runner (job file, streamed lines, result, errors)."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import pytest

from keras_mvit2 import backend
from keras_mvit2.backend.child import run_child

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name, pipeline, step", [
    ("tensorflow", "tf.data", "tensorflow"),
    ("jax", "tf.data", "keras"),
    ("torch", "py", "keras"),
])
def test_each_backend_gets_its_input_and_train_step(name, pipeline, step):
    chosen = backend.variants(name)
    assert (chosen.backend, chosen.input_pipeline, chosen.train_step) == (name, pipeline, step)
    assert chosen.tf_data == (name != "torch")
    assert chosen.tensorflow_train_step == (name == "tensorflow")


def test_this_process_reads_the_backend_keras_runs_on():
    assert backend.keras_backend_name() == keras.backend.backend()
    assert backend.variants().backend == keras.backend.backend()


def _policy_alone(env: dict) -> str:
    """`keras_backend_name()` in a fresh process that loads only `backend/policy.py` (no
    Keras, no keras_mvit2 package): what it answers before Keras is imported."""
    code = ("import importlib.util, sys\n"
            "spec = importlib.util.spec_from_file_location('policy', sys.argv[1])\n"
            "policy = sys.modules['policy'] = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(policy)\n"
            "print(policy.keras_backend_name(), 'keras' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, backend.policy.__file__], env=env,
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


def test_before_keras_is_imported_the_backend_is_read_as_keras_will(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    assert _policy_alone({**env, "KERAS_BACKEND": "jax"}) == "jax False"
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "torch"}))
    assert _policy_alone({**env, "KERAS_HOME": str(tmp_path)}) == "torch False"
    assert _policy_alone({**env, "KERAS_HOME": str(tmp_path / "none")}) == "tensorflow False"


def test_require_tensorflow_names_the_backend_and_the_fix(monkeypatch):
    monkeypatch.setattr(backend.policy, "keras_backend_name", lambda: "jax")
    with pytest.raises(backend.TensorFlowBackendRequiredError) as info:
        backend.require_tensorflow("the thing")
    assert "the thing" in str(info.value) and "'jax'" in str(info.value)
    assert "KERAS_BACKEND=tensorflow" in str(info.value)


CHILD = textwrap.dedent("""
    import importlib.util, json, sys, time

    # `keras_mvit2/backend/child.py` alone (the package would import Keras: a slow start)
    spec = importlib.util.spec_from_file_location("child", {child!r})
    child = sys.modules["child"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(child)
    failure_result, write_result = child.failure_result, child.write_result

    with open(sys.argv[1]) as f:
        job = json.load(f)
    print("line one", flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    if job["do"] == "sleep":
        for _ in range(100):
            print("tick", flush=True)
            time.sleep(0.05)
    if job["do"] == "crash":
        sys.exit(3)
    try:
        if job["do"] == "fail":
            raise FileNotFoundError("no such photo: a.jpg")
        result = {{"ok": True, "echo": job["value"]}}
    except Exception as err:
        result = failure_result(err)
    write_result(job["out"], result)
    sys.exit(0 if result["ok"] else 1)
""")


@pytest.fixture()
def child(tmp_path):
    path = tmp_path / "child.py"
    path.write_text(CHILD.format(child=os.path.join(ROOT, "keras_mvit2", "backend", "child.py")))
    return [sys.executable, "-u", str(path)]


def test_the_child_gets_its_job_and_its_lines_and_result_come_back(child, tmp_path):
    lines = []
    run = run_child(child, {"do": "echo", "value": [1, 2]}, str(tmp_path), result_key="out",
                    on_line=lines.append, merge_stderr=False)
    assert run.ok and not run.failed and run.returncode == 0
    assert run.result == {"ok": True, "echo": [1, 2]}
    assert lines == ["line one"]                     # standard error kept apart
    assert run.tail == "to stderr"
    with open(tmp_path / "job.json") as f:
        assert json.load(f)["out"] == str(tmp_path / "result.json")


def test_the_childs_bad_input_error_is_raised_as_itself(child, tmp_path):
    lines = []
    run = run_child(child, {"do": "fail"}, str(tmp_path), result_key="out",
                    on_line=lines.append)
    assert run.failed and not run.ok and run.returncode == 1
    assert run.result["type"] == "FileNotFoundError"
    assert "Traceback" in run.result["traceback"]
    assert lines == ["line one", "to stderr"]        # merged
    run.raise_passed_on(("ValueError",))             # not one of these: nothing raised
    with pytest.raises(FileNotFoundError, match=r"no such photo: a\.jpg"):
        run.raise_passed_on(("ValueError", "FileNotFoundError"))


def test_a_child_that_dies_or_overruns_has_no_result_and_says_so(child, tmp_path):
    os.makedirs(tmp_path / "a")
    crashed = run_child(child, {"do": "crash"}, str(tmp_path / "a"), result_key="out")
    assert crashed.result is None and crashed.returncode == 3
    assert not crashed.ok and not crashed.failed and not crashed.timed_out
    assert crashed.tail.splitlines() == ["line one", "to stderr"]
    os.makedirs(tmp_path / "b")
    slow = run_child(child, {"do": "sleep"}, str(tmp_path / "b"), result_key="out",
                     timeout=0.5, tail_lines=2)
    assert slow.timed_out and slow.result is None and slow.returncode != 0
    assert slow.tail.splitlines() == ["tick", "tick"]
