"""Where the float32 TFLite time goes: our MobileViTV2-0.5 vs the kecam peer, stage by stage.

    python benchmarks/latency_breakdown.py [--out benchmarks/results/latency_breakdown.json]
        [--rounds 40] [--invokes 5]

Batch 1, 256x256, 1 thread, XNNPACK, float32. Each model is cut into prefixes that end
with the last operator working at a spatial resolution (128, 64, 32, 16: the end of the
layers run at that map size, MobileViT blocks included) and the whole model; every
prefix is a valid model (its last operator's output becomes the model output, and every
earlier operator feeds it). All prefixes of both models are timed in interleaved rounds
(thread CPU time medians, as `benchmarks/latency.py`); the time of a segment is the
difference of consecutive prefixes.

The two models have the same architecture, so their segments match: the convolution
stem and the inverted residuals up to 64x64 are the same operators in both, the
MobileViT blocks (32x32, 16x16, 8x8) differ by their attention, unfold/fold and group
norm. Latency does not depend on the weights: ours are random.

Prints a table and writes JSON (atomically).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from latency import SIZE, _find_anchor, _stats, environment

RESOLUTIONS = (128, 64, 32, 16)  # the rest: the 8x8 stage and the head


def cut_points(path: str) -> dict[str, int]:
    """Prefix lengths (operator counts): through the last operator whose output is a
    `(1, s, s, C)` map, for each resolution `s`, then the whole model."""
    from keras_mvit2.export.tflite.flatbuffer import parse_flatbuffer

    graph = parse_flatbuffer(path).subgraphs[0]
    points = {}
    for size in RESOLUTIONS:
        last = None
        for index, op in enumerate(graph.operators):
            shape = list(graph.tensors[op.outputs[0]].shape)
            if len(shape) == 4 and shape[1] == shape[2] == size:
                last = index
        if last is None:
            raise ValueError(f"{path}: no operator outputs a {size}x{size} map.")
        points[f"through {size}x{size}"] = last + 1
    points["whole model"] = len(graph.operators)
    return points


def prefix_model(path: str, num_ops: int) -> bytes:
    """The model's first `num_ops` operators as a model whose output is the last one's."""
    from keras_mvit2.export.tflite.flatbuffer import parse_flatbuffer, serialize_flatbuffer

    model = parse_flatbuffer(path)
    graph = model.subgraphs[0]
    if num_ops < len(graph.operators):
        graph.outputs = [graph.operators[num_ops - 1].outputs[0]]
        graph.operators = graph.operators[:num_ops]
        model.signatureDefs = None  # they name the original outputs
    return serialize_flatbuffer(model)


def _our_model(out_dir: str) -> str:
    import keras_mvit2 as mv

    model = mv.models.MobileViTV2(0.5, input_shape=(SIZE, SIZE, 3))
    return mv.export.to_tflite(model, os.path.join(out_dir, "ours_fp32.tflite")).path


def _table(result: dict) -> None:
    rows = result["segments"]
    print(f"\n{'segment':34s} {'ours ms':>9s} {'kecam ms':>9s} {'ours/kecam':>11s}")
    for row in rows:
        print(f"{row['segment']:34s} {row['ours_ms']:9.3f} {row['kecam_ms']:9.3f} "
              f"{row['ratio']:11.3f}")
    total = result["whole_model"]
    print(f"{'whole model':34s} {total['ours_ms']:9.3f} {total['kecam_ms']:9.3f} "
          f"{total['ratio']:11.3f}")


def main(argv: list[str] | None = None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(here, "results",
                                                      "latency_breakdown.json"))
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--invokes", type=int, default=5, help="invokes per prefix per round")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--peer-fp32")
    args = parser.parse_args(argv)

    from keras_mvit2.latency.host import make_interpreter, measure_interleaved

    env = environment()
    with tempfile.TemporaryDirectory(prefix="mvit2_breakdown_") as tmp:
        paths = {"ours": _our_model(tmp),
                 "kecam": _find_anchor("kecam_mobilevit_v2_050_fp32.tflite", args.peer_fp32)}
        points = {name: cut_points(path) for name, path in paths.items()}
        interpreters = {
            (name, label): make_interpreter(prefix_model(path, count), threads=1)
            for name, path in paths.items() for label, count in points[name].items()
        }
        print(f"timing {len(interpreters)} prefixes: {args.rounds} interleaved rounds x "
              f"{args.invokes} invokes ...", file=sys.stderr, flush=True)
        times = measure_interleaved(interpreters, runs=args.rounds * args.invokes,
                                    warmup=args.warmup, rounds=args.rounds)
    env["loadavg_after"] = list(os.getloadavg())
    cumulative = {key: _stats(samples)["median_ms"] for key, samples in times.items()}

    labels = list(points["ours"])
    segments, previous = [], {"ours": 0.0, "kecam": 0.0}
    for label in labels:
        ours = cumulative[("ours", label)] - previous["ours"]
        kecam = cumulative[("kecam", label)] - previous["kecam"]
        segments.append({"segment": label.replace("through", "up to and at")
                         if label != "whole model" else "8x8 stage and classifier head",
                         "ours_ms": ours, "kecam_ms": kecam, "ratio": ours / kecam,
                         "ours_ops": points["ours"][label], "kecam_ops": points["kecam"][label]})
        previous = {"ours": cumulative[("ours", label)], "kecam": cumulative[("kecam", label)]}
    whole = {"ours_ms": cumulative[("ours", "whole model")],
             "kecam_ms": cumulative[("kecam", "whole model")]}
    whole["ratio"] = whole["ours_ms"] / whole["kecam_ms"]
    shared = sum(s["kecam_ms"] for s in segments[:2])
    mobilevit = {name: sum(s[f"{name}_ms"] for s in segments[2:]) for name in ("ours", "kecam")}
    result = {
        "benchmark": "keras_mvit2 float32 TFLite latency by stage vs kecam (issue 5)",
        "settings": {"batch": 1, "input": [SIZE, SIZE, 3], "threads": 1, "xnnpack": True,
                     "rounds": args.rounds, "invokes_per_round": args.invokes,
                     "statistic": "median thread CPU time of each prefix; segment = "
                                  "difference of consecutive prefixes"},
        "environment": env,
        "cumulative_ms": {f"{name}|{label}": value
                          for (name, label), value in cumulative.items()},
        "segments": segments,
        "whole_model": whole,
        "identical_prefix_share_of_kecam": shared / whole["kecam_ms"],
        "from_32x32_on": {**mobilevit, "ratio": mobilevit["ours"] / mobilevit["kecam"]},
        "fp32_bar": 0.9,
        "ours_ms_needed_for_bar": 0.9 * whole["kecam_ms"],
    }
    from keras_mvit2.utils.files import write_json

    write_json(args.out, result)
    _table(result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
