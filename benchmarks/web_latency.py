"""Latency of exported MobileViTV2 files in the browser (MediaPipe Tasks web, headless
Chromium) beside LiteRT on the same machine.

    python benchmarks/web_latency.py [--sizes 32 256] [--runs 100] [--rounds 5]
        [--out benchmarks/results]

For each input size, MobileViTV2-0.5 (random weights: latency does not depend on them;
10 classes at 32x32, 1000 at 256x256) is exported as a `.web` page folder in float32 and in
full int8 (float I/O, calibrated on random images). Each file is timed, interleaved round
by round (`--rounds` blocks of `--runs / --rounds` runs, so a slow phase of a shared machine
hits all alike), in:

- ``browser``: the page's task call (``ImageClassifier.classify``: image in, categories
  out, WebAssembly + XNNPACK on one thread: MediaPipe's web build has no other), a random
  uint8 image of the model's size, in Chromium's headless mode;
- ``litert_1`` / ``litert_N``: `Interpreter.invoke()` of ai-edge-litert with XNNPACK, 1
  thread and the machine's cores (N).

Writes ``web_latency.json`` (samples' medians, quartiles, min) and ``web_latency.md``.
"""

import argparse
import json
import os
import platform
import sys
import tempfile

import numpy as np


def _stats(samples: list[float]) -> dict:
    q = np.percentile(np.asarray(samples), [25, 50, 75])
    return {"median": float(q[1]), "q1": float(q[0]), "q3": float(q[2]),
            "min": float(min(samples)), "runs": len(samples)}


def run(sizes: list[int], runs: int, rounds: int, warmup: int, log=print) -> dict:
    import keras

    import keras_mvit2 as mv
    from keras_mvit2.export import get_target
    from keras_mvit2.export.web import Browser, serve
    from keras_mvit2.latency.litert_timing import make_interpreter, measure_interleaved

    web = get_target("web")
    cores = os.cpu_count() or 1
    rows = []
    with tempfile.TemporaryDirectory() as work, Browser() as browser:
        for size in sizes:
            keras.utils.set_random_seed(0)
            model = mv.MobileViTV2(0.5, input_shape=(size, size, 3),
                                   classes=10 if size <= 64 else 1000)
            calibration = np.random.default_rng(0).uniform(0, 1, (32, size, size, 3))
            image = np.random.default_rng(1).integers(0, 256, (size, size, 3), np.uint8)
            for quantization in ("float32", "int8"):
                path = os.path.join(work, f"mobilevitv2_050_{size}_{quantization}.web")
                web.convert(model, path, quantization=quantization,
                            calibration_data=calibration.astype("float32")
                            if quantization == "int8" else None)
                tflite = os.path.join(path, "model.tflite")
                interpreters = {f"litert_{t}": make_interpreter(tflite, threads=t)
                                for t in sorted({1, cores})}
                samples = {"browser": [], **{k: [] for k in interpreters}}
                with serve(path) as url:
                    page = browser.open(url)
                    page.bench(image, runs=1, warmup=warmup)
                    measure_interleaved(interpreters, runs=1, warmup=warmup, rounds=1)
                    for block in [runs // rounds] * rounds:
                        samples["browser"] += page.bench(image, runs=block, warmup=0)
                        timed = measure_interleaved(interpreters, runs=block, warmup=0,
                                                    rounds=1)
                        for key, value in timed.items():
                            samples[key] += value.wall_ms
                    page.close()
                row = {"model": "mobilevitv2_050", "size": size, "quantization": quantization,
                       **{k: _stats(v) for k, v in samples.items()}}
                log(f"{size}x{size} {quantization}: " + ", ".join(
                    f"{k} {row[k]['median']:.2f} ms" for k in samples))
                rows.append(row)
        chromium = browser.version
    from keras_mvit2.export.web import TASKS_VISION_VERSION

    return {"rows": rows, "runs": runs, "rounds": rounds, "warmup": warmup, "cores": cores,
            "chromium": chromium, "mediapipe_tasks_vision": TASKS_VISION_VERSION,
            "machine": platform.platform(), "python": platform.python_version(),
            "load_average": list(os.getloadavg())}


def markdown(result: dict) -> str:
    cores = result["cores"]
    keys = ["browser", "litert_1"] + ([f"litert_{cores}"] if cores > 1 else [])
    head = ("MobileViTV2-0.5 (random weights), batch 1; median ms (IQR) of "
            f"{result['runs']} runs in {result['rounds']} interleaved rounds; Chromium "
            f"{result['chromium']} headless, @mediapipe/tasks-vision "
            f"{result['mediapipe_tasks_vision']} (WebAssembly + XNNPACK, 1 thread); "
            f"ai-edge-litert with XNNPACK; {cores} CPUs, load average "
            f"{', '.join(f'{x:.1f}' for x in result['load_average'])}.\n\n")
    names = {"browser": "browser (1 thread)", "litert_1": "LiteRT 1 thread",
             f"litert_{cores}": f"LiteRT {cores} threads"}
    lines = ["| input | format | " + " | ".join(names[k] for k in keys) + " | browser / LiteRT 1 |",
             "|---|---|" + "---:|" * (len(keys) + 1)]
    for row in result["rows"]:
        cells = [f"{row[k]['median']:.2f} ({row[k]['q1']:.2f}-{row[k]['q3']:.2f})"
                 for k in keys]
        ratio = row["browser"]["median"] / row["litert_1"]["median"]
        lines.append(f"| {row['size']}x{row['size']} | {row['quantization']} | "
                     + " | ".join(cells) + f" | {ratio:.1f}x |")
    return head + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--out", default=os.path.join("benchmarks", "results"))
    args = parser.parse_args(argv)
    result = run(args.sizes, args.runs, args.rounds, args.warmup,
                 log=lambda m: print(m, file=sys.stderr))
    from keras_mvit2.utils.files import write_json, write_text

    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "web_latency.json"), result)
    write_text(os.path.join(args.out, "web_latency.md"), markdown(result))
    print(json.dumps(result["rows"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
