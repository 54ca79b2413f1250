"""`mvit2 bench`, `mvit2 bench-attention`, `mvit2 bench-models`, `mvit2 bench-report`."""

from __future__ import annotations

import argparse
import os
import sys

from keras_mvit2.cli.failure import CommandFailedError


def register(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="batch-1 latency of a .tflite / .keras / registered model on this host (LiteRT)",
        description="Times a model at batch 1 in ai_edge_litert (XNNPACK on by default): "
        "latency min/median/p90/max, peak memory (fresh subprocess), size, MACs, op "
        "histogram. A .keras file or a registered name is converted to a temporary float32 "
        ".tflite first. A .mlpackage runs with coremltools (macOS only).",
    )
    p.add_argument("models", nargs="+", metavar="MODEL",
                   help="MODEL.tflite, MODEL.keras, MODEL.mlpackage or a registered name")
    p.add_argument("--threads", type=int, default=1, help="interpreter threads (default 1)")
    p.add_argument("--runs", type=int, default=100, help="timed runs (default 100)")
    p.add_argument("--warmup", type=int, default=10, help="untimed runs first (default 10)")
    p.add_argument("--no-xnnpack", action="store_true",
                   help="plain TFLite kernels (BUILTIN_WITHOUT_DEFAULT_DELEGATES)")
    p.add_argument("--input-size", type=int, nargs="+", metavar="PX",
                   help="registered names only: one value (square) or height width "
                   "(default 256)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory probe")
    p.add_argument("--compute-units", default="all",
                   choices=["all", "cpu_only", "cpu_and_gpu", "cpu_and_ne"],
                   help=".mlpackage only: Core ML compute units (default all)")
    p.add_argument("--json", dest="json_path", help="write the records (JSON list) here")
    p.set_defaults(handler=_bench)

    p = sub.add_parser(
        "bench-attention",
        help="the paper's Fig. 1: one attention layer per mechanism vs number of tokens",
        description="Converts one attention layer of each mechanism on a (1, k, d) input "
        "to float32 TFLite and times them interleaved per k (1 thread by default); writes "
        "JSON records, a summary JSON, a markdown table and a log-log PNG plot.",
    )
    p.add_argument("--mechanisms", nargs="+", help="default: every registered mechanism")
    p.add_argument("--tokens", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 2048])
    p.add_argument("--dim", type=int, default=512, help="token width d (default 512)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=5, help="interleaving rounds per k")
    p.add_argument("--profile-tokens", type=int, nargs="*", default=[256],
                   help="k values for the per-op breakdown (default 256, as the paper)")
    _add_output_arguments(p, "bench_attention")
    p.set_defaults(handler=_bench_attention)

    p = sub.add_parser(
        "bench-models",
        help="latency vs MACs vs parameters of MobileViTv2/v1 and CNN references, fp32 + int8",
        description="Builds each model with random weights, converts it to float32 and "
        "int8 TFLite (int8 calibrated on random images: latency only), times all files "
        "interleaved and writes JSON records, a markdown table and a PNG plot.",
    )
    p.add_argument("--models", nargs="+", help="registered names and/or mobilenetv2, "
                   "efficientnetb0 (default: the paper's comparison set)")
    p.add_argument("--precisions", nargs="+", default=["float32", "int8"],
                   choices=["float32", "int8"])
    p.add_argument("--input-size", type=int, help="one square size for every model "
                   "(default: native, 256 for MobileViT, 224 for the CNNs)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--peer", nargs="*", default=[], metavar="TFLITE",
                   help="extra .tflite files timed in the same run (e.g. shared anchors)")
    p.add_argument("--no-memory", action="store_true")
    _add_output_arguments(p, "bench_models")
    p.set_defaults(handler=_bench_models)

    p = sub.add_parser(
        "bench-report",
        help="merge benchmark JSON files from several devices into one comparison table",
    )
    p.add_argument("files", nargs="+", metavar="JSON", help="files written by the harnesses")
    p.add_argument("--markdown", help="write the table as markdown here")
    p.add_argument("--csv", dest="csv_path", help="write the table as CSV here")
    p.add_argument("--json", dest="json_path", help="write the table as JSON here")
    p.set_defaults(handler=_bench_report)


def _add_output_arguments(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--out", default=default, help="output folder")
    p.add_argument("--keep-models", action="store_true",
                   help="keep the .tflite files in OUT/models")


def _log(message: str) -> None:
    print(message, file=sys.stderr)


def _models_dir(args: argparse.Namespace) -> str | None:
    return os.path.join(args.out, "models") if args.keep_models else None


def _print_report(markdown: str, paths: dict[str, str]) -> int:
    """Prints a harness's markdown table, then the files it wrote (on stderr)."""
    print(markdown)
    for kind, path in paths.items():
        _log(f"{kind}: {path}")
    return 0


def _print_results(results) -> None:
    from rich.markup import escape
    from rich.table import Table

    from keras_mvit2.utils.console import output_console

    table = Table("model", "format", "size (MB)", "params (M)", "MACs (G)", "threads",
                  "delegate", "min", "median", "p90", "max", "cpu median", "peak mem (MB)",
                  title="keras_mvit2 bench (latency in ms, batch 1; cpu = invoking thread's CPU "
                  "time, 1 thread only)")
    for r in results:
        m, rt, lat = r.model, r.runtime, r.latency_ms
        kind = "/".join(str(x) for x in (m.get("format"), m.get("precision")) if x)
        table.add_row(
            escape(str(m.get("name"))), escape(kind),
            f"{m['size_bytes'] / 1e6:.2f}" if m.get("size_bytes") else "-",
            f"{m['params'] / 1e6:.2f}" if m.get("params") else "-",
            f"{m['macs'] / 1e9:.3f}" if m.get("macs") else "unknown",
            str(rt.get("threads") or "-"), str(rt.get("delegate")),
            f"{lat.min:.3f}", f"{lat.median:.3f}", f"{lat.p90:.3f}", f"{lat.max:.3f}",
            f"{r.extra['cpu_ms']['median']:.3f}" if "cpu_ms" in r.extra else "-",
            "-" if r.peak_memory_mb is None else f"{r.peak_memory_mb:.1f}",
        )
    console = output_console()  # piped: the table is not squeezed into 80 columns
    console.print(table)
    for r in results:
        ops = ", ".join(f"{k} {v}" for k, v in sorted(r.op_histogram.items(),
                                                      key=lambda kv: -kv[1]))
        console.print(f"[bold]{escape(str(r.model.get('name')))}[/bold] ops: {ops}",
                      highlight=False)


def _bench(args: argparse.Namespace) -> int:
    from keras_mvit2.latency.host import bench
    from keras_mvit2.latency.schema import save_results

    results = []
    for spec in args.models:
        try:
            results.append(bench(
                spec, threads=args.threads, runs=args.runs, warmup=args.warmup,
                xnnpack=not args.no_xnnpack, input_size=args.input_size,
                measure_memory=not args.no_memory, compute_units=args.compute_units, log=_log,
            ))
        except RuntimeError as err:
            raise CommandFailedError(str(err), status=2) from None
    _print_results(results)
    if args.json_path:
        save_results(results, args.json_path)
        _log(f"wrote {args.json_path}")
    return 0


def _bench_attention(args: argparse.Namespace) -> int:
    from keras_mvit2.latency.attention_sweep import run_attention_sweep, sweep_markdown, write_sweep

    sweep = run_attention_sweep(
        args.mechanisms, args.tokens, dim=args.dim, threads=args.threads, runs=args.runs,
        warmup=args.warmup, rounds=args.rounds, profile_tokens=args.profile_tokens,
        models_dir=_models_dir(args), log=_log,
    )
    return _print_report(sweep_markdown(sweep), write_sweep(sweep, args.out))


def _bench_models(args: argparse.Namespace) -> int:
    from keras_mvit2.latency.models_table import (
        DEFAULT_MODELS,
        models_markdown,
        run_models_table,
        write_models_table,
    )

    table = run_models_table(
        args.models or DEFAULT_MODELS, precisions=args.precisions, input_size=args.input_size,
        threads=args.threads, runs=args.runs, warmup=args.warmup, rounds=args.rounds,
        measure_memory=not args.no_memory, peers=args.peer,
        models_dir=_models_dir(args), log=_log,
    )
    return _print_report(models_markdown(table), write_models_table(table, args.out))


def _bench_report(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    from keras_mvit2.latency.report import compare, load_many
    from keras_mvit2.utils.console import output_console

    table = compare(load_many(args.files))
    out = Table("model", *(escape(c) for c in table.columns),
                title="median latency (ms), batch 1")
    for row in table.rows:
        out.add_row(escape(row), *(table.cell_text(row, c) for c in table.columns))
    output_console().print(out)
    table.write(markdown=args.markdown, csv_path=args.csv_path, json_path=args.json_path)
    return 0
