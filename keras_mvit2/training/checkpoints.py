"""Epoch checkpoints: weights, optimizer and EMA, the random layers' states and
`state.json` (history, plan and schedule), written atomically after every epoch."""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from typing import TYPE_CHECKING, Any

import keras
import numpy as np

from keras_mvit2.training.run_folder import STATE_FILE
from keras_mvit2.utils.files import atomic_output, write_json

if TYPE_CHECKING:
    from keras_mvit2.training.train_step import ClassifierTrainer


def _seed_variables(model: keras.Model) -> list:
    """The states of the model's random layers (dropout, stochastic depth), in layer order."""
    return [v for v in model.variables if "seed_generator_state" in v.path]


def _seed_states(model: keras.Model) -> list[list[int]]:
    # Saved by position: the variables' names carry a per-process counter
    # ("seed_generator_12"), their order follows the architecture.
    return [np.asarray(v.numpy()).tolist() for v in _seed_variables(model)]


def _restore_seed_states(model: keras.Model, states: list[list[int]]) -> None:
    variables = _seed_variables(model)
    if len(states) != len(variables):
        raise ValueError(
            f"The checkpoint holds {len(states)} random-layer states but the model has "
            f"{len(variables)}; it was written by another architecture."
        )
    for v, state in zip(variables, states, strict=True):
        v.assign(np.asarray(state, dtype=v.dtype))


def _save_checkpoint(trainer: ClassifierTrainer, ckpt_dir: str, epoch: int,
                     history: list[dict], keep: int, record: dict[str, Any]) -> str:
    name = f"epoch_{epoch:04d}.weights.h5"
    path = os.path.join(ckpt_dir, name)
    with atomic_output(path) as tmp:
        trainer.save_weights(tmp)
    state = {
        "epoch": epoch,
        "optimizer_step": int(trainer.optimizer.iterations.numpy()),
        "checkpoint": name,
        "seed_states": _seed_states(trainer.classifier),
        "history": history,
        **record,  # the plan and learning-rate schedule (`run_folder.checkpoint_record`)
        "saved": time.strftime("%Y-%m-%d %H:%M:%S"),  # local time, in the resume line
    }
    write_json(os.path.join(ckpt_dir, STATE_FILE), state)
    old = sorted(f for f in os.listdir(ckpt_dir)
                 if f.startswith("epoch_") and f.endswith(".weights.h5"))
    for f in old[:-keep]:
        os.remove(os.path.join(ckpt_dir, f))
    return path


@dataclasses.dataclass
class TrainingState:
    """Where a run stands: its epochs, history and last checkpoint, and this call's timing.

    Attributes:
        initial_epoch: the epoch this call started from (> 0 when it resumed).
        history: one dict per epoch run (the resumed ones and this call's).
        checkpoint_path: the last epoch checkpoint, None before the first.
        timed_images, timed_seconds: the images and seconds of this call's timed steps
            (`callbacks._Throughput`).
    """

    initial_epoch: int = 0
    history: list[dict] = dataclasses.field(default_factory=list)
    checkpoint_path: str | None = None
    timed_images: int = 0
    timed_seconds: float = 0.0

    def images_per_second(self) -> float:
        """Training throughput of this call's epochs; for a call that trained none (a
        complete run folder), the median of the recorded epochs' (NaN without any)."""
        if self.timed_seconds:
            return self.timed_images / self.timed_seconds
        rates = [h["images_per_second"] for h in self.history
                 if math.isfinite(h.get("images_per_second") or math.nan)]
        return float(statistics.median(rates)) if rates else math.nan


def resume_from(trainer: ClassifierTrainer, state: dict[str, Any] | None) -> TrainingState:
    """Loads the checkpoint of `state` (`run_folder.latest_checkpoint`) into `trainer`;
    a new `TrainingState` without one."""
    if state is None:
        return TrainingState()
    trainer.load_weights(state["checkpoint_path"])
    _restore_seed_states(trainer.classifier, state.get("seed_states", []))
    resumed = TrainingState(initial_epoch=int(state["epoch"]),
                            history=list(state.get("history", [])),
                            checkpoint_path=state["checkpoint_path"])
    step = int(trainer.optimizer.iterations.numpy())
    if step != state["optimizer_step"]:
        raise ValueError(
            f"Checkpoint {resumed.checkpoint_path!r} restored optimizer step {step}, but its "
            f"state says {state['optimizer_step']}; the checkpoint is inconsistent."
        )
    return resumed
