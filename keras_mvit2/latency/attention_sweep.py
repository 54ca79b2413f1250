"""The paper's Fig. 1 in TFLite: one attention layer of each mechanism vs the number of tokens.

For every registered attention mechanism (`keras_mvit2.attention.available()`) and
every token count k, a model holding ONE attention layer on a ``(1, k, d)`` input
is converted to a float32 `.tflite` (`keras_mvit2.export.to_tflite`) and timed in
``ai_edge_litert`` on 1 thread (XNNPACK on), the mechanisms interleaved for each k.
Per mechanism, the op breakdown ("top-5 operations", Fig. 1 left) comes from
`keras_mvit2.latency.host.op_profile` (each op timed in isolation).

Layer settings (the paper's: d = 512, h = 8 for MHA and Linformer, p = 256):

========================  ==============================================================
``separable``             no heads (the separable self-attention of MobileViTv2)
``mha``                   ``num_heads=8``
``linformer``             ``num_heads=8, projected_tokens=256`` (at every k, also k < p)
``rfa``                   ``num_heads=8`` (head size 64 at d=512), its default 64 random
                          features per head, non-causal, no gate
``mobile_attention``      ``num_heads=8``, its default head-competitive flow normalizer
========================  ==============================================================

Heads are reduced to the largest divisor of d not above 8 for small test widths.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Sequence
from typing import Any

from keras_mvit2.latency.host import (
    Log,
    _histogram_and_report,
    _quiet,
    host_device,
    make_interpreter,
    make_result,
    measure_interleaved,
    op_profile,
    op_type_breakdown,
    tflite_model_entry,
)
from keras_mvit2.latency.schema import BenchResult, save_results
from keras_mvit2.utils.files import atomic_output, write_json, write_text

__all__ = [
    "DEFAULT_LAYER_KWARGS",
    "PAPER_TOKENS",
    "AttentionSweep",
    "attention_model",
    "layer_kwargs",
    "load_sweep",
    "plot_sweep",
    "run_attention_sweep",
    "sweep_markdown",
    "write_sweep",
]

#: Token counts of the paper's Fig. 1 (bottom right).
PAPER_TOKENS = (64, 128, 256, 512, 1024, 2048)
#: Layer arguments per mechanism (the paper's d=512 settings; see the module docstring).
DEFAULT_LAYER_KWARGS: dict[str, dict[str, Any]] = {
    "separable": {},
    "mha": {"num_heads": 8},
    "linformer": {"num_heads": 8, "projected_tokens": 256},
    "rfa": {"num_heads": 8},
    "mobile_attention": {"num_heads": 8},
}
#: The mechanism everything is compared with.
REFERENCE = "separable"


def layer_kwargs(mechanism: str, dim: int) -> dict[str, Any]:
    """The layer arguments used for `mechanism` at width `dim`.

    Uses `DEFAULT_LAYER_KWARGS` (8 heads where the layer has heads); where `dim` is
    not divisible by 8 (small test widths), the largest divisor of `dim` below 8.
    """
    kwargs = dict(DEFAULT_LAYER_KWARGS.get(mechanism, {}))
    heads = kwargs.get("num_heads")
    if heads is not None and dim % heads:
        kwargs["num_heads"] = max(h for h in range(1, heads + 1) if dim % h == 0)
    return kwargs


def attention_model(mechanism: str, tokens: int, dim: int, **kwargs: Any):
    """A Keras model holding one attention layer on a ``(1, tokens, dim)`` input."""
    import keras

    from keras_mvit2.layers import attention_registry

    for label, value in (("tokens", tokens), ("dim", dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be a positive int. Received: {label}={value!r}")
    inputs = keras.Input((tokens, dim), batch_size=1, name="tokens")
    layer = attention_registry.get(mechanism, **kwargs)
    return keras.Model(inputs, layer(inputs), name=f"{mechanism}_k{tokens}_d{dim}")


@dataclasses.dataclass
class AttentionSweep:
    """Result of `run_attention_sweep`.

    Attributes:
        dim: token width d.
        tokens: the token counts k.
        mechanisms: the mechanisms, in column order.
        layer_kwargs: mechanism -> layer arguments used.
        results: one `BenchResult` per (mechanism, k); ``extra`` holds
            ``mechanism``, ``tokens``, ``dim`` and ``layer_kwargs``.
        op_breakdown: profiled k -> mechanism -> rows of `op_type_breakdown`.
        op_profile_info: profiled k -> mechanism -> the `op_profile` info dict.
    """

    dim: int
    tokens: list[int]
    mechanisms: list[str]
    layer_kwargs: dict[str, dict[str, Any]]
    results: list[BenchResult]
    op_breakdown: dict[int, dict[str, list[dict[str, Any]]]]
    op_profile_info: dict[int, dict[str, dict[str, Any]]]

    def median(self, mechanism: str, tokens: int, clock: str = "wall") -> float | None:
        """Median latency (ms) of `mechanism` at `tokens`, or None if not measured.

        ``clock="wall"``: wall-clock time (``latency_ms``); ``"cpu"``: the invoking
        thread's CPU time (``extra["cpu_ms"]``, 1 thread only).
        """
        for r in self.results:
            if r.extra.get("mechanism") == mechanism and r.extra.get("tokens") == tokens:
                if clock == "cpu":
                    return (r.extra.get("cpu_ms") or {}).get("median")
                return r.latency_ms.median
        return None

    def clocks(self) -> list[str]:
        """``["cpu", "wall"]`` when CPU times were recorded (1 thread), else ``["wall"]``."""
        has_cpu = any("cpu_ms" in r.extra for r in self.results)
        return ["cpu", "wall"] if has_cpu else ["wall"]

    def bars(self, clock: str = "wall") -> dict[str, Any]:
        """The issue's bars: separable vs MHA at k=1024 / 2048, and t_sep(2048)/t_sep(1024)."""
        out: dict[str, Any] = {}
        sep = {k: self.median(REFERENCE, k, clock) for k in (1024, 2048)}
        mha = {k: self.median("mha", k, clock) for k in (1024, 2048)}
        for k, bar in ((1024, 3.0), (2048, 4.5)):
            if sep[k] and mha[k]:
                ratio = mha[k] / sep[k]
                out[f"mha_over_separable_k{k}"] = {"value": ratio, "bar": bar,
                                                  "passed": ratio >= bar}
        if sep[1024] and sep[2048]:
            ratio = sep[2048] / sep[1024]
            out["separable_k2048_over_k1024"] = {"value": ratio, "bar": 2.2,
                                                 "passed": ratio <= 2.2}
        return out

    def summary(self) -> dict[str, Any]:
        """Everything but the full records, JSON-ready."""
        table = {
            clock: {m: {str(k): self.median(m, k, clock) for k in self.tokens}
                    for m in self.mechanisms}
            for clock in self.clocks()
        }
        return {
            "dim": self.dim,
            "tokens": self.tokens,
            "mechanisms": self.mechanisms,
            "layer_kwargs": self.layer_kwargs,
            "median_ms": table,
            "bars": {clock: self.bars(clock) for clock in self.clocks()},
            "op_breakdown": {str(k): v for k, v in self.op_breakdown.items()},
            "op_profile_info": {str(k): v for k, v in self.op_profile_info.items()},
            "device": self.results[0].device if self.results else host_device(),
            "runtime": self.results[0].runtime if self.results else None,
        }


