"""Training throughput on CPU: our MobileViTV2-0.5 (Keras) vs timm's in PyTorch (one command).

    python benchmarks/training_throughput.py [--batch 64] [--size 256] [--rounds 5]
        [--steps 3] [--threads 2] [--variants default,xla] [--backends tensorflow,jax,torch]
        [--no-timm] [--name NAME] [--out benchmarks/results]

One full training step (forward, label-smoothing cross-entropy, backward, clipping of the
global gradient norm, AdamW without decay on 1-D weights, EMA of every weight) on a batch
of random float32 images held in memory, 1000 classes. Ours is the exact train step of
`keras_mvit2.training.train` (`training.build_trainer` on the packaged
`imagenet_mobilevitv2_050` recipe, float32); timm's is the same recipe written the usual
PyTorch way (`timm.create_model("mobilevitv2_050")`, `torch.optim.AdamW` with two
parameter groups, `clip_grad_norm_`, `timm.utils.ModelEmaV3`). PyTorch runs in a
subprocess (a torch convolution crashes in a process that has imported TensorFlow), with
torchvision stubbed as in `tests/torch_oracle.py`; both are limited to `--threads` threads
(torch with `OMP_WAIT_POLICY=PASSIVE` unless set: its faster setting on a shared machine).

Ours also runs on Keras' JAX and PyTorch backends (`--backends`, default: every one
installed): `training.build_trainer`'s `KerasClassifierTrainer`, the same recipe through
Keras' own train step (the optimizer's `global_clipnorm`; the EMA updated by the trainer's
`step_callbacks()` after every `train_on_batch`, as `fit` does), each in a subprocess of
its own with `KERAS_BACKEND` set (`--keras-worker`, the same protocol as the PyTorch
worker). PyTorch is limited to `--threads` threads; JAX's XLA CPU runtime has no thread
setting, so it uses every core (two on the machine measured, so the same there). The JAX
worker has TensorFlow imported (`keras_mvit2.training` loads it there for tf.data input) but
runs no TensorFlow op; the workers record `tf_loaded`.

The frameworks are timed in interleaved rounds (each round: a window of `--steps` steps
of every contender, in a rotating order) after warm-up steps, so that load from other
processes on a shared machine hits all of them alike; the figure is the median over the
rounds of images / second of a window, with its ratio to timm's and to our TensorFlow
step. Process CPU time is recorded per window. Writes ``training_throughput.json`` and
``training_throughput.md`` at the default 256x256, batch 64, else
``training_throughput_<size>_b<batch>.*`` (``--name`` to choose).

Multi-scale training (``--multiscale 0.714,0.857,1,1.143``, with ``--size`` / ``--batch``
the base pair; no PyTorch) compares, on the (size, batch) pairs of
`keras_mvit2.data.multiscale_batch_pairs`, the same train step with the classifier laid
out three ways (`--layouts`):

- ``per_resolution``: one model built for each size, all sharing the layers (and so the
  weights) of the base-size classifier; each batch goes to the model of its shape, the
  train function traced once per batch shape (the layout of keras_mvit2 0.1);
- ``dynamic``: one model built with ``input_shape=(None, None, 3)`` for every batch, the
  train function traced once per batch shape (`ClassifierTrainer.reduce_retracing=False`);
- ``dynamic_generic``: the same model, the train function generalized to one trace for
  every shape after the second (``reduce_retracing=True``, the library's default: no
  slower than the others here, and fewer traces).

A window runs ``--steps`` steps at every size in turn; the figures are the medians over the
interleaved rounds of images / second per size and over the whole window. The first step
at each size (tracing included) is timed apart. Writes
``training_throughput_multiscale.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH_NAME = "timm (PyTorch)"
KERAS_NAMES = {"tensorflow": "ours (Keras, TF)", "jax": "ours (Keras, JAX)",
               "torch": "ours (Keras, PyTorch)"}


# --------------------------------------------------------------------------------------
# PyTorch worker (subprocess; never imports TensorFlow)
# --------------------------------------------------------------------------------------


def torch_worker(args: argparse.Namespace) -> int:
    """Answers `{"steps": n}` lines on stdin with the timing of n train steps on stdout."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from torch_oracle import install_torchvision_stub

    install_torchvision_stub()
    import numpy as np
    import timm
    import torch
    from timm.utils import ModelEmaV3

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = timm.create_model("mobilevitv2_050", num_classes=1000)
    model.train()
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
        lr=2e-3, betas=(0.9, 0.999), eps=1e-8)
    ema = ModelEmaV3(model, decay=0.9995)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(
        rng.uniform(0, 1, (args.batch, 3, args.size, args.size)).astype("float32"))
    y = torch.from_numpy(rng.integers(0, 1000, args.batch))

    def step(i: int) -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        optimizer.step()
        ema.update(model, step=i)
        return float(loss)

    info = {"torch": torch.__version__, "timm": timm.__version__,
            "threads": torch.get_num_threads(), "mkldnn": torch.backends.mkldnn.is_available(),
            "params": sum(p.numel() for p in model.parameters()),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
    return _serve(step, info)


def keras_worker(args: argparse.Namespace) -> int:
    """`torch_worker` for our train step on Keras' JAX or PyTorch backend (`KERAS_BACKEND`).

    The trainer is `training.build_trainer`'s `KerasClassifierTrainer`, as `train` builds
    it; `fit` would run its `step_callbacks()` (the EMA update) after every step, so they
    run here after every `train_on_batch`.
    """
    import keras
    import numpy as np

    from keras_mvit2 import training

    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        torch.set_num_threads(args.threads)
    config = training.load_config("imagenet_mobilevitv2_050", [
        f"model.image_size={args.size}", "training.precision=float32",
        "training.strategy=default"])
    trainer = training.build_trainer(config, 1000, config.optimizer.lr)
    callbacks = trainer.step_callbacks()
    for callback in callbacks:
        callback.set_model(trainer)
    rng = np.random.default_rng(0)
    x = keras.ops.convert_to_tensor(
        rng.uniform(0, 1, (args.batch, args.size, args.size, 3)).astype("float32"))
    y = keras.ops.convert_to_tensor(
        np.eye(1000, dtype="float32")[rng.integers(0, 1000, args.batch)])

    def step(i: int) -> float:
        logs = trainer.train_on_batch(x, y, return_dict=True)
        for callback in callbacks:
            callback.on_train_batch_end(i, logs)
        return float(logs["loss"])

    info = {"backend": backend, "keras": keras.__version__,
            "trainer": type(trainer).__name__, "ema": trainer.ema is not None,
            "global_clipnorm": trainer.optimizer.global_clipnorm,
            "params": int(sum(np.prod(w.shape) for w in trainer.classifier.trainable_weights)),
            "tf_loaded": "tensorflow" in sys.modules}
    if backend == "jax":
        import jax

        info["jax"] = jax.__version__
    else:
        import torch

        info["torch"] = torch.__version__
        info["threads"] = torch.get_num_threads()
    return _serve(step, info)


def _serve(step, info: dict) -> int:
    """The worker loop: prints `info`, then answers `{"steps": n}` lines on stdin with the
    seconds, CPU seconds and last loss of n calls of `step(i)` (i counts every step)."""
    count = 0
    print(json.dumps(info), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        cpu, start = time.process_time(), time.perf_counter()
        loss = 0.0
        for _ in range(request["steps"]):
            loss = step(count)
            count += 1
        seconds = time.perf_counter() - start
        print(json.dumps({"seconds": seconds, "cpu_seconds": time.process_time() - cpu,
                          "loss": loss}), flush=True)
    return 0


class WorkerContender:
    """A worker process (`--torch-worker`, or `--keras-worker` on `backend`), driven window
    by window."""

    def __init__(self, args: argparse.Namespace, backend: str | None = None):
        import subprocess

        flag = "--torch-worker" if backend is None else "--keras-worker"
        self.name = TORCH_NAME if backend is None else KERAS_NAMES[backend]
        self.flag = flag
        cmd = [sys.executable, os.path.abspath(__file__), flag,
               "--batch", str(args.batch), "--size", str(args.size),
               "--threads", str(args.threads)]
        # PASSIVE: idle OpenMP threads sleep instead of spinning. On a shared machine the
        # spinning default made timm's step 1.6x slower (21 s vs 13 s at load 5-7 on 2 cores).
        env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "OMP_NUM_THREADS": str(args.threads)}
        if backend is not None:
            env["KERAS_BACKEND"] = backend
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (os.path.dirname(HERE), os.environ.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        self.info = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"The {self.name} worker exited (status {self.proc.wait()}); "
                               f"run it alone with {self.flag} to see why.")
        return json.loads(line)

    def run(self, steps: int) -> dict:
        self.proc.stdin.write(json.dumps({"steps": steps}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


# --------------------------------------------------------------------------------------
# Keras (this process)
# --------------------------------------------------------------------------------------


class KerasContender:
    """Our train step (`training.build_trainer`), with `training.jit_compile` on or off."""

    def __init__(self, args: argparse.Namespace, variant: str):
        import numpy as np
        import tensorflow as tf

        from keras_mvit2 import training

        self.name = {"default": KERAS_NAMES["tensorflow"],
                     "xla": "ours (Keras, TF, XLA)"}[variant]
        config = training.load_config("imagenet_mobilevitv2_050", [
            f"model.image_size={args.size}", "training.precision=float32",
            "training.strategy=default", f"training.jit_compile={variant == 'xla'}",
        ])
        self.trainer = training.build_trainer(config, 1000, config.optimizer.lr)
        self.info = {"jit_compile": config.training.jit_compile,
                     "params": int(sum(np.prod(w.shape)
                                       for w in self.trainer.classifier.trainable_weights))}
        rng = np.random.default_rng(0)
        self.x = tf.constant(rng.uniform(0, 1, (args.batch, args.size, args.size, 3)),
                             tf.float32)
        self.y = tf.one_hot(rng.integers(0, 1000, args.batch), 1000)

    def run(self, steps: int) -> dict:
        cpu, start = time.process_time(), time.perf_counter()
        logs = {}
        for _ in range(steps):
            logs = self.trainer.train_on_batch(self.x, self.y, return_dict=True)
        return {"seconds": time.perf_counter() - start,
                "cpu_seconds": time.process_time() - cpu, "loss": float(logs["loss"])}

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------------------
# Multi-scale: one model per resolution vs one model for every size
# --------------------------------------------------------------------------------------

MULTISCALE_LAYOUTS = {
    "per_resolution": "one model per resolution",
    "dynamic": "one dynamic model, traced per shape",
    "dynamic_generic": "one dynamic model, one generic trace",
}


def per_resolution_classifier(classifier, sizes):
    """A model routing each batch to a twin of `classifier` built for its size.

    The twins are `classifier`'s layers called on a `(size, size, 3)` input, so they share
    its weights; only `classifier` is tracked (its weights are the model's weights).
    """
    import keras

    from keras_mvit2.training.ema import _Untracked

    twins = {(s, s): keras.models.clone_model(classifier, input_tensors=keras.Input((s, s, 3)),
                                              clone_function=lambda layer: layer)
             for s in sizes}
    twins[tuple(classifier.input_shape[1:3])] = classifier

    class PerResolution(keras.Model):
        def __init__(self):
            super().__init__(name=classifier.name)
            self.base = classifier
            self.twins = _Untracked([twins])

        def call(self, inputs, training=None):
            return self.twins.items[0][tuple(inputs.shape[1:3])](inputs, training=training)

    model = PerResolution()
    model.built = True
    return model


class MultiscaleContender:
    """Our multi-scale train step with one of `MULTISCALE_LAYOUTS`."""

    def __init__(self, args: argparse.Namespace, layout: str, pairs: list[tuple[int, int]]):
        import numpy as np
        import tensorflow as tf

        from keras_mvit2 import training

        self.name = MULTISCALE_LAYOUTS[layout]
        config = training.load_config("imagenet_mobilevitv2_050", [
            f"model.image_size={args.size}", "training.precision=float32",
            "training.strategy=default", "multiscale.enabled=true",
        ])
        classifier = None
        if layout == "per_resolution":
            classifier = per_resolution_classifier(training.build_classifier(config, 1000),
                                                   [s for s, _ in pairs])
        self.trainer = training.build_trainer(config, 1000, config.optimizer.lr,
                                              multiscale=True, classifier=classifier)
        self.trainer.reduce_retracing = layout == "dynamic_generic"
        self.info = {"layout": layout, "reduce_retracing": self.trainer.reduce_retracing,
                     "input_shape": list(self.trainer.classifier.input_shape
                                         if classifier is None else (None, args.size,
                                                                     args.size, 3))}
        rng = np.random.default_rng(0)
        self.batches = [
            (size, batch, tf.constant(rng.uniform(0, 1, (batch, size, size, 3)), tf.float32),
             tf.one_hot(rng.integers(0, 1000, batch), 1000))
            for size, batch in pairs]

    def run(self, steps: int) -> dict:
        """`steps` steps at every size: seconds, CPU seconds and images per size."""
        out = {}
        for size, batch, x, y in self.batches:
            cpu, start = time.process_time(), time.perf_counter()
            for _ in range(steps):
                logs = self.trainer.train_on_batch(x, y, return_dict=True)
            out[str(size)] = {"seconds": time.perf_counter() - start,
                              "cpu_seconds": time.process_time() - cpu,
                              "images": steps * batch, "loss": float(logs["loss"])}
        return out


# --------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------


def _environment(threads: int) -> dict:
    import keras
    import tensorflow as tf

    return {"tensorflow": tf.__version__, "keras": keras.__version__,
            "python": platform.python_version(), "machine": platform.machine(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "threads": threads,
            "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default (on for x86)")}


def _markdown(result: dict) -> str:
    c = result["config"]
    lines = [
        f"Training throughput, MobileViTV2-0.5, batch {c['batch']}, {c['size']}x{c['size']}, "
        f"float32, CPU, {c['threads']} threads, full train step (AdamW, label smoothing, "
        f"global-norm clipping, EMA), images in memory; median of {c['rounds']} interleaved "
        f"windows of {c['steps']} steps after {c['warmup']} warm-up steps.",
        "",
        "| contender | images/s (median) | min | max | CPU s / step | vs timm "
        "| vs ours (TF) |",
        "|---|---|---|---|---|---|---|",
    ]

    def ratio(value):
        return "-" if value is None else f"{value:.2f}x"

    for name, s in result["summary"].items():
        lines.append(
            f"| {name} | {s['images_per_second']:.2f} | {s['min']:.2f} | {s['max']:.2f} | "
            f"{s['cpu_seconds_per_step']:.2f} | {ratio(s['ratio_vs_timm'])} | "
            f"{ratio(s['ratio_vs_tensorflow'])} |")
    e = result["environment"]
    versions = [f"TensorFlow {e['tensorflow']}", f"Keras {e['keras']}"]
    for info in result["keras"].values():
        if "jax" in info:
            versions.append(f"JAX {info['jax']}")
    if result["torch"]:
        versions.append(f"torch {result['torch']['torch']}, timm {result['torch']['timm']}")
    lines += ["", f"{', '.join(versions)}; {e['cpu_count']} CPUs, load average "
              f"{result['load_average_start'][0]:.2f} at the start, "
              f"{result['load_average_end'][0]:.2f} at the end.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5, help="timed windows per contender")
    parser.add_argument("--steps", type=int, default=3, help="train steps per window")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variants", default="default",
                        help="comma-separated Keras variants: default (the library's "
                        "setting), xla (training.jit_compile=true; 7x slower on this CPU)")
    parser.add_argument("--multiscale", default=None, metavar="SCALES",
                        help="comma-separated scales of --size: compare the multi-scale "
                        "layouts instead of timm")
    parser.add_argument("--layouts", default=",".join(MULTISCALE_LAYOUTS),
                        help=f"with --multiscale, comma-separated of {list(MULTISCALE_LAYOUTS)}")
    parser.add_argument("--backends", default=",".join(_installed_backends()),
                        help="comma-separated Keras backends to time our train step on: "
                        "tensorflow (in this process, each of --variants), jax, torch (each "
                        "in a subprocess); default: those installed")
    parser.add_argument("--no-timm", dest="timm", action="store_false",
                        help="leave out timm's PyTorch step")
    parser.add_argument("--name", default=None,
                        help="output file stem; default training_throughput at 256x256 "
                        "batch 64, else training_throughput_<size>_b<batch>")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--keras-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.torch_worker:
        return torch_worker(args)
    if args.keras_worker:
        return keras_worker(args)

    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    if args.multiscale:
        return multiscale_main(args)
    backends = [b for b in args.backends.split(",") if b]
    unknown = set(backends) - set(KERAS_NAMES)
    if unknown:
        parser.error(f"--backends: unknown {sorted(unknown)}; choose from {list(KERAS_NAMES)}")
    load_start = os.getloadavg()
    torch_contender = WorkerContender(args) if args.timm else None
    contenders = [torch_contender] if torch_contender else []
    if "tensorflow" in backends:
        for variant in args.variants.split(","):
            contenders.append(KerasContender(args, variant))
    for backend in backends:
        if backend != "tensorflow":
            contenders.append(WorkerContender(args, backend))
    for c in contenders:
        start = time.perf_counter()
        c.run(args.warmup)
        print(f"warm-up {c.name}: {time.perf_counter() - start:.1f} s", flush=True)
    windows: dict[str, list[dict]] = {c.name: [] for c in contenders}
    for r in range(args.rounds):
        order = contenders[r % len(contenders):] + contenders[:r % len(contenders)]
        for c in order:
            w = c.run(args.steps)
            w["images_per_second"] = args.steps * args.batch / w["seconds"]
            w["round"] = r
            windows[c.name].append(w)
            print(f"round {r} {c.name}: {w['images_per_second']:.2f} img/s "
                  f"(cpu {w['cpu_seconds'] / args.steps:.2f} s/step, loss {w['loss']:.3f})",
                  flush=True)
    for c in contenders:
        c.close()
    summary = {}
    for name, ws in windows.items():
        ips = [w["images_per_second"] for w in ws]
        summary[name] = {
            "images_per_second": statistics.median(ips), "min": min(ips), "max": max(ips),
            "cpu_seconds_per_step": statistics.median(w["cpu_seconds"] for w in ws) / args.steps,
        }
    for key, base_name in (("ratio_vs_timm", TORCH_NAME),
                           ("ratio_vs_tensorflow", KERAS_NAMES["tensorflow"])):
        base = summary.get(base_name, {}).get("images_per_second")
        for s in summary.values():
            s[key] = s["images_per_second"] / base if base else None
    result = {
        "benchmark": "training_throughput",
        "config": {"model": "mobilevitv2_050", "batch": args.batch, "size": args.size,
                   "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup,
                   "threads": args.threads, "precision": "float32", "classes": 1000,
                   "backends": backends},
        "environment": _environment(args.threads),
        "torch": torch_contender.info if torch_contender else None,
        "keras": {c.name: c.info for c in contenders if c is not torch_contender},
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
        "summary": summary,
        "windows": windows,
    }
    name = args.name or ("training_throughput" if (args.size, args.batch) == (256, 64)
                         else f"training_throughput_{args.size}_b{args.batch}")
    _write(args.out, name, result, _markdown(result))
    return 0


def _installed_backends() -> list[str]:
    """The Keras backends whose framework is installed here, TensorFlow first."""
    import importlib.util

    return [b for b in KERAS_NAMES if importlib.util.find_spec(b) is not None]


def _write(folder: str, name: str, result: dict, text: str) -> None:
    """`name.json` and `name.md` in `folder`, each written atomically; prints the table."""
    from keras_mvit2.utils.files import atomic_output, write_text

    os.makedirs(folder, exist_ok=True)
    with atomic_output(os.path.join(folder, f"{name}.json")) as tmp, open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    write_text(os.path.join(folder, f"{name}.md"), text)
    print(text)


def _multiscale_markdown(result: dict) -> str:
    c = result["config"]
    pairs = ", ".join(f"{s}x{s} x {b}" for s, b in c["pairs"])
    sizes = [str(s) for s, _ in c["pairs"]]
    lines = [
        f"Multi-scale training throughput, MobileViTV2-0.5, float32, CPU, {c['threads']} "
        f"threads, full train step (AdamW, label smoothing, global-norm clipping, EMA), "
        f"images in memory; (size, batch) pairs {pairs}; median of {c['rounds']} interleaved "
        f"windows of {c['steps']} steps per size after {c['warmup']} warm-up steps per size.",
        "",
        "| layout | " + " | ".join(f"{s}x{s} images/s" for s in sizes)
        + " | overall images/s | vs per resolution | first steps (s, tracing) |",
        "|---|" + "---|" * (len(sizes) + 3),
    ]
    base = result["summary"].get(MULTISCALE_LAYOUTS["per_resolution"], {}).get(
        "images_per_second")
    for name, s in result["summary"].items():
        ratio = f"{s['images_per_second'] / base:.2f}x" if base else "-"
        lines.append(
            f"| {name} | " + " | ".join(f"{s['per_size'][k]:.2f}" for k in sizes)
            + f" | {s['images_per_second']:.2f} | {ratio} | {s['first_steps_seconds']:.1f} |")
    e = result["environment"]
    lines += ["", f"TensorFlow {e['tensorflow']}, Keras {e['keras']}; {e['cpu_count']} CPUs "
              f"shared with other jobs, load average {result['load_average_start'][0]:.2f} at "
              f"the start, {result['load_average_end'][0]:.2f} at the end.", ""]
    return "\n".join(lines)


def multiscale_main(args: argparse.Namespace) -> int:
    """The multi-scale comparison of `MULTISCALE_LAYOUTS` (see the module docstring)."""
    from keras_mvit2 import data as mvdata

    scales = [float(s) for s in args.multiscale.split(",")]
    pairs = mvdata.multiscale_batch_pairs(args.size, args.batch, scales)
    load_start = os.getloadavg()
    contenders = [MultiscaleContender(args, layout, pairs)
                  for layout in args.layouts.split(",")]
    first: dict[str, float] = {}
    for c in contenders:
        w = c.run(1)
        first[c.name] = sum(v["seconds"] for v in w.values())
        if args.warmup > 1:
            c.run(args.warmup - 1)
        print(f"warm-up {c.name}: first steps {first[c.name]:.1f} s", flush=True)
    windows: dict[str, list[dict]] = {c.name: [] for c in contenders}
    for r in range(args.rounds):
        order = contenders[r % len(contenders):] + contenders[:r % len(contenders)]
        for c in order:
            w = {"round": r, "sizes": c.run(args.steps)}
            w["images_per_second"] = (sum(v["images"] for v in w["sizes"].values())
                                      / sum(v["seconds"] for v in w["sizes"].values()))
            windows[c.name].append(w)
            print(f"round {r} {c.name}: {w['images_per_second']:.2f} img/s", flush=True)
    summary = {}
    for c in contenders:
        ws = windows[c.name]
        ips = [w["images_per_second"] for w in ws]
        summary[c.name] = {
            "images_per_second": statistics.median(ips), "min": min(ips), "max": max(ips),
            "per_size": {str(size): statistics.median(
                w["sizes"][str(size)]["images"] / w["sizes"][str(size)]["seconds"] for w in ws)
                for size, _ in pairs},
            "first_steps_seconds": first[c.name],
        }
    result = {
        "benchmark": "training_throughput_multiscale",
        "config": {"model": "mobilevitv2_050", "base_batch": args.batch,
                   "base_size": args.size, "scales": scales, "pairs": pairs,
                   "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup,
                   "threads": args.threads, "precision": "float32", "classes": 1000},
        "environment": _environment(args.threads),
        "keras": {c.name: c.info for c in contenders},
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
        "summary": summary,
        "windows": windows,
    }
    _write(args.out, "training_throughput_multiscale", result, _multiscale_markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
