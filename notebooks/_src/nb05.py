import os, sys; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_nb import write, COLAB_NOTE, INSTALL
name = "05_attention_zoo.ipynb"
write(name, [
("md", f"""
# The attention zoo: swap the attention of MobileViTv2 and DeiT

{COLAB_NOTE}

Every attention layer of keras_mvit2 has one interface, so the attention of any model is one
argument: `attention="separable" | "mha" | "linformer" | "rfa" | "mobile_attention"`. This
notebook builds MobileViTv2-0.5 and DeiT-Tiny with each mechanism and compares parameters, MACs,
TFLite ops and latency on this machine (LiteRT, 1 thread, batch 1).
"""),
("code", INSTALL),
("code", """
import os

SMALL = os.environ.get("MVIT2_SMALL", "0") == "1"  # CI: small inputs, few timed runs
SIZE = 64 if SMALL else 256        # MobileViTv2 input
DEIT_SIZE = 64 if SMALL else 224   # DeiT input
RUNS = 10 if SMALL else 100
OUT = "mvit2_outputs"
os.makedirs(OUT, exist_ok=True)
"""),
("md", """
## 1. The registry

`mv.attention.get(name, **kwargs)` makes a layer; `mv.attention.available()` lists them.
Linformer projects the keys and values along the token axis to a fixed number of tokens, so it
is built for one token count (one input resolution).
"""),
("code", """
import keras_mvit2 as mv

print(mv.attention.available())
MECHANISMS = {
    "separable": "separable",
    "mha": {"name": "mha"},
    "linformer": {"name": "linformer", "projected_tokens": 8 if SMALL else 64},
    "rfa": {"name": "rfa"},
    "mobile_attention": {"name": "mobile_attention"},
}
"""),
("md", """
## 2. Build, profile, export and time every combination

`mv.profile` counts parameters and MACs (convolutions and matrix products); `to_tflite` converts
with builtin ops only and checks the file in LiteRT; `bench_tflite` times it.
"""),
("code", """
from keras_mvit2.latency.host import bench_tflite

rows = []
for host in ("mobilevitv2_050", "deit_tiny"):
    size = SIZE if host.startswith("mobilevit") else DEIT_SIZE
    for name, attention in MECHANISMS.items():
        model = mv.create_model(host, input_shape=(size, size, 3), attention=attention)
        profile = mv.profile(model)
        path = f"{OUT}/{host}_{name}.tflite"
        report = mv.export.to_tflite(model, path)
        result = bench_tflite(path, runs=RUNS, warmup=3, measure_memory=False)
        rows.append({
            "model": host, "attention": name, "params": profile.params,
            "GMACs": round(profile.gmacs, 3), "ops": report.num_ops,
            "BATCH_MATMUL": report.op_histogram.get("BATCH_MATMUL", 0),
            "TRANSPOSE": report.op_histogram.get("TRANSPOSE", 0),
            "median_ms": round(result.latency_ms.median, 2),
        })

header = list(rows[0])
print(" | ".join(header))
for row in rows:
    print(" | ".join(str(row[k]) for k in header))
"""),
("md", """
## 3. Latency at a glance

On phones the paper's point is that separable self-attention needs neither batched matrix
products nor transposes (element-wise ops only); the table above shows it in the converted graph.
"""),
("code", """
import matplotlib.pyplot as plt

fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
for ax, host in zip(axes, ("mobilevitv2_050", "deit_tiny")):
    subset = [r for r in rows if r["model"] == host]
    ax.bar([r["attention"] for r in subset], [r["median_ms"] for r in subset])
    ax.set_title(f"{host} (LiteRT, 1 thread)")
    ax.set_ylabel("median latency (ms)")
    ax.tick_params(axis="x", rotation=30)
fig.tight_layout()
fig.savefig(f"{OUT}/attention_zoo.png")
plt.show()
"""),
("md", """
The single-layer version of this comparison over 64 to 2048 tokens (the paper's Fig. 1) is
`mvit2 bench-attention`; `04_benchmark.ipynb` runs it.
"""),
])
