"""The paper's Fig. 1 in TFLite: one attention layer per mechanism vs tokens (one command).

    python benchmarks/attention_latency.py [--runs 40] [--out benchmarks/results]

Writes ``attention_latency.json`` (one `BenchResult` per mechanism and k, mergeable
with `mvit2 bench-report`), ``attention_latency_summary.json`` (median table, the
issue's bars, op breakdown), ``attention_latency.md`` and ``attention_latency.png``.
d=512, k in {64, ..., 2048}, 1 thread, float32, XNNPACK, mechanisms interleaved per k;
op breakdown at k=256 (the paper's) and k=2048.
"""

import argparse
import os
import sys

from keras_mvit2.latency.attention_sweep import (
    PAPER_TOKENS,
    load_sweep,
    run_attention_sweep,
    sweep_markdown,
    write_sweep,
)


def main(argv: list[str] | None = None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="timed runs per layer and k")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=8, help="interleaving rounds per k")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--tokens", type=int, nargs="+", default=list(PAPER_TOKENS))
    parser.add_argument("--profile-tokens", type=int, nargs="*", default=[256, 2048])
    parser.add_argument("--out", default=os.path.join(here, "results"))
    parser.add_argument("--keep-models", metavar="DIR", help="keep the .tflite files in DIR")
    parser.add_argument("--replot", action="store_true",
                        help="only re-render the table and plot from OUT/attention_latency*.json")
    args = parser.parse_args(argv)
    if args.replot:
        sweep = load_sweep(os.path.join(args.out, "attention_latency.json"))
        write_sweep(sweep, args.out)
        print(sweep_markdown(sweep))
        return 0
    sweep = run_attention_sweep(
        tokens=args.tokens, dim=args.dim, runs=args.runs, warmup=args.warmup,
        rounds=args.rounds, profile_tokens=args.profile_tokens, models_dir=args.keep_models,
        log=print,
    )
    paths = write_sweep(sweep, args.out)
    print(sweep_markdown(sweep))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
