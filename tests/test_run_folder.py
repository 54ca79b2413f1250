"""What `mvit2 train` does with a run folder, and progress that reads well in a log file.

Each case of `keras_mvit2.training.run_folder` through the command line: a new run, a run
killed (SIGKILL) and started again, a finished run, a finished run asked for more epochs
(refused; `--resume` re-plans the learning rate; `output.resume=false` moves the earlier
files aside), each announced by one line before training. Standard output redirected to a
file gets one plain line per epoch (no ANSI codes, no carriage returns), for `train`, the
task trainers and `qat` alike.

The runs train `test_cli_train`'s tiny registered classifier on its tiny PNG folder;
`mvit2` runs in a subprocess (importing `test_cli_train` registers the model there) where
its real standard output, a file, matters, and in this process otherwise.
"""

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
from test_cli_train import TINY, folder  # noqa: F401 (folder: the tiny PNG folder fixture)

from keras_mvit2.cli.main import main
from keras_mvit2.training.run_folder import SchedulePlan, plan_run
from keras_mvit2.training.schedules import ReplannedCosineDecay, WarmupCosineDecay
from keras_mvit2.utils.progress import EpochProgress, progress_verbose

pytestmark = pytest.mark.slow

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS_DIR)
#: `mvit2` with the tiny classifier registered: `python -c MVIT2 TESTS_DIR ARGS...`.
MVIT2 = ("import sys; sys.path.insert(0, sys.argv.pop(1)); import test_cli_train; "
         "from keras_mvit2.cli.main import main; sys.exit(main())")
STEPS = 40
#: A 3-epoch run of 40 steps, with the packaged config's progress output (verbose 1).
RUN = [*TINY, "output.verbose=1", "training.epochs=3", f"training.steps_per_epoch={STEPS}",
       "schedule.warmup_epochs=0.5"]
TIMEOUT_S = 300


def _argv(out, settings=RUN, *extra, data=None):
    sets = [arg for item in settings for arg in ("--set", item)]
    return ["train", "--config", "fashion_mnist", "--data", str(data), "-o", str(out), *sets,
            *extra]


