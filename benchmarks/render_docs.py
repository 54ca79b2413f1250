"""Every table of measured figures in the guides, rendered from `benchmarks/results/`.

    python benchmarks/render_docs.py            # rewrite the blocks of docs/*.md and README.md
    python benchmarks/render_docs.py --check    # exit 1 naming every block that differs

A page marks each table it takes from the results:

    <!-- render:int8_result_box -->
    (written by this script: never edit it by hand)
    <!-- /render -->

`RENDERERS` maps each name to a function of a `Results` (the result files, read on demand)
that returns the block's Markdown; `@renderer("name")` registers one. Every block ends with a
line naming the result files its renderer read (`Results` records them), so each figure in a
block traces to a file. A new table (e.g. one of a new benchmark): write its function here,
register it, put the markers on the page and run this script; `tests/test_render_docs.py`
re-renders every page and fails where a page and its results disagree.

The renderers call the benchmarks' own table code where a benchmark has it (one table code
per result), so a benchmark's Markdown and the guides print the same figures.
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import re
import sys
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
#: The pages rendered by default: every guide, and the README.
PAGES = (os.path.join(ROOT, "docs", "*.md"), os.path.join(ROOT, "README.md"))
BLOCK = re.compile(r"<!-- render:([\w-]+) -->\n(.*?)<!-- /render -->", re.S)
OPENING = re.compile(r"<!-- render:([\w-]+) -->")


class Results:
    """The result files under `folder`, read on demand; `read` lists those a renderer used
    (relative to `benchmarks/results/`), in the order it read them."""

    def __init__(self, folder: str = RESULTS):
        self.folder = folder
        self.read: list[str] = []

    def path(self, name: str) -> str:
        if name not in self.read:
            self.read.append(name)
        return os.path.join(self.folder, name)

    def json(self, name: str) -> Any:
        with open(self.path(name)) as f:
            return json.load(f)

    def table(self, name: str, heading: str | None = None, index: int = 0) -> list[str]:
        """Table `index` (0: the first) of the result page `name`, after the ``#`` heading
        that starts with `heading` where given."""
        with open(self.path(name)) as f:
            lines = f.read().splitlines()
        if heading is not None:
            starts = [i for i, line in enumerate(lines)
                      if line.lstrip("#").strip().startswith(heading) and line.startswith("#")]
            if not starts:
                raise KeyError(f"{name} has no heading starting with {heading!r}")
            lines = lines[starts[0] + 1:]
        tables: list[list[str]] = []
        for i, line in enumerate(lines):
            if line.startswith("|"):
                if i == 0 or not lines[i - 1].startswith("|"):
                    tables.append([])
                tables[-1].append(line)
        return tables[index]


    def section(self, name: str, start: str) -> list[str]:
        """The lines of the result page `name` from the first that starts with `start` up to
        the next bold or ``#`` line (a section of a page such as `optimize_budget.md`)."""
        with open(self.path(name)) as f:
            lines = f.read().splitlines()
        first = next((i for i, line in enumerate(lines) if line.startswith(start)), None)
        if first is None:
            raise KeyError(f"{name} has no line starting with {start!r}")
        end = next((i for i in range(first + 1, len(lines))
                    if lines[i].startswith(("**", "#"))), len(lines))
        while end > first and not lines[end - 1].strip():
            end -= 1
        return lines[first:end]


#: Block name -> its renderer.
RENDERERS: dict[str, Callable[[Results], str]] = {}


def renderer(name: str) -> Callable[[Callable[[Results], str]], Callable[[Results], str]]:
    """Registers `function(results) -> Markdown` as the renderer of blocks named `name`."""
    def register(function: Callable[[Results], str]) -> Callable[[Results], str]:
        if name in RENDERERS:
            raise ValueError(f"two renderers named {name!r}")
        RENDERERS[name] = function
        return function
    return register


def render_block(name: str, folder: str = RESULTS) -> str:
    """The Markdown of block `name`: its renderer's table, then the result files it read."""
    if name not in RENDERERS:
        raise KeyError(f"no renderer named {name!r} (benchmarks/render_docs.py: "
                       f"{', '.join(sorted(RENDERERS))})")
    results = Results(folder)
    body = RENDERERS[name](results).rstrip("\n")
    files = ", ".join(f"`benchmarks/results/{f}`" for f in results.read)
    return f"{body}\n\n<sub>Rendered from {files} by `benchmarks/render_docs.py`.</sub>\n"