def run_attention_sweep(
    mechanisms: Sequence[str] | None = None,
    tokens: Sequence[int] = PAPER_TOKENS,
    *,
    dim: int = 512,
    threads: int = 1,
    runs: int = 30,
    warmup: int = 3,
    rounds: int = 5,
    profile_tokens: Sequence[int] = (256,),
    profile_runs: int = 10,
    models_dir: str | os.PathLike | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
    log: Log = _quiet,
) -> AttentionSweep:
    """Runs the Fig. 1 sweep (see the module docstring).

    Args:
        mechanisms: registered attention names (default: all of them).
        tokens: the token counts k.
        dim: token width d.
        threads: interpreter threads (the paper: 1 CPU core).
        runs: timed invokes per (mechanism, k).
        warmup: untimed invokes first.
        rounds: interleaving rounds per k (mechanisms alternate `rounds` times).
        profile_tokens: token counts at which each mechanism's ops are profiled
            (the paper's Fig. 1 left uses 256); those not in `tokens` are skipped.
        profile_runs: isolated invokes per op per round in the op profile.
        models_dir: where the `.tflite` files go (default: a temporary folder).
        overrides: mechanism -> extra layer arguments (override the defaults).
        log: progress messages.
    """
    from keras_mvit2.export.tflite.convert import to_tflite
    from keras_mvit2.layers import attention_registry
    from keras_mvit2.profiling import profile

    names = list(mechanisms) if mechanisms else attention_registry.available()
    names = [attention_registry.canonical_name(n) for n in names]
    if REFERENCE in names:  # the reference first, in every table
        names.remove(REFERENCE)
        names.insert(0, REFERENCE)
    tokens = sorted({int(k) for k in tokens})
    if not tokens or tokens[0] < 1:
        raise ValueError(f"tokens must be positive ints. Received: {tokens}")
    kwargs_of = {m: {**layer_kwargs(m, dim), **(overrides or {}).get(m, {})} for m in names}

    results: list[BenchResult] = []
    breakdown: dict[int, dict[str, list[dict[str, Any]]]] = {}
    profile_info: dict[int, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="keras_mvit2_attn_") as tmp:
        folder = os.fspath(models_dir) if models_dir is not None else tmp
        os.makedirs(folder, exist_ok=True)
        for k in tokens:
            paths, entries = {}, {}
            for m in names:
                model = attention_model(m, k, dim, **kwargs_of[m])
                path = os.path.join(folder, f"{m}_k{k}_d{dim}.tflite")
                log(f"k={k}: converting {m} ...")
                to_tflite(model, path)
                info = profile(model)
                paths[m] = path
                entries[m] = tflite_model_entry(
                    path, name=f"attention/{m}_k{k}_d{dim}", params=info.params, macs=info.macs,
                    source=f"one {m} layer, (1, {k}, {dim}) input")
            interpreters = {m: make_interpreter(p, threads=threads) for m, p in paths.items()}
            log(f"k={k}: timing {', '.join(names)} interleaved ({runs} runs each) ...")
            samples = measure_interleaved(interpreters, runs=runs, warmup=warmup,
                                          rounds=rounds)
            del interpreters
            for m in names:
                histogram, extra = _histogram_and_report(paths[m])
                extra.update(mechanism=m, tokens=k, dim=dim, layer_kwargs=kwargs_of[m])
                result = make_result(entries[m], samples[m], warmup=warmup, threads=threads,
                                     xnnpack=True, peak_memory=None, op_histogram=histogram,
                                     extra=extra)
                result.model["path"] = paths[m] if models_dir is not None else None
                results.append(result)
                log(f"  {m:>18s} k={k:5d}: median {result.latency_ms.median:9.3f} ms")
            if k in profile_tokens:
                breakdown[k], profile_info[k] = {}, {}
                for m in names:
                    log(f"k={k}: op profile of {m} ...")
                    timings, info = op_profile(paths[m], threads=threads, runs=profile_runs)
                    breakdown[k][m] = op_type_breakdown(timings)
                    profile_info[k][m] = info
    return AttentionSweep(dim=dim, tokens=tokens, mechanisms=names, layer_kwargs=kwargs_of,
                          results=results, op_breakdown=breakdown,
                          op_profile_info=profile_info)


