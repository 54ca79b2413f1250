"""The guides' tables of measured figures and their result files (`benchmarks/render_docs.py`).

Oracles: the result files under `benchmarks/results/` (every block re-rendered from them
must equal the page), and a copy of them with one figure changed (the check must then fail).
"""

import json
import os
import re
import shutil

import pytest
from benchmark_scripts import load_benchmark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")


@pytest.fixture(scope="module")
def render_docs():
    return load_benchmark("render_docs")


def test_every_rendered_table_equals_its_result_files(render_docs):
    """Each `<!-- render:NAME -->` block of docs/*.md and README.md is what its renderer
    makes of benchmarks/results/ today (else: `python benchmarks/render_docs.py`)."""
    assert render_docs.stale_blocks() == []
    names = {name for path in render_docs.pages()
             for name in render_docs.OPENING.findall(open(path).read())}
    assert {"int8_result_box", "int8_qat_choice", "finetune_qat_choice"} <= names
    assert names <= set(render_docs.RENDERERS)


def test_a_changed_figure_or_a_broken_block_is_caught(render_docs, tmp_path):
    results = tmp_path / "results"
    shutil.copytree(os.path.join(ROOT, "benchmarks", "results"), results)
    page = os.path.join(DOCS, "int8.md")
    assert render_docs.stale_blocks([page], str(results)) == []
    path = results / "int8_fidelity_qat" / "int8_fidelity.json"
    record = json.loads(path.read_text())
    entry = next(e for e in record["table"] if e["size"] == 256
                 and e["row"] == "mobilevitv2_050 int8 p99.99")
    run = record["runs"]["256/seed1"]["mobilevitv2_050 int8 p99.99"]
    run["agreement"] = entry["agreement_per_seed"][1] = 0.5  # one seed's figure changed
    path.write_text(json.dumps(record))
    stale = render_docs.stale_blocks([page], str(results))
    assert "docs/int8.md: int8_result_box" in stale and "docs/int8.md: int8_fidelity" not in stale
    with pytest.raises(ValueError, match="not closed"):
        render_docs.render_page("<!-- render:int8_result_box -->\n| a |\n")
    with pytest.raises(KeyError, match="no renderer named 'nothing'"):
        render_docs.render_page("<!-- render:nothing -->\n<!-- /render -->")


def test_a_renderer_is_a_small_function_registered_by_name(render_docs):
    """What issue 58's tables will do: register a function, mark a block, render."""
    @render_docs.renderer("example_for_the_test")
    def example(results):
        return "| a |\n|---|\n| " + str(len(results.json("published_int8.json")["rows"])) + " |"

    try:
        page = "x\n<!-- render:example_for_the_test -->\nold\n<!-- /render -->\ny\n"
        rendered = render_docs.render_page(page)
        assert rendered.startswith("x\n<!-- render:example_for_the_test -->\n| a |\n|---|\n| 4 |")
        assert "Rendered from `benchmarks/results/published_int8.json`" in rendered
        assert rendered.endswith("<!-- /render -->\ny\n")
        with pytest.raises(ValueError, match="two renderers"):
            render_docs.renderer("example_for_the_test")(example)
    finally:
        del render_docs.RENDERERS["example_for_the_test"]


def test_the_int8_page_opens_with_its_result_box_under_250_lines():
    with open(os.path.join(DOCS, "int8.md")) as f:
        text = f.read()
    assert len(text.splitlines()) <= 250
    first_section = text.split("\n## ")[1]
    assert first_section.startswith("Where it stands\n\n<!-- render:int8_result_box -->")


def _tables_outside_blocks(text: str) -> list[str]:
    """The header line of every Markdown table not inside a render block."""
    outside = re.sub(r"<!-- render:[\w-]+ -->\n.*?<!-- /render -->", "", text, flags=re.S)
    outside = re.sub(r"```.*?```", "", outside, flags=re.S)
    headers, previous = [], ""
    for line in outside.splitlines():
        if line.startswith("|") and not previous.startswith("|"):
            headers.append(line)
        previous = line
    return headers


def test_the_int8_and_fine_tune_pages_print_no_table_that_is_not_rendered():
    for name in ("int8.md", "int8_investigation.md", "finetune.md"):
        with open(os.path.join(DOCS, name)) as f:
            assert _tables_outside_blocks(f.read()) == [], name


#: The tables of the guides that are not rendered, by the start of their header line, and
#: why they hold no measured figure of a benchmark. A new table of measured figures is a
#: render block, not an entry here.
NOT_MEASURED = {
    "| layer | sub-packages": "the package layout",
    "| concept | module |": "where each concept lives",
    "| k | separable | linformer": "issue 58 rebuilds the attention-latency figures",
    "| bar | CPU time | wall clock": "issue 58 rebuilds the attention-latency figures",
    "| mechanism | #1 |": "issue 58 rebuilds the attention-latency figures",
    "| attention | top-1 (%) | params": "issue 58 rebuilds the paper's Table 1",
    "| attention | latency NE (ms)": "the paper's Table 1, published",
    "| width | ours: non-const ops": "conversions' op counts and sizes (test_coreml_layout.py)",
    "| command | runs |": "the test commands",
    "| piece | what it is |": "the task models' parts",
    "| model | input | params (ours)": "counts computed by `mvit2 task-profile`, asserted by tests",
    "| Table 11 |": "the paper's augmentation settings",
    "| task | model | steps | asserted": "what the tests assert",
    "| model | format | asserted": "what the tests assert",
    "| guide | what is in it |": "the guides",
    "| feature | status |": "the features",
    "| step | what it does |": "what `mvit2 demo` does",
    "| what | TensorFlow | JAX | PyTorch |": "backend support, with the bounds its tests assert",
    "| preset | what happens |": "KerasHub presets",
    "| `weights=` | models |": "the published checkpoints",
    "| model | `weights=` | input | file | top-1 % (source) |": "published top-1, with sources",
    "| config | what |": "the packaged configs",
    "| strategy | runs on |": "distribution strategies",
    "| | TensorFlow | JAX | PyTorch |": "what each backend's trainer does",
    "| what | oracle | asserted |": "what the tests assert",
    "| | what it gives | keras_mvit2 |": "other projects",
}


def test_every_other_table_of_the_guides_is_rendered_or_holds_no_measured_figure():
    """docs/models.md (the attention table, issue 58) aside, every table of the guides and
    the README is a render block or one of `NOT_MEASURED`."""
    pages = [p for p in sorted(os.listdir(DOCS)) if p.endswith(".md") and p != "models.md"]
    unknown = []
    for path in [os.path.join(DOCS, p) for p in pages] + [os.path.join(ROOT, "README.md")]:
        with open(path) as f:
            for header in _tables_outside_blocks(f.read()):
                if not any(header.startswith(start) for start in NOT_MEASURED):
                    unknown.append(f"{os.path.basename(path)}: {header[:80]}")
    assert unknown == []