def render_page(text: str, folder: str = RESULTS) -> str:
    """`text` with every render block rewritten; a ValueError for a block left open."""
    opened = [m.group(1) for m in OPENING.finditer(text)]
    closed = [m.group(1) for m in BLOCK.finditer(text)]
    if opened != closed or text.count("<!-- /render -->") != len(opened):
        raise ValueError(f"render blocks not closed as opened: {opened} vs {closed}")
    return BLOCK.sub(lambda m: f"<!-- render:{m.group(1)} -->\n"
                               f"{render_block(m.group(1), folder)}<!-- /render -->", text)


def pages() -> list[str]:
    return sorted(path for pattern in PAGES for path in glob.glob(pattern))


def stale_blocks(paths: list[str] | None = None, folder: str = RESULTS) -> list[str]:
    """``page: block`` for every block whose text differs from its rendering."""
    stale = []
    for path in paths or pages():
        with open(path) as f:
            text = f.read()
        rendered = render_page(text, folder)
        if rendered == text:
            continue
        now = dict((m.group(1), m.group(2)) for m in BLOCK.finditer(text))
        for m in BLOCK.finditer(rendered):
            if now.get(m.group(1)) != m.group(2):
                stale.append(f"{os.path.relpath(path, ROOT)}: {m.group(1)}")
    return stale


# ------------------------------------------------------------------------------ helpers


def pct(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f} %"


def points(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}"


def per_seed(values: list[float]) -> str:
    """``97.7 / 97.3 / 97.2 %``."""
    return " / ".join(f"{100 * v:.1f}" for v in values) + " %"