# --------------------------------------------------------------------------------------
# Report: markdown, plot, files


def machine_label(device: dict[str, Any], runtime: dict[str, Any] | None) -> str:
    """A one-line description of the machine and runtime for captions."""
    rt = runtime or {}
    return (
        f"{device.get('cpu', '?')}, {device.get('cores', '?')} cores, {device.get('os', '')}; "
        f"ai_edge_litert {rt.get('version', '?')}, {rt.get('threads', '?')} thread(s), "
        f"delegate {rt.get('delegate', '?')}"
    )


def results_label(results: Sequence[BenchResult]) -> str:
    """`machine_label` of the first record's machine and runtime (this host without one)."""
    if not results:
        return machine_label(host_device(), None)
    return machine_label(results[0].device, results[0].runtime)


def save_figure(fig, path: str | os.PathLike) -> None:
    """Lays out `fig`, writes it as a PNG (atomically) and closes it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


_CLOCK_TEXT = {
    "cpu": "CPU time of the invoking thread (1 thread; what an idle core would take)",
    "wall": "wall-clock time",
}


def _latency_table(sweep: AttentionSweep, clock: str) -> list[str]:
    others = [m for m in sweep.mechanisms if m != REFERENCE]
    lines = ["| k | " + " | ".join(sweep.mechanisms) + " | "
             + " | ".join(f"{m} / {REFERENCE}" for m in others) + " |"]
    lines.append("|" + "---:|" * (1 + len(sweep.mechanisms) + len(others)))
    for k in sweep.tokens:
        sep = sweep.median(REFERENCE, k, clock)
        cells = [_fmt(sweep.median(m, k, clock)) for m in sweep.mechanisms]
        ratios = []
        for m in others:
            t = sweep.median(m, k, clock)
            ratios.append(f"{t / sep:.2f}x" if t and sep else "-")
        lines.append(f"| {k} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    return lines


def sweep_markdown(sweep: AttentionSweep, top: int = 5) -> str:
    """Latency tables (ms, medians; CPU and wall clock), ratios, bars and top-ops tables."""
    lines: list[str] = []
    for clock in sweep.clocks():
        lines.append(f"Median {_CLOCK_TEXT[clock]} in ms of one attention layer, batch 1, "
                     "float32 TFLite:")
        lines.append("")
        lines.extend(_latency_table(sweep, clock))
        lines.append("")
    labels = {
        "mha_over_separable_k1024": ("MHA / separable at k=1024", ">="),
        "mha_over_separable_k2048": ("MHA / separable at k=2048", ">="),
        "separable_k2048_over_k1024": ("separable t(2048) / t(1024)", "<="),
    }
    if any(sweep.bars(clock) for clock in sweep.clocks()):
        lines.append("| bar | " + " | ".join(f"{c} clock" for c in sweep.clocks())
                     + " | required |")
        lines.append("|---|" + "---:|" * len(sweep.clocks()) + "---:|")
        all_bars = {clock: sweep.bars(clock) for clock in sweep.clocks()}
        for key, (label, op) in labels.items():
            cells = []
            required = None
            for clock in sweep.clocks():
                bar = all_bars[clock].get(key)
                if bar is None:
                    cells.append("-")
                    continue
                required = bar["bar"]
                cells.append(f"{bar['value']:.2f} ({'pass' if bar['passed'] else 'MISS'})")
            if required is not None:
                lines.append(f"| {label} | " + " | ".join(cells) + f" | {op} {required} |")
        lines.append("")
    for k, per_mech in sweep.op_breakdown.items():
        lines.append(f"Top-{top} operations by time at k={k} (each op timed in isolation; "
                     "share of the summed op time, share of the MACs):")
        lines.append("")
        lines.append("| mechanism | " + " | ".join(f"#{i + 1}" for i in range(top))
                     + " | sum of ops / whole model (ms) |")
        lines.append("|---|" + "---|" * top + "---:|")
        for m, rows in per_mech.items():
            cells = [f"{r['op']} ×{r['count']}: {r['share']:.0%} ({r['macs_share']:.0%} MACs)"
                     for r in rows[:top]]
            cells += ["-"] * (top - len(cells))
            info = sweep.op_profile_info.get(k, {}).get(m, {})
            lines.append(f"| {m} | " + " | ".join(cells)
                         + f" | {info.get('sum_ms', 0):.3f} / {info.get('model_ms', 0):.3f} |")
        lines.append("")
    return "\n".join(lines)


def plot_sweep(sweep: AttentionSweep, path: str | os.PathLike) -> None:
    """Writes the PNG: latency vs k (log-log), plus the op shares at the profiled k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profiled = sorted(sweep.op_breakdown)
    ncols = 1 + (1 if profiled else 0)
    fig, axes = plt.subplots(1, ncols, figsize=(6.5 * ncols, 4.8), squeeze=False)
    ax = axes[0][-1]
    clock = sweep.clocks()[0]
    for m in sweep.mechanisms:
        ks = [k for k in sweep.tokens if sweep.median(m, k, clock)]
        line = ax.plot(ks, [sweep.median(m, k, clock) for k in ks], marker="o",
                       linewidth=2.5 if m == REFERENCE else 1.5, label=m)
        if clock == "cpu":
            ax.plot(ks, [sweep.median(m, k, "wall") for k in ks], linestyle=":",
                    color=line[0].get_color(), alpha=0.6)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sweep.tokens)
    ax.set_xticklabels([str(k) for k in sweep.tokens])
    ax.set_xlabel("number of tokens k")
    ax.set_ylabel("latency (ms, median)")
    ax.set_title(f"one attention layer, d={sweep.dim}, float32 TFLite\n"
                 + ("solid: thread CPU time, dotted: wall clock" if clock == "cpu"
                    else "wall clock"), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    if profiled:
        k = 256 if 256 in profiled else profiled[0]
        bx = axes[0][0]
        per_mech = sweep.op_breakdown[k]
        ops: list[str] = []
        for rows in per_mech.values():
            for r in rows[:5]:
                if r["op"] not in ops:
                    ops.append(r["op"])
        mechs = list(per_mech)
        cmap = plt.get_cmap("tab20")
        left = [0.0] * len(mechs)
        for i, op in enumerate([*ops, "other"]):
            widths = []
            for m in mechs:
                rows = per_mech[m]
                if op == "other":
                    widths.append(sum(r["ms"] for r in rows if r["op"] not in ops))
                else:
                    widths.append(sum(r["ms"] for r in rows if r["op"] == op))
            bx.barh(mechs, widths, left=left, color=cmap(i % 20), label=op)
            left = [a + b for a, b in zip(left, widths, strict=True)]
        bx.set_xlabel("summed isolated op time (ms)")
        bx.set_title(f"time per op type at k={k}")
        bx.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    fig.suptitle(results_label(sweep.results), fontsize=8)
    save_figure(fig, path)


def load_sweep(json_path: str | os.PathLike,
               summary_path: str | os.PathLike | None = None) -> AttentionSweep:
    """An `AttentionSweep` back from the files `write_sweep` wrote (to re-render them)."""
    from keras_mvit2.latency.schema import load_results

    results = load_results(json_path)
    if summary_path is None:
        summary_path = os.fspath(json_path)[: -len(".json")] + "_summary.json"
    with open(summary_path) as f:
        summary = json.load(f)
    return AttentionSweep(
        dim=summary["dim"],
        tokens=summary["tokens"],
        mechanisms=summary["mechanisms"],
        layer_kwargs=summary["layer_kwargs"],
        results=results,
        op_breakdown={int(k): v for k, v in summary["op_breakdown"].items()},
        op_profile_info={int(k): v for k, v in summary["op_profile_info"].items()},
    )


def write_sweep(sweep: AttentionSweep, out_dir: str | os.PathLike,
                stem: str = "attention_latency") -> dict[str, str]:
    """Writes ``<stem>.json`` (BenchResult list), ``<stem>_summary.json``, ``.md`` and ``.png``."""
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    paths = {
        "json": os.path.join(out_dir, f"{stem}.json"),
        "summary": os.path.join(out_dir, f"{stem}_summary.json"),
        "markdown": os.path.join(out_dir, f"{stem}.md"),
        "png": os.path.join(out_dir, f"{stem}.png"),
    }
    save_results(sweep.results, paths["json"])
    write_json(paths["summary"], sweep.summary())
    text = (f"Machine: {results_label(sweep.results)}\n\n" + sweep_markdown(sweep)
            + f"\n![latency vs tokens]({os.path.basename(paths['png'])})\n")
    write_text(paths["markdown"], text)
    plot_sweep(sweep, paths["png"])
    return paths
