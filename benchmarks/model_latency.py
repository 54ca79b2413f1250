"""Model latency table, the paper's Table 2 / Fig. 2 axes (one command).

    python benchmarks/model_latency.py [--runs 40] [--out benchmarks/results]

MobileViTv2-0.5/0.75/1.0, MobileViT v1 XXS/XS/S (256x256) and keras.applications
MobileNetV2 / EfficientNet-B0 (224x224), random weights, float32 and full-integer
int8 (calibrated on random images: latency only), all timed interleaved on 1 thread
with XNNPACK, next to the shared kecam MobileViTv2-0.5 anchors (the peer) when
`shared/anchors/` is there. Writes ``model_latency.json`` (BenchResult list),
``model_latency.md``, ``model_latency.png`` and ``model_latency_skipped.json``.
"""

import argparse
import glob
import os
import sys

from keras_mvit2.latency.models_table import (
    DEFAULT_MODELS,
    load_models_table,
    models_markdown,
    run_models_table,
    write_models_table,
)


def _anchors(here: str) -> list[str]:
    for root in (os.path.join(here, "..", "..", "shared"), os.path.join(here, "..", "shared"),
                 "/work/shared"):
        found = sorted(glob.glob(os.path.join(root, "anchors", "*.tflite")))
        if found:
            return found
    return []


def main(argv: list[str] | None = None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-peers", action="store_true", help="leave out the shared anchors")
    parser.add_argument("--out", default=os.path.join(here, "results"))
    parser.add_argument("--replot", action="store_true",
                        help="only re-render the table and plot from OUT/model_latency.json")
    args = parser.parse_args(argv)
    if args.replot:
        table = load_models_table(os.path.join(args.out, "model_latency.json"))
        write_models_table(table, args.out)
        print(models_markdown(table))
        return 0
    peers = [] if args.no_peers else _anchors(here)
    table = run_models_table(
        args.models, threads=args.threads, runs=args.runs, warmup=args.warmup,
        rounds=args.rounds, peers=peers, log=print,
    )
    paths = write_models_table(table, args.out)
    print(models_markdown(table))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