def _start(argv, log):
    """`mvit2 ARGV` in a subprocess, standard output into the file `log` (standard error
    beside it, `log.err`)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    with open(log, "w") as stdout, open(f"{log}.err", "w") as stderr:
        process = subprocess.Popen([sys.executable, "-c", MVIT2, TESTS_DIR, *argv],
                                   stdout=stdout, stderr=stderr, env=env)
    process.log = log
    return process


def _stderr(process):
    with open(f"{process.log}.err") as f:
        return f.read()[-3000:]


def _finish(process):
    try:
        process.wait(timeout=TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, _stderr(process)


def _in_process(argv, capsys):
    """`mvit2 ARGV` here: (exit status, stdout, stderr)."""
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _epochs(stdout):
    return re.findall(r"^Epoch (\d+)/(\d+) - ", stdout, re.M)


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files(run):
    """`{relative path: (size, mtime)}` of everything in a run folder."""
    return {str(p.relative_to(run)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in run.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def finished(folder, tmp_path_factory):  # noqa: F811 (the imported fixture)
    """A finished 3-epoch run, standard output in a file: (run folder, the log's text)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    log = out.parent / "train.log"
    _finish(_start(_argv(out, data=folder), log))
    return out, log.read_text()


@pytest.fixture
def copy(finished, tmp_path):
    """A copy of the finished run to change."""
    run = tmp_path / "run"
    shutil.copytree(finished[0], run)
    return run


# --------------------------------------------------------------------------------------
# The four cases, through the command line
# --------------------------------------------------------------------------------------


def test_a_new_run_says_so_and_its_log_has_one_plain_line_per_epoch(finished):
    out, log = finished
    lines = log.splitlines()
    assert lines[0] == f"Run folder {out}: new run, 3 epoch(s) of {STEPS} steps."
    assert _epochs(log) == [("1", "3"), ("2", "3"), ("3", "3")]
    for line in lines[1:4]:
        assert f" - {STEPS}/{STEPS} - " in line and "loss: " in line and "accuracy: " in line
    # Standard output is a file: no bar redraws, no colours, a few dozen lines in all.
    assert "\x1b" not in log and "\r" not in log and "\b" not in log
    assert len(lines) < 40, len(lines)
    assert "top-1" in log and f"model:        {out / 'model.keras'}" in log


def test_a_killed_run_resumes_and_says_from_where(folder, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    steps = 600  # ~4 s an epoch here: the kill lands in the middle of epoch 2
    settings = [*RUN, "training.epochs=2", f"training.steps_per_epoch={steps}"]
    process = _start(_argv(out, settings, data=folder), tmp_path / "killed.log")
    state_path = out / "checkpoints" / "state.json"
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not state_path.exists() and process.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(0.05)
    finally:
        process.kill()  # SIGKILL: no cleanup, as a crash or an OOM kill
        process.wait()
    assert process.returncode == -9, _stderr(process)
    state = json.loads(state_path.read_text())
    assert (state["epoch"], state["optimizer_step"]) == (1, steps)
    # "saved" is when that checkpoint was written (local time), not when the run began.
    saved = time.mktime(time.strptime(state["saved"], "%Y-%m-%d %H:%M:%S"))
    written = (out / "checkpoints" / state["checkpoint"]).stat().st_mtime
    assert 0 <= written - saved < 1.5, (state["saved"], time.ctime(written))
    assert not (out / "model.keras").exists()

    # Started again (here: its output is what `finished` checks in a file).
    code, text, err = _in_process(_argv(out, settings, data=folder), capsys)
    assert code == 0, err
    first = text.splitlines()[0]
    assert first.startswith(
        f"Run folder {out}: resuming at epoch 2 of 2 from "
        f"checkpoints/epoch_0001.weights.h5 (step {steps}, saved "), first
    assert first.endswith(f"{state['saved']}).")
    assert _epochs(text) == [("2", "2")]
    metrics = json.loads((out / "metrics.json").read_text())
    assert [h["step"] for h in metrics["history"]] == [steps, 2 * steps]
    assert (out / "model.keras").exists() and "top-1" in text


def test_a_finished_run_says_it_is_complete_and_only_evaluates(copy, capsys, folder):  # noqa: F811
    before = _files(copy / "checkpoints")
    code, stdout, _ = _in_process(_argv(copy, data=folder), capsys)
    assert code == 0
    first = stdout.splitlines()[0]
    assert first.startswith(f"Run folder {copy}: already complete (3 of 3 epochs; "
                            f"checkpoints/epoch_0003.weights.h5, step {3 * STEPS}, saved ")
    assert "evaluating only" in first and "--set output.resume=false" in first
    assert "another output folder (-o)" in first
    assert _epochs(stdout) == [] and "top-1" in stdout
    assert _files(copy / "checkpoints") == before  # nothing trained, nothing written


def test_a_longer_run_in_a_finished_folder_is_refused_naming_the_change(copy, capsys,
                                                                        folder):  # noqa: F811
    before = _files(copy)
    for change, named in (("training.epochs=5", f"training.epochs 3 -> 5, total steps "
                                                f"{3 * STEPS} -> {5 * STEPS}"),
                          ("schedule.min_lr=0.0001", "schedule.min_lr 1e-05 -> 0.0001")):
        code, stdout, err = _in_process(_argv(copy, [*RUN, change], data=folder), capsys)
        assert code == 2 and stdout == ""
        assert len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"mvit2 train: error: Run folder {copy}: refused: "
                              "checkpoints/epoch_0003.weights.h5 (3 epoch(s), step "
                              f"{3 * STEPS}) was trained with another length or schedule: "
                              f"{named};"), err
        assert "Pass --resume" in err and "--set output.resume=false" in err
        assert "another output folder (-o)" in err
    assert _files(copy) == before


def test_resume_continues_with_the_learning_rate_re_planned(copy, capsys, folder):  # noqa: F811
    earlier = json.loads((copy / "metrics.json").read_text())["history"]
    longer = [*RUN, "training.epochs=5"]
    code, stdout, err = _in_process(_argv(copy, longer, "--resume", data=folder), capsys)
    assert code == 0, err
    first = stdout.splitlines()[0]
    assert first.startswith(f"Run folder {copy}: resuming at epoch 4 of 5 from "
                            f"checkpoints/epoch_0003.weights.h5 (step {3 * STEPS}, saved ")
    # The 3-epoch cosine had reached its minimum: the new epochs stay there, and the line
    # says so.
    assert first.endswith(
        f" with training.epochs 3 -> 5, total steps {3 * STEPS} -> {5 * STEPS} (--resume): "
        f"learning rate re-planned from step {3 * STEPS} to {5 * STEPS}: constant 1e-05, the "
        "minimum the earlier schedule had already decayed to."), first
    assert _epochs(stdout) == [("4", "5"), ("5", "5")]
    history = json.loads((copy / "metrics.json").read_text())["history"]
    assert history[:3] == earlier
    assert [h["step"] for h in history] == [STEPS * e for e in range(1, 6)]
    assert [h["learning_rate"] for h in history[3:]] == pytest.approx([1e-5, 1e-5])
    state = json.loads((copy / "checkpoints" / "state.json").read_text())
    assert state["plan"]["epochs"] == 5
    assert state["learning_rate"]["class_name"] == "ReplannedCosineDecay"
    # The checkpoint records the new plan: the same command is now a complete 5-epoch run.
    code, stdout, _ = _in_process(_argv(copy, longer, data=folder), capsys)
    assert code == 0 and "already complete (5 of 5 epochs;" in stdout.splitlines()[0]


def test_starting_over_moves_the_earlier_files_aside(copy, capsys, folder):  # noqa: F811
    old = {name: _digest(copy / name) for name in
           ("checkpoints/epoch_0003.weights.h5", "checkpoints/state.json", "metrics.json",
            "model.keras", "config.yaml")}
    code, stdout, err = _in_process(
        _argv(copy, [*RUN, "training.epochs=2", "output.resume=false"], data=folder), capsys)
    assert code == 0, err
    first = stdout.splitlines()[0]
    match = re.fullmatch(
        rf"Run folder {re.escape(str(copy))}: new run, 2 epoch\(s\) of {STEPS} steps "
        r"\(output.resume=false\): the earlier files \(config.yaml, run.json, metrics.json, "
        r"model.keras, model_ema.keras, checkpoints/(?:, tensorboard/)?\) are moved to "
        r"(previous-\d{8}-\d{6})/.", first)
    assert match, first
    previous = copy / match.group(1)
    for name, digest in old.items():
        assert _digest(previous / name) == digest, name  # moved as they were
    assert _epochs(stdout) == [("1", "2"), ("2", "2")]
    state = json.loads((copy / "checkpoints" / "state.json").read_text())
    assert state["epoch"] == 2 and len(state["history"]) == 2
    assert sorted(os.listdir(copy / "checkpoints")) == [
        "epoch_0001.weights.h5", "epoch_0002.weights.h5", "state.json"]


def test_resume_and_starting_over_contradict(copy, capsys, folder):  # noqa: F811
    code, _, err = _in_process(
        _argv(copy, [*RUN, "output.resume=false"], "--resume", data=folder), capsys)
    assert code == 2 and "--resume" in err and "output.resume=false" in err


# --------------------------------------------------------------------------------------
# The re-planned schedule
# --------------------------------------------------------------------------------------


def _plan(epochs, steps=10, **kw):
    values = {"warmup_steps": 5, "peak_lr": 0.002, "min_lr": 1e-5, "warmup_init_lr": 1e-6,
              "schedule": "cosine"}
    values.update(kw)
    fields = {"training.epochs": epochs, "optimizer.lr": values["peak_lr"]}
    return SchedulePlan(epochs=epochs, steps_per_epoch=steps, fields=fields, **values)


def _checkpoint_at(out, epoch, plan):
    """A run folder whose last checkpoint is `epoch` of `plan` (an empty weights file)."""
    from keras_mvit2.training.run_folder import checkpoint_record

    (out / "checkpoints").mkdir(parents=True)
    name = f"epoch_{epoch:04d}.weights.h5"
    (out / "checkpoints" / name).write_bytes(b"")
    state = {"epoch": epoch, "optimizer_step": epoch * plan.steps_per_epoch,
             "checkpoint": name, "history": [],
             **checkpoint_record(plan, plan.learning_rate())}
    (out / "checkpoints" / "state.json").write_text(json.dumps(state))


def test_the_replanned_rate_continues_from_the_current_one(tmp_path):
    from keras_mvit2 import training

    config = training.load_config({"output": {"dir": str(tmp_path)}})
    old = _plan(epochs=4)
    _checkpoint_at(tmp_path, 1, old)
    old_lr = old.learning_rate()
    # Killed after epoch 1 of 4, now 8 epochs at half the rate: the cosine goes on from
    # the rate at step 10 (halved, as every rate of the new plan) down to the minimum at
    # the new end, 10 + 7 * 10 steps.
    new = _plan(epochs=8, peak_lr=0.001)
    with pytest.raises(ValueError, match=r"optimizer.lr 0.002 -> 0.001, total steps 40 -> 80"):
        plan_run(config, new)
    plan = plan_run(config, new, replan=True)
    lr = plan.learning_rate
    assert isinstance(lr, ReplannedCosineDecay) and plan.total_steps == 80
    start = float(old_lr(10)) / 2
    assert float(lr(10)) == pytest.approx(start, rel=1e-6)
    halfway = 1e-5 + (start - 1e-5) / 2
    assert float(lr(45)) == pytest.approx(halfway, rel=1e-5)
    assert float(lr(80)) == pytest.approx(1e-5) and float(lr(500)) == pytest.approx(1e-5)
    assert f"cosine from {start:.3g} to 1e-05." in plan.line
    assert "training.epochs 4 -> 8" in plan.line and plan.changes

    # Killed during the warm-up (step 2 of 5) of a longer warm-up now: the linear warm-up
    # goes on from the current rate to the peak at the new warm-up's end, then the cosine.
    shutil.rmtree(tmp_path / "checkpoints")
    old = _plan(epochs=4, steps=2)
    _checkpoint_at(tmp_path, 1, old)
    new = _plan(epochs=4, steps=2, warmup_steps=6)
    plan = plan_run(config, new, replan=True)
    lr, start = plan.learning_rate, float(old.learning_rate()(2))
    assert [float(lr(s)) for s in (2, 4, 6)] == pytest.approx(
        [start, (start + 0.002) / 2, 0.002], rel=1e-6)
    assert float(lr(8)) == pytest.approx(1e-5, rel=1e-5)
    assert f"warm-up from {start:.3g} to 0.002 at step 6, then cosine to 1e-05." in plan.line

    # With nothing changed the checkpoint's own schedule goes on.
    plan = plan_run(config, old)
    assert plan.action == "resume" and not plan.changes
    assert isinstance(plan.learning_rate, WarmupCosineDecay)
    assert plan.learning_rate.get_config() == old.learning_rate().get_config()


def test_replanned_schedule_round_trips_and_matches_warmup_cosine_from_step_0():
    replanned = ReplannedCosineDecay(0, 1e-6, 100, 10, 0.002, 1e-5)
    plain = WarmupCosineDecay(0.002, 100, 10, 1e-6, 1e-5)
    steps = np.arange(0, 120, 7)
    np.testing.assert_allclose([float(replanned(s)) for s in steps],
                               [float(plain(s)) for s in steps], rtol=1e-6)
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(
        ReplannedCosineDecay(50, 0.001, 150, 10, 0.002, 0.0)))
    assert isinstance(again, ReplannedCosineDecay)
    assert [round(float(again(s)), 6) for s in (0, 50, 100, 150, 200)] == [
        0.001, 0.001, 0.0005, 0.0, 0.0]


