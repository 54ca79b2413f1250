"""The optimizer's outputs for people: ``report.json``, ``pareto.png`` and a table."""

from __future__ import annotations

import json
from typing import Any

from keras_mvit2.utils.files import atomic_output

__all__ = ["format_table", "plot_pareto", "write_report"]


def write_report(result: Any, path: str) -> str:
    """`result` (`OptimizeResult`) as JSON at `path`, atomically; returns `path`."""
    with atomic_output(path) as tmp, open(tmp, "w") as f:
        json.dump(result.to_dict(), f, indent=2)
    return path


def plot_pareto(result: Any, path: str) -> str | None:
    """Size vs top-1 and latency vs top-1 of every measured candidate, the chosen one
    marked, the budget's floor drawn; None when no candidate was measured."""
    measured = [r for r in result.candidates if r.top1 is not None]
    if not measured:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    timed = [r for r in measured if r.latency_ms is not None]
    panels = [("size (MB)", lambda r: r.size_bytes / 1e6, measured)]
    if timed:
        panels.append((f"latency on this host (ms, median of "
                       f"{result.latency_setup['runs']}, {result.latency_setup['threads']} "
                       "thread)", lambda r: r.latency_ms, timed))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.6), squeeze=False)
    floor = 100 * result.reference_top1 - result.max_drop
    for ax, (label, x_of, rows) in zip(axes[0], panels, strict=True):
        for i, r in enumerate(sorted(rows, key=lambda r: (x_of(r), r.top1))):
            chosen = result.best is not None and r.name == result.best.name
            ax.scatter(x_of(r), 100 * r.top1, s=90 if chosen else 36,
                       marker="*" if chosen else "o",
                       color="tab:red" if chosen else (
                           "tab:blue" if r.within_budget else "tab:gray"),
                       zorder=3)
            ax.annotate(r.name, (x_of(r), 100 * r.top1), fontsize=7,  # staggered: neighbours
                        xytext=(4, 3 - 9 * (i % 3)), textcoords="offset points")
        ax.axhline(100 * result.reference_top1, color="black", lw=0.8,
                   label=f"float Keras {100 * result.reference_top1:.2f} %")
        ax.axhline(floor, color="tab:red", lw=0.8, ls="--",
                   label=f"budget: -{result.max_drop:g} points")
        ax.set_xscale("log")  # sizes and latencies span 10-100x
        for axis in (ax.xaxis.set_major_formatter, ax.xaxis.set_minor_formatter):
            axis(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.set_xlabel(label + ", log scale")
        ax.set_ylabel(f"top-1 on {result.data['num_held_out']} held-out images (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    chosen = result.best.name if result.best is not None else "none within budget"
    fig.suptitle(f"{result.target}: candidates (chosen: {chosen}, objective "
                 f"{result.objective})", fontsize=10)
    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return path


def format_table(result: Any) -> Any:
    """A rich `Table` of the candidates (bytes, top-1, agreement, drop, ms, budget)."""
    from rich.table import Table

    title = (f"{result.target} candidates on {result.data['num_held_out']} held-out images "
             f"(float Keras top-1 {100 * result.reference_top1:.2f} %, budget "
             f"{result.max_drop:g} points, objective {result.objective})")
    table = Table(title=title)
    for column in ("candidate", "MB", "top-1 %", "agreement %", "drop (points)", "ms",
                   "measured by", ""):
        table.add_column(column, justify="left" if column in ("candidate", "measured by", "")
                         else "right")
    for r in result.candidates:
        chosen = result.best is not None and r.name == result.best.name
        if r.error:
            table.add_row(r.name, "", "", "", "", "", "", "failed: " + r.error[:60])
            continue
        table.add_row(
            ("* " if chosen else "") + r.name,
            f"{r.size_bytes / 1e6:.3f}",
            "" if r.top1 is None else f"{100 * r.top1:.2f}",
            "" if r.agreement is None else f"{100 * r.agreement:.2f}",
            "" if r.drop_points is None else f"{r.drop_points:+.2f}",
            "" if r.latency_ms is None else f"{r.latency_ms:.2f}",
            r.measured_by + ("" if r.exact else " (approx.)"),
            "chosen" if chosen else ("within" if r.within_budget else
                                     ("not measurable" if r.top1 is None else "over")),
        )
    return table
