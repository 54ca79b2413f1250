"""What `train` does with its run folder, said in one line before it trains.

A run folder (`output.dir`) holds what `train` writes (`RUN_FILES`): `config.yaml`,
`run.json`, `checkpoints/` (the kept `epoch_NNNN.weights.h5` and `state.json`, which names
the last one and records the plan it was trained with: length and learning-rate schedule),
`tensorboard/`, `model.keras`, `model_ema.keras`, `metrics.json` (and `eval/` of `mvit2
eval`). `plan_run` reads it and decides:

- **new run**: no checkpoint, or `output.resume: false`. The files of an earlier run are
  moved to `previous-<date>-<time>/` in the folder first (`prepare_folder`), never
  overwritten;
- **resume** after the last checkpoint, with the same plan (a killed run);
- **already complete**: every epoch is done; only the evaluation runs again;
- **refused** (`ValueError`): the folder holds another model, or a run of another length
  or schedule (`SchedulePlan`: `training.epochs`, `training.steps_per_epoch`, the batch
  and the rates of `optimizer` and `schedule`). Continuing it is a choice: `replan=True`
  (`mvit2 train --resume`) resumes with the learning rate re-planned from the current
  step to the new end (`ReplannedCosineDecay`), and the line says how; another
  `output.dir` or `output.resume: false` starts over.

`RunPlan.line` is that one line (`Run folder runs/x: resuming at epoch 3 of 3 from
checkpoints/epoch_0002.weights.h5 (step 80, saved 2025-06-01 12:03:41).`); a refusal is a
`ValueError` whose message is the line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Literal

import keras

from keras_mvit2.training.config import TrainConfig, load_config
from keras_mvit2.training.schedules import ReplannedCosineDecay, WarmupCosineDecay

STATE_FILE = "state.json"
#: What `train` (and `mvit2 eval`'s default report) writes into a run folder; a run that
#: starts over moves these aside. Other files in the folder stay where they are.
RUN_FILES = ("config.yaml", "run.json", "metrics.json", "model.keras", "model_ema.keras",
             "checkpoints", "tensorboard", "eval")
#: The config fields that set a run's length and learning-rate schedule (named when a
#: resumed run changes them).
PLAN_FIELDS = ("training.epochs", "training.steps_per_epoch", "data.batch_size",
               "optimizer.lr", "optimizer.reference_batch_size", "schedule.name",
               "schedule.warmup_epochs", "schedule.warmup_steps", "schedule.warmup_init_lr",
               "schedule.min_lr")
_START_OVER = ("start over with another output folder (-o) or --set output.resume=false "
               "(the earlier files are moved aside)")


@dataclasses.dataclass(frozen=True)
class SchedulePlan:
    """A run's length and learning-rate schedule, as its config, data and replicas give them.

    Two runs with equal plans train on the same schedule; `fields` (the `PLAN_FIELDS` of
    the config) only serve to name what changed and take no part in the comparison.

    Attributes:
        epochs: number of epochs.
        steps_per_epoch: optimizer steps per epoch.
        warmup_steps: end of the linear warm-up (steps from 0).
        peak_lr, min_lr, warmup_init_lr: the rates, scaled for the global batch.
        schedule: `cosine` or `constant` (`schedule.name`).
        fields: `{"training.epochs": 3, ...}`.
    """

    epochs: int
    steps_per_epoch: int
    warmup_steps: int
    peak_lr: float
    min_lr: float
    warmup_init_lr: float
    schedule: str
    fields: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def learning_rate(self) -> WarmupCosineDecay:
        """The schedule of a run trained with this plan from step 0."""
        return WarmupCosineDecay(self.peak_lr, self.total_steps, self.warmup_steps,
                                 self.warmup_init_lr, self.min_lr)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SchedulePlan:
        return cls(**d)


def plan_fields(config: TrainConfig) -> dict[str, Any]:
    """`{field: value}` of `PLAN_FIELDS` in `config`."""
    return {f: getattr(getattr(config, f.split(".")[0]), f.split(".")[1]) for f in PLAN_FIELDS}


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What `train` does with its run folder (see the module docstring).

    Attributes:
        action: `new`, `resume` or `complete`.
        line: the one line that says so, printed before training.
        output_dir: the run folder (absolute).
        initial_epoch: the epochs already done (0 for a new run).
        state: the checkpoint state the run resumes from (`latest_checkpoint`), else None.
        learning_rate: the schedule to train with (re-planned if the plan changed).
        total_steps: the optimizer step at which the run ends.
        changes: what changed since the checkpoint (`training.epochs 3 -> 5`), resumed
            with `replan=True`; empty otherwise.
        move_aside: the earlier files (`RUN_FILES`) that `prepare_folder` moves into
            `previous_dir` before a new run.
        previous_dir: where they go, else None.
        notes: lines said before `line` about how the run was fitted to its data (the
            batch lowered to fit a small training set, `run_data.fit_batch_size`).
    """

    action: Literal["new", "resume", "complete"]
    line: str
    output_dir: str
    initial_epoch: int
    state: dict[str, Any] | None
    learning_rate: keras.optimizers.schedules.LearningRateSchedule
    total_steps: int
    changes: list[str] = dataclasses.field(default_factory=list)
    move_aside: list[str] = dataclasses.field(default_factory=list)
    previous_dir: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)