def _benchmark(name: str) -> Any:
    """A benchmark script of this folder, imported as a module (for its table code)."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    return __import__(name)


def _fidelity_entry(table: list[dict], size: int, row: str) -> dict | None:
    return next((e for e in table if e["size"] == size and e["row"] == row), None)


# ------------------------------------------------------------------------------ int8


FIDELITY_QAT = "int8_fidelity_qat/int8_fidelity.json"
DEFAULT_ROW = "mobilevitv2_050 int8 p99.99"  # the default ranges, forms and zero points
PLAIN_ROW = "mobilevitv2_050 int8 plain converter"
CONTROL_ROW = "mobilenetv2_050 int8 plain converter"
#: `int8_speed.py`'s result on each host measured: AMD with AVX-512 (VNNI), AMD with AVX2
#: only, Intel with AVX-512 (VNNI) and AMX.
SPEED = "int8_speed.json"
SPEED_AVX2 = "int8_speed_avx2/int8_speed.json"
SPEED_INTEL = "int8_speed_intel/int8_speed.json"
#: The same benchmark at 64x64 only, Linformer and RFA, profiled at that size.
SPEED_INTEL_64 = "int8_speed_intel_64/int8_speed.json"
#: The `mvit2 finetune` runs of the QAT on the shipped graph (finetune_int8_check.json).
FINETUNE_QAT_RUNS = ("run_standin_2026_12_03", "run_random_2026_12_03")
#: The two fine-tunes `torch_road_int8.py` measured last (torch_road_int8.json).
TORCH_ROAD_RUNS = ("run_random_2026_12_03", "run_standin_2026_12_03")


def _qat_runs(results: Results) -> dict[int, list[dict]]:
    """The fidelity benchmark's QAT runs per size, with what the test images say of them
    (`int8_fidelity.qat_run`)."""
    fidelity = _benchmark("int8_fidelity")
    runs = results.json(FIDELITY_QAT)["runs"]
    table = fidelity.summarize(runs, sorted({int(k.split("/")[0]) for k in runs}, reverse=True),
                               range(10))
    return {e["size"]: e["runs"] for e in table if e["row"].endswith("int8 qat shipped")}


def _finetune_qat(results: Results) -> list[tuple[str, dict, dict]]:
    """``(run, the run's QAT facts, what the 1,000 test photos say)`` of `FINETUNE_QAT_RUNS`."""
    check = _benchmark("finetune_int8_check")
    record = results.json("finetune_int8_check.json")
    out = []
    for name in FINETUNE_QAT_RUNS:
        facts = check.qat_facts(record[name]["held_out"])
        out.append((name, facts, check.qat_on_test(record[name]["test"], facts)))
    return out


@renderer("int8_result_box")
def int8_result_box(results: Results) -> str:
    current = results.json(FIDELITY_QAT)["table"]
    older = results.json("int8_fidelity.json")["table"]
    qat = _qat_runs(results)
    finetune = _finetune_qat(results)
    torch = results.json("torch_road_int8.json")
    published = results.json("published_int8.json")["rows"]

    def fidelity(table, size, row, seeds=True):
        e = _fidelity_entry(table, size, row)
        if e is None:
            return "-"
        spread = f" ({per_seed(e['agreement_per_seed'])})" if seeds else ""
        return f"{pct(e['agreement'])}{spread}, {points(e['drop_points'])}"

    def qat_cell(runs):
        if not runs:
            return "-"
        gains = " / ".join(points(r["test_gain_points"]) for r in runs)
        judged = " / ".join(points(r["judged_gain_points"]) for r in runs)
        below = sum(bool(r["shipped_below_post_training"]) for r in runs)
        shipped = sum(r["shipped"] == "qat" for r in runs)
        return (f"{gains} (judged {judged}); trained file shipped {shipped} of {len(runs)}, "
                f"shipped file below the post-training one {below} of {len(runs)}")

    def road(key, run):
        row = torch[run]["files"][key]
        return f"{pct(row['agreement'])}, {points(row['drop_points'])}"

    tf_cells = " / ".join(road("tensorflow_int8", r) for r in TORCH_ROAD_RUNS)
    torch_cells = " / ".join(road("torch_int8_product_mean", r) for r in TORCH_ROAD_RUNS)
    fine_gain = " / ".join(points(t["gain_points"]) for _, _, t in finetune)
    fine_judged = " / ".join(
        points(100 * (f["agreement_qat"] - f["agreement_post_training"])) for _, f, _ in finetune)
    fine_below = sum(bool(t["shipped_below_post_training"]) for _, _, t in finetune)
    def judged_today(run) -> bool:
        """Whether a QAT run was judged by today's choice (it carries the test's p-value)."""
        return run.get("p_value") is not None

    def sizes(today_or_not: bool) -> list[str]:
        """The sizes (with their seeds where a size has runs of both kinds) whose QAT runs
        were or were not judged by today's choice."""
        out = []
        for size in sorted(qat):
            seeds = [r["seed"] for r in qat[size] if judged_today(r) == today_or_not]
            if seeds:
                out.append(f"{size}x{size}" + ("" if len(seeds) == len(qat[size]) else
                                               f" (seed{'s' * (len(seeds) > 1)} "
                                               f"{', '.join(map(str, seeds))})"))
        return out

    today, earlier = sizes(True), sizes(False)
    (today if all(judged_today(f) for _, f, _ in finetune) else earlier).append("the fine-tunes")
    judged = " ".join(part[:1].upper() + part[1:] for part in filter(None, [
        f"{', '.join(today)}: judged on held-out images and training images set aside before "
        "training, by the exact paired test." if today else "",
        f"{', '.join(earlier)}: judged by the choice this page's earlier code made (held-out "
        "images and the training images shifted), not yet re-run with the set-aside judge "
        "images and the paired test." if earlier else ""]))
    anchors = "; ".join(f"{r['model']}, {r['method']}: {r['int8_top1'] - r['float_top1']:+.2f}"
                        for r in published)
    speeds = {"AVX-512": results.json(SPEED), "AVX2 only": results.json(SPEED_AVX2),
              "AVX-512 and AMX": results.json(SPEED_INTEL)}

    def speed_cell(speed, size):
        def ratios(model):
            rows = [r for r in speed["gate"] if r["model"] == model and r["size"] == size]
            return " / ".join(f"{r['ratio']:.2f}x" for r in sorted(rows,
                                                                   key=lambda r: r["threads"]))
        control = ratios("mobilenetv2_050")
        return ratios("separable") + (f"; {control}" if control else "")
    lines = [
        "| MobileViTV2-0.5, Fashion-MNIST, 1,000 test images | 64x64 | 128x128 | 256x256 |",
        "|---|---|---|---|",
        "| **the default int8 file** (`mvit2 export`): agreement with Keras, median of 3 "
        "trainings (per training), top-1 drop (points) | "
        f"{fidelity(current, 64, DEFAULT_ROW)} | {fidelity(older, 128, DEFAULT_ROW)} (the "
        "older default¹) | " f"{fidelity(current, 256, DEFAULT_ROW)} |",
        "| control: MobileNetV2-0.5 by the plain `TFLiteConverter` | "
        f"{fidelity(older, 64, CONTROL_ROW, False)} | {fidelity(older, 128, CONTROL_ROW, False)}"
        f" | {fidelity(older, 256, CONTROL_ROW, False)} |",
        "| our model by the plain `TFLiteConverter` | "
        f"{fidelity(current, 64, PLAIN_ROW)} | - | {fidelity(current, 256, PLAIN_ROW)} |",
        "| QAT at its defaults: the trained file's gain in agreement on the test images over "
        "the post-training file, per training² | "
        f"{qat_cell(qat.get(64))} | - | {qat_cell(qat.get(256))} |",
        "| QAT in `mvit2 finetune` (weak fine-tunes, 1,000 test photos)² | | | "
        f"{fine_gain} (judged {fine_judged}); shipped file below the post-training one "
        f"{fine_below} of {len(finetune)} |",
        "| the PyTorch road's int8, two fine-tunes (1,000 test photos)³ | | | "
        f"{torch_cells}, against the TensorFlow road's {tf_cells} |",
        f"| published W8A8 on ImageNet, top-1 change (points) | | | {anchors} |",
    ] + [
        "| **speed**: the default int8 file's latency / its float32 file's, 1 / 2 threads "
        f"(`int8_speed.py`, {speed['cpu']['model']}, {kind}); the control's | "
        f"{speed_cell(speed, 64)} | - | {speed_cell(speed, 256)} |"
        for kind, speed in speeds.items()
    ]
    return "\n".join(lines) + (
        "\n\n¹ 128x128 was measured once, on earlier trainings, before the GroupNorm's "
        "`E[x^2]` became a matrix product and the products' second operand got zero point 0. "
        f"² {judged} ³ Both roads give the products' second operands the same zero points "
        "(`activation_ranges.zero_offset_matmul_operands`).")


@renderer("int8_fidelity")
def int8_fidelity_table(results: Results) -> str:
    fidelity = _benchmark("int8_fidelity")
    return "\n".join(fidelity.fidelity_rows(results.json(FIDELITY_QAT)["table"]))


@renderer("int8_fidelity_older")
def int8_fidelity_older(results: Results) -> str:
    fidelity = _benchmark("int8_fidelity")
    return "\n".join(fidelity.fidelity_rows(results.json("int8_fidelity.json")["table"]))


@renderer("int8_qat_choice")
def int8_qat_choice(results: Results) -> str:
    fidelity = _benchmark("int8_fidelity")
    runs = _qat_runs(results)
    entries = [{"size": size, "runs": runs[size]} for size in sorted(runs, reverse=True)]
    return "\n".join(fidelity.qat_table(entries)[2:])  # the page says what the columns are


@renderer("finetune_qat_choice")
def finetune_qat_choice(results: Results) -> str:
    lines = ["| run | judged: post-training / QAT (points gained) | file shipped | 1,000 test "
             "photos: post-training / QAT (points gained) | shipped file below the "
             "post-training one there |", "|---|---|---|---|---|"]
    for name, facts, test in _finetune_qat(results):
        judged = (f"{pct(facts['agreement_post_training'])} / {pct(facts['agreement_qat'])} "
                  f"({points(100 * (facts['agreement_qat'] - facts['agreement_post_training']))})")
        if facts.get("p_value") is not None:  # judged by today's choice
            judged += f" on {facts['num_judged']} images, p = {facts['p_value']:.2g}"
        on_test = (f"{pct(test['agreement_post_training'])} / {pct(test['agreement_qat'])} "
                   f"({points(test['gain_points'])})")
        lines.append(f"| {name} | {judged} | {facts['shipped']} | {on_test} | "
                     f"{'yes' if test['shipped_below_post_training'] else 'no'} |")
    return "\n".join(lines)


@renderer("finetune_int8_check")
def finetune_int8_check(results: Results) -> str:
    """The 1,000-test-photo figures of the QAT runs on the shipped graph."""
    record = results.json("finetune_int8_check.json")
    lines = ["| run | file | top-1 | drop (points) | agreement with Keras | agreement where "
             "Keras' margin is above its median |", "|---|---|---:|---:|---:|---:|"]
    for name in FINETUNE_QAT_RUNS:
        for file, row in record[name]["test"].items():
            if file == "keras":
                lines.append(f"| {name} | Keras (median margin {row['median_margin']:.2f}) | "
                             f"{pct(row['top1'])} | | | |")
                continue
            lines.append(f"| {name} | `{file}` | {pct(row['top1'])} | "
                         f"{points(row['drop_points'])} | {pct(row['agreement'])} | "
                         f"{pct(row.get('agreement_confident_half'))} |")
    return "\n".join(lines)


@renderer("torch_road_int8")
def torch_road_int8(results: Results) -> str:
    record = results.json("torch_road_int8.json")
    lines = ["| fine-tune (Keras top-1) | TensorFlow road, default int8 | PyTorch road, token "
             "sum as a matrix product | PyTorch road, as a product and a mean (its default) |",
             "|---|---:|---:|---:|"]
    for name in TORCH_ROAD_RUNS:
        files = record[name]["files"]
        cells = [f"{pct(files[k]['agreement'])} ({points(files[k]['drop_points'])})"
                 for k in ("tensorflow_int8", "torch_int8", "torch_int8_product_mean")]
        lines.append(f"| {name} ({pct(record[name]['keras_top1'])}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


@renderer("published_int8")
def published_int8(results: Results) -> str:
    lines = ["| model | W8A8 method | float top-1 | int8 top-1 | change (points) | source |",
             "|---|---|---:|---:|---:|---|"]
    for r in results.json("published_int8.json")["rows"]:
        lines.append(f"| {r['model']} | {r['method']} | {r['float_top1']:.2f} | "
                     f"{r['int8_top1']:.2f} | {r['int8_top1'] - r['float_top1']:+.2f} | "
                     f"{r['source']} |")
    return "\n".join(lines)


# -------------------------------------------------- int8: the investigation's result pages


def _section(name: str, heading: str | None, index: int = 0) -> Callable[[Results], str]:
    """A renderer of table `index` of the result page `name` (after `heading`)."""
    def render(results: Results) -> str:
        return "\n".join(results.table(name, heading, index))
    return render


for _name, _file, _heading in (
        ("root_cause_prefix", "int8_root_cause.md", "int8 prefix, float suffix"),
        ("root_cause_ranges_256", "int8_root_cause.md", "Activation ranges at 256x256"),
        ("root_cause_ranges_64", "int8_root_cause.md", "Activation ranges at 64x64"),
        ("root_cause_channels", "int8_root_cause.md", "Per-channel ranges"),
        ("root_cause_suspects", "int8_root_cause.md", "Suspects, each changed alone"),
        ("root_cause_bias_correction", "int8_root_cause.md", "Empirical bias correction"),
        ("root_cause_range_share", "int8_root_cause.md", "The share of the min / max width"),
        ("root_cause_noise", "int8_root_cause.md", "Noise budget"),
        ("root_cause_one_rounding", "int8_root_cause.md", "One rounding"),
        ("root_cause_float_islands", "int8_root_cause.md", "Float islands"),
        ("groupnorm_variance_int8", "groupnorm_variance_int8.md", None)):
    RENDERERS[_name] = _section(_file, _heading)
# Each attention's int8 files against Keras on unseen images, and the two files of one model
# image by image; the same trained models converted by the code before the associations
# with fewer multiply-adds (its own folder).
RENDERERS["attention_int8_agreement"] = _section("attention_int8_agreement.md", None)
RENDERERS["attention_int8_agreement_paired"] = _section("attention_int8_agreement.md", None, 1)
RENDERERS["attention_int8_agreement_before"] = _section(
    "attention_int8_agreement_40a7e6b/attention_int8_agreement.md", None)


@renderer("qat_variants")
def qat_variants(results: Results) -> str:
    return "\n".join(_benchmark("qat_variants").table(results.json("qat_variants.json")))


# ------------------------------------------------------------------ int8 against float32


def _int8_speed_gate(results: Results, name: str) -> str:
    speed = _benchmark("int8_speed")
    record = results.json(name)
    return "\n".join([f"{speed.host_line(record)}; median ms (95 % interval), 1 thread: "
                      "thread CPU time, 2 threads: wall clock.", "", speed.verdict(record), "",
                      *speed.gate_table(record), "", "ms per GMAC at 256x256:", "",
                      *speed.gmac_table(record)])


@renderer("int8_speed_gate")
def int8_speed_gate(results: Results) -> str:
    return _int8_speed_gate(results, SPEED)


def _int8_speed_profile(results: Results, name: str) -> str:
    return "\n".join(_benchmark("int8_speed").profile_table(results.json(name)))


def _int8_speed_variants(results: Results, name: str) -> str:
    return "\n".join(_benchmark("int8_speed").variants_table(results.json(name)))


renderer("int8_speed_profile")(functools.partial(_int8_speed_profile, name=SPEED))
renderer("int8_speed_variants")(functools.partial(_int8_speed_variants, name=SPEED))
# The same benchmark's gate, profile and variants on each other host, from its own result
# folder: blocks `int8_speed_gate_<host>`, `int8_speed_profile_<host>` and
# `int8_speed_variants_<host>`.
for _host, _name in {"avx2": SPEED_AVX2, "intel": SPEED_INTEL,
                     "intel_64": SPEED_INTEL_64}.items():
    renderer(f"int8_speed_gate_{_host}")(functools.partial(_int8_speed_gate, name=_name))
    renderer(f"int8_speed_profile_{_host}")(functools.partial(_int8_speed_profile,
                                                               name=_name))
    renderer(f"int8_speed_variants_{_host}")(functools.partial(_int8_speed_variants,
                                                                name=_name))
renderer("int8_speed_kernels_intel")(lambda results: "\n".join(
    _benchmark("int8_speed").kernels_table(results.json(SPEED_INTEL))))


@renderer("int8_speed_separable")
def int8_speed_separable(results: Results) -> str:
    speed = _benchmark("int8_speed")
    record = results.json(SPEED)
    return "\n".join([*speed.gate_table(record, ("separable", "mobilenetv2_050")), "",
                      f"{speed.host_line(record)}; ms per GMAC of full int8 at 256x256, "
                      "1 / 2 threads: "
                      + ", ".join(f"{name} {' / '.join(f'{v:.1f}' for v in values)}"
                                  for name, values in _per_gmac(record).items()) + "."])


def _per_gmac(record: dict) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for key, value in record["ms_per_gmac"].items():
        out.setdefault(key.rsplit(" ", 1)[0], []).append(value["int8"])
    return out


@renderer("attention_table")
def attention_table(results: Results) -> str:
    """The paper's Table 1 with our recipe: the benchmark's own page (attention_table.md)."""
    return _benchmark("attention_table").markdown(results.json("attention_table.json"))


# ------------------------------------------------------------------ the other guides' tables

for _name, _file, _index in (
        ("model_latency", "model_latency.md", 0),
        ("dynamic_input_latency", "dynamic_input_latency.md", 0),
        ("repeatability", "repeatability.md", 0),
        ("export_roads_tflite", "export_roads.md", 0),
        ("web_latency", "web_latency.md", 0),
        ("backend_accuracy", "backend_accuracy.md", 0),
        ("fashion_mnist_accuracy", "fashion_mnist.md", 0),
        ("fashion_mnist_cost", "fashion_mnist.md", 1),
        ("recipe_learns", "recipe_learns.md", 0),
        ("task_learning_segmentation", "task_learning.md", 0),
        ("task_learning_detection", "task_learning.md", 1),
        ("training_throughput", "training_throughput.md", 0),
        ("training_throughput_multiscale", "training_throughput_multiscale.md", 0),
        ("training_throughput_64_b32", "training_throughput_64_b32.md", 0),
        ("training_throughput_backends_256", "training_throughput_backends_256.md", 0),
        ("quantization_accuracy", "quantization_accuracy.md", 0)):
    RENDERERS[_name] = _section(_file, None, _index)


@renderer("export_roads")
def export_roads(results: Results) -> str:
    """The two roads' files side by side: `.tflite`, the latency line, Core ML, Core AI."""
    def line(start: str) -> str:
        return results.section("export_roads.md", start)[0]

    return "\n".join([
        *results.table("export_roads.md", None, 0), "", line("Latency ratio"), "",
        *results.table("export_roads.md", None, 2), "", line("float32 `.aimodel`")])


@renderer("latency_breakdown")
def latency_breakdown(results: Results) -> str:
    record = results.json("latency_breakdown.json")
    lines = ["| segment (float32, 1 thread, XNNPACK) | ours ms | kecam ms | ours / kecam |",
             "|---|---:|---:|---:|"]
    for seg in [*record["segments"], {"segment": "whole model", **record["whole_model"]}]:
        lines.append(f"| {seg['segment']} | {seg['ours_ms']:.3f} | {seg['kecam_ms']:.3f} | "
                     f"{seg['ratio']:.2f} |")
    return "\n".join(lines)


@renderer("latency_vs_kecam")
def latency_vs_kecam(results: Results) -> str:
    record = results.json("latency.json")
    models, ratios = record["models"], record["ratios"]
    lines = ["| MobileViTV2-0.5, 256x256, 1 thread, XNNPACK | ours (ms) | kecam port (ms) | "
             "ours / kecam | bar |", "|---|---:|---:|---:|---|"]
    for ours, kecam, what in (("ours_int8", "kecam_int8", "full int8 (int8 I/O)"),
                              ("ours_fp32", "kecam_fp32", "float32"),
                              ("ours_fp32_unfused", "kecam_fp32", "float32, 1x1 pairs not fused"),
                              ("ours_int8_unfused", "kecam_int8",
                               "full int8, 1x1 pairs not fused")):
        ratio = ratios[f"{ours} / {kecam}"]
        bar = "" if ratio["bar"] is None else (
            f"<= {ratio['bar']:g}: {'met' if ratio['pass'] else 'missed'}")
        lines.append(f"| {what} | {models[ours]['xnnpack']['median_ms']:.2f} | "
                     f"{models[kecam]['xnnpack']['median_ms']:.2f} | {ratio['value']:.2f} | "
                     f"{bar} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ budget


def _budget(size: int, target: str) -> Callable[[Results], str]:
    def render(results: Results) -> str:
        return "\n".join(results.section("optimize_budget.md",
                                          f"**mobilevitv2_050 {size}x{size}, {target}**"))
    return render


for _size in (64, 256):
    for _target in ("tflite", "coreml"):
        RENDERERS[f"optimize_budget_{_size}_{_target}"] = _budget(_size, _target)


# ------------------------------------------------------------------------------ fine-tune


@renderer("finetune_photos")
def finetune_photos(results: Results) -> str:
    photos = _benchmark("finetune_photos")
    return "\n".join(photos.table(results.json("finetune_photos.json"))[:-2])


@renderer("finetune_int8_check_all")
def finetune_int8_check_all(results: Results) -> str:
    check = _benchmark("finetune_int8_check")
    record = results.json("finetune_int8_check.json")
    for entry in record.values():
        entry["qat_on_test"] = check.qat_on_test(entry["test"], check.qat_facts(entry["held_out"]))
    lines = check.table(record)
    return "\n".join(lines[:lines.index("")])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pages", nargs="*", help="pages to render (default: docs/*.md, README.md)")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 naming the blocks that differ")
    parser.add_argument("--results", default=RESULTS, help="the result folder")
    args = parser.parse_args(argv)
    paths = args.pages or pages()
    if args.check:
        stale = stale_blocks(paths, args.results)
        for line in stale:
            print(f"out of date: {line}")
        return 1 if stale else 0
    for path in paths:
        with open(path) as f:
            text = f.read()
        rendered = render_page(text, args.results)
        if rendered != text:
            with open(path, "w") as f:
                f.write(rendered)
            print(f"rendered {os.path.relpath(path, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