# --------------------------------------------------------------------------------------
# Progress output: a live bar on a terminal, one line per epoch elsewhere
# --------------------------------------------------------------------------------------


class _Stdout(io.StringIO):
    def __init__(self, terminal):
        super().__init__()
        self.terminal = terminal

    def isatty(self):
        return self.terminal


def _fit_output(monkeypatch, terminal):
    stream = _Stdout(terminal)
    monkeypatch.setattr(sys, "stdout", stream)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    x, y = np.zeros((12, 4), "float32"), np.zeros((12, 2), "float32")
    verbose = progress_verbose(1)
    # Epoch 2 of a 5-epoch run trained one `fit` call per epoch.
    model.fit(x, y, batch_size=4, initial_epoch=1, epochs=2, verbose=verbose,
              callbacks=[EpochProgress(5, verbose)])
    monkeypatch.undo()
    return verbose, stream.getvalue()


def test_progress_is_one_plain_line_per_epoch_off_a_terminal(monkeypatch):
    verbose, text = _fit_output(monkeypatch, terminal=False)
    assert verbose == 2
    assert re.fullmatch(r"Epoch 2/5 - 3/3 - \d+s - \d+[mu]?s/step - loss: \S+\n", text), text


def test_progress_is_the_live_bar_on_a_terminal(monkeypatch):
    verbose, text = _fit_output(monkeypatch, terminal=True)
    assert verbose == 1
    assert text.startswith("Epoch 2/5\n") and "\x1b[" in text and "3/3" in text


