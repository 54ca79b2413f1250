import os, sys; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_nb import write, COLAB_NOTE, INSTALL
name = "04_benchmark.ipynb"
write(name, [
("md", f"""
# Benchmark: latency on this machine, attention vs tokens, and on a phone

{COLAB_NOTE}

Measure the batch-1 latency of exported MobileViTV2-0.5 files in LiteRT on this machine
(float32 with XNNPACK on and off, float16), reproduce the paper's Fig. 1 (one attention layer of
each mechanism against the number of tokens), and run the same measurements on an Android
phone or an iPhone. Every harness writes the same JSON record, so the results of all devices
merge into one table.
"""),
("code", INSTALL),
("md", """
## Settings

Latency does not depend on the weights, so a randomly initialized float model is fine for
timing. `MVIT2_SMALL=1` (the project's CI) uses a
smaller input, few timed runs and three token counts; without it the notebook measures the
deployment size (256x256) and the paper's sweep (64 to 2048 tokens, d = 512).
"""),
("code", """
import os

from keras_mvit2.latency.attention_sweep import PAPER_TOKENS

SMALL = os.environ.get("MVIT2_SMALL", "0") == "1"
SIZE = 128 if SMALL else 256        # model input
RUNS = 20 if SMALL else 100         # timed invokes per measurement
THREADS = 1                         # interpreter threads (the paper: one core)
TOKENS = (64, 128, 256) if SMALL else PAPER_TOKENS
DIM = 128 if SMALL else 512         # token width of the attention sweep
OUT = "mvit2_outputs"  # files written by this notebook
os.makedirs(OUT, exist_ok=True)
"""),
("md", """
## 1. Export the model to time

Float32 and float16 TFLite files of MobileViTV2-0.5, batch 1 (float16 weights are expanded to
float32 when the model loads on a CPU). Full-integer int8 needs trained weights, because its
activation ranges are calibrated on real images (with random weights they collapse):
`03_quantize_and_export.ipynb` exports the int8 file of a trained model, and `mvit2 demo`
benchmarks one; `bench_tflite` below times any `.tflite` file the same way.
"""),
("code", """
import keras_mvit2 as mv

model = mv.mobilevitv2_050(input_shape=(SIZE, SIZE, 3))
float32 = mv.export.to_tflite(model, f"{OUT}/mobilevitv2_050_float32.tflite")
float16 = mv.export.to_tflite(model, f"{OUT}/mobilevitv2_050_float16.tflite",
                              quantization="float16")
for report in (float32, float16):
    print(f"{report.path}: {report.size_bytes / 1e6:.2f} MB, {report.num_ops} ops, "
          f"{report.num_xnnpack_partitions} XNNPACK partition(s)")
"""),
("md", """
## 2. Host latency

`bench_tflite` times `Interpreter.invoke()` alone after a warm-up and reports min / median /
p90 / max, plus the peak memory of a fresh process that loads and runs the model. `compare`
puts records side by side (rows: model and precision; columns: device, runtime, threads,
delegate); `mvit2 bench FILE.tflite --json host.json` is the command-line version.
"""),
("code", """
from IPython.display import Markdown

from keras_mvit2.latency import compare, save_results
from keras_mvit2.latency.host import bench_tflite

results = [bench_tflite(float32.path, runs=RUNS, threads=THREADS),
           bench_tflite(float32.path, runs=RUNS, threads=THREADS, xnnpack=False),
           bench_tflite(float16.path, runs=RUNS, threads=THREADS)]
save_results(results, f"{OUT}/host_bench.json")
for r in results:
    print(f"{r.model['name']:>28s} {r.runtime['delegate']:>7s}: median "
          f"{r.latency_ms.median:.2f} ms, p90 {r.latency_ms.p90:.2f} ms, "
          f"peak memory {r.peak_memory_mb} MB")
Markdown(compare(results).to_markdown())
"""),
("md", """
## 3. Attention latency vs number of tokens (the paper's Fig. 1)

One attention layer of each mechanism on a `(1, k, d)` input, converted to float32 TFLite and
timed interleaved for every k (so machine drift hits all of them alike). Multi-head attention
grows with k squared; separable self-attention grows linearly and needs no batched matrix
product. The left panel splits each mechanism's time by op type at one k (each op timed in
isolation). `mvit2 bench-attention` runs the same sweep from the command line.
"""),
("code", """
from IPython.display import Image, display

from keras_mvit2.latency.attention_sweep import run_attention_sweep, sweep_markdown, write_sweep

sweep = run_attention_sweep(tokens=TOKENS, dim=DIM, threads=THREADS,
                            runs=10 if SMALL else 30, rounds=2 if SMALL else 5,
                            profile_tokens=(TOKENS[1],) if SMALL else (256,),
                            profile_runs=3 if SMALL else 10)
files = write_sweep(sweep, f"{OUT}/attention_sweep")
display(Markdown(sweep_markdown(sweep)))
Image(files["png"])
"""),
("md", """
## 4. On a phone

The phone harnesses write the same records; `harness/README.md` has every step.

**Android** (TFLite / LiteRT over `adb`, with the official `benchmark_model` binary for the
phone's CPU; CPU with or without XNNPACK, GPU, NNAPI):

```sh
mvit2 bench-android mvit2_outputs/mobilevitv2_050_float32.tflite \\
    mvit2_outputs/mobilevitv2_050_float16.tflite \\
    --benchmark-model android_aarch64_benchmark_model \\
    --delegate xnnpack gpu --threads 1 4 --repeats 3 -o pixel.json
```

**iPhone / Mac** (Core ML, the Swift package in `harness/ios`): export with
`mv.export.to_coreml(model, "mobilevitv2_050.mlpackage")`, then on a Mac

```sh
cd harness/ios
swift run -c release mvit2-coreml-bench ../../mobilevitv2_050.mlpackage \\
    --compute-units cpu_only cpu_and_gpu cpu_and_ne all --output ../../mac.json
```

or on an iPhone the XCTest `MViT2DeviceBenchmarks` through `xcodebuild test` (see
`harness/README.md`, section 3).

**One table for all devices**:

```sh
mvit2 bench-report mvit2_outputs/host_bench.json pixel.json mac.json --markdown latency.md
```
"""),
])
