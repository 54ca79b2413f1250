"""The optimizer's outputs for people: ``report.json``, ``pareto.png`` and a table.

`pareto.png` (`pareto_figure`) draws top-1 against size and against latency on this host.
Its top-1 axis spans the budget (the float Keras line, the budget's floor and a margin);
a candidate off that scale (far below the floor, say) is drawn at the edge as a triangle
pointing to where it is, its label giving its top-1. Labels are placed so that none
overlaps another (`place_labels`), joined to their point by a thin line where moved away.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from keras_mvit2.utils.files import atomic_output

__all__ = ["format_table", "pareto_figure", "place_labels", "plot_pareto", "speed_text",
           "top1_window", "write_report"]


def write_report(result: Any, path: str) -> str:
    """`result` (`OptimizeResult`) as JSON at `path`, atomically; returns `path`."""
    with atomic_output(path) as tmp, open(tmp, "w") as f:
        json.dump(result.to_dict(), f, indent=2)
    return path


def speed_text(result: Any) -> str:
    """A candidate's speed against float32 in words: ``"1.32x, slower"``, ``"0.71x,
    faster"``, ``"reference"``, or ``""`` where not compared."""
    if result.vs_float32 is None:
        return ""
    if result.vs_float32 == "reference":
        return "reference"
    return f"{result.latency_vs_float32:.2f}x, {result.vs_float32}"


def top1_window(reference_top1: float, max_drop: float,
                top1s: Sequence[float]) -> tuple[float, float]:
    """The top-1 axis of `pareto.png`, in percent: from below the budget's floor to above
    the float Keras model (a margin of the budget, at least a point, either side), narrowed
    to the measured values where they all lie inside, never beyond [0, 100]."""
    reference = 100 * reference_top1
    floor = reference - max_drop
    margin = max(1.0, 0.5 * max_drop)
    values = [100 * t for t in top1s]
    low = max(floor - margin, min([*values, floor]) - 0.25 * margin)
    high = min(reference + margin, max([*values, reference]) + 0.25 * margin)
    return max(low, -0.5), min(high, 100.5)


#: Where `place_labels` tries a label, in points from its point, nearest first: the
#: radius grows until a free spot is found, trying the sides before the diagonals.
_RADII = (7, 14, 22, 32, 44, 58, 76)
_ANGLES = (0, 180, 25, -25, 155, -155, 60, -60, 120, -120, 90, -90)


def _label_offsets() -> list[tuple[float, float]]:
    import math

    return [(r * math.cos(math.radians(a)), r * math.sin(math.radians(a)))
            for r in _RADII for a in _ANGLES]


def place_labels(ax: Any, points: Sequence[tuple[float, float]], labels: Sequence[str],
                 *, fontsize: float = 7) -> list[Any]:
    """Writes `labels` beside their data `points` on `ax` so that no label overlaps another
    label or a point and each stays inside the axes, where a free spot exists. Each label
    tries offsets around its point, nearest first (`_RADII` x `_ANGLES`), and takes the
    first free one (the least covered one where none is); a label away from its point gets
    a thin leader line. Returns the annotations, in order. Call it once the axes' limits
    and the figure's layout are final."""
    from matplotlib.text import Text

    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    box = ax.get_window_extent(renderer)
    radius = 4 * fig.dpi / 72.0
    marks = []  # the points themselves, as small squares in display units
    for x, y in points:
        px, py = ax.transData.transform((x, y))
        marks.append((px - radius, py - radius, px + radius, py + radius))
    offsets = _label_offsets()
    placed: list[tuple[float, float, float, float]] = []
    texts = []
    for (x, y), label in zip(points, labels, strict=True):
        best = None
        for i, (dx, dy) in enumerate(offsets):
            near = i < len(_ANGLES) and abs(dy) < 0.5 * _RADII[0]
            text = ax.annotate(
                label, (x, y), xytext=(dx, dy), textcoords="offset points",
                fontsize=fontsize, annotation_clip=False,
                ha="left" if dx > 1 else "right" if dx < -1 else "center",
                va="center" if abs(dy) < 3 else "bottom" if dy > 0 else "top",
                arrowprops=None if near else {"arrowstyle": "-", "lw": 0.5, "color": "0.6",
                                              "shrinkA": 1, "shrinkB": 3})
            text.update_positions(renderer)  # an annotation is placed when drawn
            extent = Text.get_window_extent(text, renderer)  # the text, not the line
            rect = (extent.x0 - 1, extent.y0 - 1, extent.x1 + 1, extent.y1 + 1)
            inside = (rect[0] >= box.x0 and rect[2] <= box.x1 and rect[1] >= box.y0
                      and rect[3] <= box.y1)
            cost = sum(_overlap(rect, other) for other in placed + marks) + (
                0 if inside else 1e9)
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, text, rect)
            else:
                text.remove()
            if cost == 0:
                break
        placed.append(best[2])
        texts.append(best[1])
    return texts


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> float:
    width = min(a[2], b[2]) - max(a[0], b[0])
    height = min(a[3], b[3]) - max(a[1], b[1])
    return width * height if width > 0 and height > 0 else 0.0