def test_task_trainer_logs_one_line_per_epoch(tmp_path, capsys):
    pytest.importorskip("skimage")
    from keras_mvit2.tasks import data as td

    if not os.path.exists(os.path.join(td.FASHION_MNIST_DIR, "t10k-images-idx3-ubyte.gz")):
        pytest.skip("Debian's dataset-fashion-mnist is not installed")
    code, stdout, err = _in_process(
        ["train", "--task", "segmentation", "-o", str(tmp_path / "seg"), "--steps", "50",
         "--batch-size", "4", "--train-images", "8", "--val-images", "4", "--image-size", "64",
         "--head-channels", "16"], capsys)
    assert code == 0, err
    assert _epochs(stdout) == [("1", "2"), ("2", "2")]  # 50 steps: 2 epochs of 25
    assert "\x1b" not in stdout and "\r" not in stdout and "\b" not in stdout


def test_qat_logs_one_line_per_epoch_off_a_terminal(finished, folder, tmp_path, capsys):  # noqa: F811
    out, _ = finished
    code, stdout, err = _in_process(
        ["qat", str(out / "model.keras"), "--data", str(folder), "--epochs", "2", "--steps",
         "3", "--batch-size", "4", "-o", str(tmp_path / "int8.tflite")], capsys)
    assert code == 0, err
    progress = re.findall(r"^\[qat\] epoch (\d)/2: distillation loss \d+\.\d{4}$", stdout,
                          re.M)
    assert progress == ["1", "2"], stdout  # one line per epoch, not one per step
    assert "\x1b" not in stdout and "\r" not in stdout
    assert (tmp_path / "int8.tflite").exists()
