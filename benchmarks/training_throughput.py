"""Training throughput on CPU: our MobileViTV2-0.5 (Keras) vs timm's in PyTorch (one command).

    python benchmarks/training_throughput.py [--batch 64] [--size 256] [--rounds 5]
        [--steps 3] [--threads 2] [--variants default,xla] [--out benchmarks/results]

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

The frameworks are timed in interleaved rounds (each round: a window of `--steps` steps
of every contender, in a rotating order) after warm-up steps, so that load from other
processes on a shared machine hits all of them alike; the figure is the median over the
rounds of images / second of a window. Process CPU time is recorded per window.
Writes ``training_throughput.json`` and ``training_throughput.md``.
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

    count = 0
    info = {"torch": torch.__version__, "timm": timm.__version__,
            "threads": torch.get_num_threads(), "mkldnn": torch.backends.mkldnn.is_available(),
            "params": sum(p.numel() for p in model.parameters()),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
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


class TorchContender:
    """The PyTorch worker process, driven window by window."""

    name = "timm (PyTorch)"

    def __init__(self, args: argparse.Namespace):
        import subprocess

        cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker",
               "--batch", str(args.batch), "--size", str(args.size),
               "--threads", str(args.threads)]
        # PASSIVE: idle OpenMP threads sleep instead of spinning. On a shared machine the
        # spinning default made timm's step 1.6x slower (21 s vs 13 s at load 5-7 on 2 cores).
        env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "OMP_NUM_THREADS": str(args.threads)}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        self.info = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"The PyTorch worker exited (status {self.proc.wait()}); "
                               "run it alone with --torch-worker to see why.")
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

        self.name = {"default": "ours (Keras, TF)", "xla": "ours (Keras, TF, XLA)"}[variant]
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
        "| contender | images/s (median) | min | max | CPU s / step | vs timm |",
        "|---|---|---|---|---|---|",
    ]
    base = result["summary"][TorchContender.name]["images_per_second"]
    for name, s in result["summary"].items():
        lines.append(
            f"| {name} | {s['images_per_second']:.2f} | {s['min']:.2f} | {s['max']:.2f} | "
            f"{s['cpu_seconds_per_step']:.2f} | {s['images_per_second'] / base:.2f}x |")
    e = result["environment"]
    lines += ["", f"TensorFlow {e['tensorflow']}, Keras {e['keras']}, torch "
              f"{result['torch']['torch']}, timm {result['torch']['timm']}; {e['cpu_count']} "
              f"CPUs, load average {result['load_average_start'][0]:.2f} at the start, "
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
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.torch_worker:
        return torch_worker(args)

    import tensorflow as tf

    from keras_mvit2.utils.files import atomic_output

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    load_start = os.getloadavg()
    torch_contender = TorchContender(args)
    contenders = [torch_contender]
    for variant in args.variants.split(","):
        contenders.append(KerasContender(args, variant))
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
    base = summary[torch_contender.name]["images_per_second"]
    for s in summary.values():
        s["ratio_vs_timm"] = s["images_per_second"] / base
    result = {
        "benchmark": "training_throughput",
        "config": {"model": "mobilevitv2_050", "batch": args.batch, "size": args.size,
                   "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup,
                   "threads": args.threads, "precision": "float32", "classes": 1000},
        "environment": _environment(args.threads),
        "torch": torch_contender.info,
        "keras": {c.name: c.info for c in contenders if c is not torch_contender},
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
        "summary": summary,
        "windows": windows,
    }
    os.makedirs(args.out, exist_ok=True)
    with atomic_output(os.path.join(args.out, "training_throughput.json")) as tmp, \
            open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    text = _markdown(result)
    with atomic_output(os.path.join(args.out, "training_throughput.md")) as tmp, \
            open(tmp, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