def pareto_figure(result: Any) -> Any:
    """The `pareto.png` figure of `result` (`OptimizeResult`): size vs top-1 and, where
    timed here, latency vs top-1 of every measured candidate; the chosen one a red star,
    the budget's floor and float Keras drawn, float32's latency a vertical line. None
    when no candidate was measured."""
    measured = [r for r in result.candidates if r.top1 is not None]
    if not measured:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    from matplotlib.lines import Line2D

    timed = [r for r in measured if r.latency_ms is not None]
    panels = [("size (MB)", lambda r: r.size_bytes / 1e6, measured)]
    if timed:
        panels.append((f"latency on this host (ms, median of "
                       f"{result.latency_setup['runs']}, {result.latency_setup['threads']} "
                       "thread)", lambda r: r.latency_ms, timed))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.6 * len(panels), 5.0), squeeze=False)
    reference = 100 * result.reference_top1
    floor = reference - result.max_drop
    low, high = top1_window(result.reference_top1, result.max_drop,
                            [r.top1 for r in measured])
    float32 = next((r for r in timed if r.vs_float32 == "reference"), None)
    size_fast = result.objective == "size_fast" and float32 is not None
    placements = []
    off_scale = any(not low <= 100 * r.top1 <= high for r in measured)
    for ax, (label, x_of, rows) in zip(axes[0], panels, strict=True):
        ax.axhline(reference, color="black", lw=0.8)
        ax.axhline(floor, color="tab:red", lw=0.8, ls="--")
        if float32 is not None and x_of is not panels[0][1]:
            ax.axvline(float32.latency_ms, color="tab:orange", lw=0.8, ls=":")
        points, labels = [], []
        for r in sorted(rows, key=lambda r: (x_of(r), r.top1)):
            chosen = result.best is not None and r.name == result.best.name
            slower = size_fast and r.within_budget and r.vs_float32 == "slower"
            color = ("tab:red" if chosen else "tab:orange" if slower else
                     "tab:blue" if r.within_budget else "tab:gray")
            y, name = 100 * r.top1, r.name
            marker = "*" if chosen else "o"
            if y < low or y > high:  # off the scale: at the edge, pointing to it
                marker = "v" if y < low else "^"
                name = f"{r.name} ({y:.1f} %)"
                y = low if y < low else high
            ax.scatter(x_of(r), y, s=110 if chosen else 40, marker=marker, color=color,
                       zorder=3, clip_on=False)
            points.append((x_of(r), y))
            labels.append(name)
        ax.set_xscale("log")  # sizes and latencies span 10-100x
        xs = [p[0] for p in points]
        ax.set_xlim(min(xs) / 1.35, max(xs) * 1.6)  # room for the labels either side
        ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        # Minor ticks labelled only within one decade (else their labels run together).
        ax.xaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g")
                                     if max(xs) * 1.6 < 10 * min(xs) / 1.35
                                     else matplotlib.ticker.NullFormatter())
        ax.set_ylim(low, high)
        ax.set_xlabel(label + ", log scale")
        ax.set_ylabel(f"top-1 on {result.data['num_held_out']} held-out images (%)")
        ax.grid(alpha=0.3)
        placements.append((ax, points, labels))
    handles = [Line2D([], [], color="black", lw=0.8, label=f"float Keras {reference:.2f} %"),
               Line2D([], [], color="tab:red", lw=0.8, ls="--",
                      label=f"budget: -{result.max_drop:g} points"),
               Line2D([], [], color="tab:red", marker="*", ls="", ms=10, label="chosen"),
               Line2D([], [], color="tab:blue", marker="o", ls="", label="within budget")]
    if size_fast:
        handles.append(Line2D([], [], color="tab:orange", marker="o", ls="",
                              label="within budget, slower than float32"))
    handles.append(Line2D([], [], color="tab:gray", marker="o", ls="", label="over budget"))
    if off_scale:
        handles.append(Line2D([], [], color="tab:gray", marker="v", ls="",
                              label="off the top-1 scale (value in its label)"))
    if float32 is not None:
        handles.append(Line2D([], [], color="tab:orange", lw=0.8, ls=":",
                              label=f"float32 latency {float32.latency_ms:.2f} ms"))
    fig.legend(handles=handles, loc="lower center", ncol=min(4, len(handles)), fontsize=7,
               frameon=False)
    chosen = result.best.name if result.best is not None else "none within budget"
    fig.suptitle(f"{result.target}: candidates (chosen: {chosen}, objective "
                 f"{result.objective})", fontsize=10)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    for ax, points, labels in placements:
        place_labels(ax, points, labels)
    return fig