# --------------------------------------------------------------------------------------
# Reading the folder
# --------------------------------------------------------------------------------------


def latest_checkpoint(output_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The state of the last completed epoch of a run folder (`None` if none).

    `epoch`, `optimizer_step`, `checkpoint` (file name) and `checkpoint_path`, `history`,
    `seed_states`, and, where the checkpoint records them (older ones do not), `plan` (a
    `SchedulePlan` dict), `learning_rate` (the serialized schedule) and `saved` (local
    time).
    """
    path = os.path.join(os.fspath(output_dir), "checkpoints", STATE_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        state = json.load(f)
    state["checkpoint_path"] = os.path.join(os.path.dirname(path), state["checkpoint"])
    if not os.path.exists(state["checkpoint_path"]):
        raise FileNotFoundError(
            f"{path} names the checkpoint {state['checkpoint']!r}, which is missing. "
            "Remove the checkpoints folder (or set output.resume=false) to start over."
        )
    return state


def _saved_plan(state: dict[str, Any], out: str) -> SchedulePlan | None:
    """The plan the checkpoint was trained with; for older checkpoints, from `run.json`."""
    if "plan" in state:
        return SchedulePlan.from_dict(state["plan"])
    run_path, config_path = (os.path.join(out, n) for n in ("run.json", "config.yaml"))
    if not (os.path.exists(run_path) and os.path.exists(config_path)):
        return None
    with open(run_path) as f:
        run = json.load(f)
    config = load_config(config_path)
    try:
        return SchedulePlan(
            epochs=run["total_steps"] // run["steps_per_epoch"],
            steps_per_epoch=run["steps_per_epoch"], warmup_steps=run["warmup_steps"],
            peak_lr=run["peak_lr"], min_lr=run["min_lr"],
            warmup_init_lr=run["warmup_init_lr"], schedule=config.schedule.name,
            fields=plan_fields(config))
    except KeyError:  # a run.json without the schedule: nothing to compare with
        return None


def _saved_learning_rate(state: dict[str, Any], plan: SchedulePlan | None):
    if "learning_rate" in state:
        return keras.saving.deserialize_keras_object(state["learning_rate"])
    return None if plan is None else plan.learning_rate()


def _check_same_model(config: TrainConfig, out: str) -> None:
    config_path = os.path.join(out, "config.yaml")
    if not os.path.exists(config_path):
        return
    saved = load_config(config_path)
    # `weights` / `new_head` only matter for the initialization, which the checkpoint replaces.
    init_only = ("weights", "new_head")
    before, now = (
        {k: v for k, v in dataclasses.asdict(c.model).items() if k not in init_only}
        for c in (saved, config)
    )
    if before != now:
        raise ValueError(
            f"Run folder {out}: refused: it holds a run with a different 'model' config "
            f"({saved.model}); resuming it with {config.model} would mix two models. "
            f"To train this model, {_START_OVER}."
        )


def describe_changes(old: SchedulePlan, new: SchedulePlan) -> list[str]:
    """What differs between two plans, as config fields (`training.epochs 3 -> 5`) and,
    where no field of the config changed, as the derived values (the data or the
    replicas changed)."""
    changes = [f"{k} {old.fields[k]} -> {v}" for k, v in new.fields.items()
               if k in old.fields and old.fields[k] != v]
    derived = [(name, getattr(old, attr), getattr(new, attr)) for name, attr in (
        ("steps per epoch", "steps_per_epoch"), ("warm-up steps", "warmup_steps"),
        ("peak learning rate", "peak_lr"), ("final learning rate", "min_lr"),
        ("warm-up start learning rate", "warmup_init_lr"))]
    if not changes:
        changes = [f"{name} {a:g} -> {b:g}" for name, a, b in derived if a != b]
    if old.total_steps != new.total_steps:
        changes.append(f"total steps {old.total_steps} -> {new.total_steps}")
    return changes


# --------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------


def plan_run(config: TrainConfig, wanted: SchedulePlan, *, replan: bool = False) -> RunPlan:
    """Decides what `train(config)` does with `config.output.dir` (reads, writes nothing).

    Args:
        config: the run's config (`output.dir`, `output.resume`, the `model` section).
        wanted: the plan `config` asks for (`SchedulePlan`).
        replan: continue a run whose length or schedule changed, with the learning rate
            re-planned from its current step (`mvit2 train --resume`).

    Returns:
        A `RunPlan`.

    Raises:
        ValueError: refused (its message is the one line): the folder holds a run of
            another model, or of another length or schedule and `replan` is false; or
            `replan` with `output.resume: false`.
    """
    out = os.path.abspath(config.output.dir)
    if replan and not config.output.resume:
        raise ValueError("--resume (replan=True) continues the run in the output folder, "
                         "output.resume=false starts it over: pass one of them.")
    state = latest_checkpoint(out) if config.output.resume else None
    if state is None:
        return _new_run(config, wanted, out)
    _check_same_model(config, out)
    done, step = int(state["epoch"]), int(state["optimizer_step"])
    checkpoint = os.path.relpath(state["checkpoint_path"], out)
    saved = state.get("saved") or time.strftime(
        "%Y-%m-%d %H:%M:%S", time.localtime(os.path.getmtime(state["checkpoint_path"])))
    old = _saved_plan(state, out)
    changes = describe_changes(old, wanted) if old is not None and old != wanted else []
    if changes and not replan:
        raise ValueError(
            f"Run folder {out}: refused: {checkpoint} ({done} epoch(s), step {step}) was "
            f"trained with another length or schedule: {', '.join(changes)}; continuing it "
            "would mix two learning-rate schedules. Pass --resume to continue it with the "
            f"learning rate re-planned from step {step}, or {_START_OVER}.")
    learning_rate = _saved_learning_rate(state, old)
    if learning_rate is None:
        learning_rate = wanted.learning_rate()
    if done >= wanted.epochs:
        counted = (f"{done} of {wanted.epochs} epochs" if done == wanted.epochs
                   else f"{done} epochs done, {wanted.epochs} asked")
        line = (f"Run folder {out}: already complete ({counted}; {checkpoint}, step {step}, "
                f"saved {saved}): evaluating only. To train again, {_START_OVER}.")
        return RunPlan("complete", line, out, done, state, learning_rate, step, changes)
    line = (f"Run folder {out}: resuming at epoch {done + 1} of {wanted.epochs} from "
            f"{checkpoint} (step {step}, saved {saved})")
    total = step + (wanted.epochs - done) * wanted.steps_per_epoch
    if not changes:
        return RunPlan("resume", line + ".", out, done, state, learning_rate, total)
    start_lr = float(learning_rate(step)) * wanted.peak_lr / old.peak_lr
    learning_rate = ReplannedCosineDecay(step, start_lr, total,
                                         min(wanted.warmup_steps, total), wanted.peak_lr,
                                         wanted.min_lr)
    line += (f" with {', '.join(changes)} (--resume): learning rate re-planned from step "
             f"{step} to {total}: {describe_replanned(learning_rate)}.")
    return RunPlan("resume", line, out, done, state, learning_rate, total, changes)


def describe_replanned(schedule: ReplannedCosineDecay) -> str:
    """`cosine from 0.0012 to 1e-05`, `constant 0.001`, or the warm-up first if it is not
    over."""
    if schedule.warms_up:
        return (f"warm-up from {schedule.start_lr:.3g} to {schedule.peak_lr:.3g} at step "
                f"{schedule.warmup_steps}, then cosine to {schedule.min_lr:.3g}")
    if abs(schedule.start_lr - schedule.min_lr) > 1e-6 * schedule.min_lr:
        return f"cosine from {schedule.start_lr:.3g} to {schedule.min_lr:.3g}"
    if schedule.min_lr >= schedule.peak_lr:  # schedule.name: constant
        return f"constant {schedule.min_lr:.3g}"
    return (f"constant {schedule.min_lr:.3g}, the minimum the earlier schedule had already "
            "decayed to")


def _new_run(config: TrainConfig, wanted: SchedulePlan, out: str) -> RunPlan:
    existing = [n for n in RUN_FILES if os.path.exists(os.path.join(out, n))]
    line = (f"Run folder {out}: new run, {wanted.epochs} epoch(s) of "
            f"{wanted.steps_per_epoch} steps.")
    previous = None
    if existing:
        previous = os.path.join(out, "previous-" + time.strftime("%Y%m%d-%H%M%S"))
        base, count = previous, 1
        while os.path.exists(previous):
            count += 1
            previous = f"{base}-{count}"
        why = "output.resume=false" if not config.output.resume else "no checkpoint to resume"
        shown = [name + "/" if os.path.isdir(os.path.join(out, name)) else name
                 for name in existing]
        line = (f"{line[:-1]} ({why}): the earlier files ({', '.join(shown)}) are moved to "
                f"{os.path.relpath(previous, out)}/.")
    return RunPlan("new", line, out, 0, None, wanted.learning_rate(), wanted.total_steps,
                   move_aside=existing, previous_dir=previous)


def prepare_folder(plan: RunPlan) -> None:
    """Moves a new run's earlier files aside (`plan.move_aside`) and makes `checkpoints/`."""
    if plan.move_aside:
        os.makedirs(plan.previous_dir)
        for name in plan.move_aside:
            os.replace(os.path.join(plan.output_dir, name),
                       os.path.join(plan.previous_dir, name))
    os.makedirs(os.path.join(plan.output_dir, "checkpoints"), exist_ok=True)


def checkpoint_record(plan: SchedulePlan,
                      learning_rate: keras.optimizers.schedules.LearningRateSchedule,
                      ) -> dict[str, Any]:
    """The entries of `state.json` that let a later run check and continue this plan."""
    return {"plan": plan.to_dict(),
            "learning_rate": keras.saving.serialize_keras_object(learning_rate)}