def plot_pareto(result: Any, path: str) -> str | None:
    """Writes `pareto_figure(result)` to `path` (PNG, atomically); None when no candidate
    was measured."""
    fig = pareto_figure(result)
    if fig is None:
        return None
    import matplotlib.pyplot as plt

    with atomic_output(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return path


def format_table(result: Any) -> Any:
    """A rich `Table` of the candidates (bytes, top-1, agreement, drop, ms, speed against
    float32, budget)."""
    from rich.table import Table

    title = (f"{result.target} candidates on {result.data['num_held_out']} held-out images "
             f"(float Keras top-1 {100 * result.reference_top1:.2f} %, budget "
             f"{result.max_drop:g} points, objective {result.objective})")
    caption = " ".join(n for n in (getattr(result, "objective_note", None),
                                   (getattr(result, "qat", None) or {}).get("reason"))
                       if n) or None
    table = Table(title=title, caption=caption)
    for column in ("candidate", "MB", "top-1 %", "agreement %", "drop (points)", "ms",
                   "vs float32", "measured by", ""):
        table.add_column(column, justify="left" if column in (
            "candidate", "vs float32", "measured by", "") else "right")
    for r in result.candidates:
        chosen = result.best is not None and r.name == result.best.name
        if r.error:
            table.add_row(r.name, "", "", "", "", "", "", "", "failed: " + r.error[:60])
            continue
        table.add_row(
            ("* " if chosen else "") + r.name,
            f"{r.size_bytes / 1e6:.3f}",
            "" if r.top1 is None else f"{100 * r.top1:.2f}",
            "" if r.agreement is None else f"{100 * r.agreement:.2f}",
            "" if r.drop_points is None else f"{r.drop_points:+.2f}",
            "" if r.latency_ms is None else f"{r.latency_ms:.2f}",
            speed_text(r),
            r.measured_by + ("" if r.exact else " (approx.)"),
            "chosen" if chosen else ("within" if r.within_budget else
                                     ("not measurable" if r.top1 is None else "over")),
        )
    return table
