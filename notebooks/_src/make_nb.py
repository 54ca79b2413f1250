"""Generator of the notebooks: each nbNN.py lists ("md" | "code", source) cells (no outputs).

Regenerate one notebook:  python notebooks/_src/nb02.py
Regenerate all of them:   python notebooks/_src/make_nb.py
Write elsewhere (to diff): python notebooks/_src/make_nb.py /tmp/nb
Cell ids are derived from the cell position, so regenerating an unchanged notebook gives
the same file.
"""
import glob
import os
import runpy
import sys

import nbformat

REPO = "keras-mvit2/keras_mvit2"
NOTEBOOKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def badge(name):
    url = f"https://colab.research.google.com/github/{REPO}/blob/main/notebooks/{name}"
    return f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({url})"


def install(extras="torch,coreml"):
    """The first code cell: installs keras_mvit2 with `extras` on Colab only."""
    return f'''# Colab: install keras_mvit2 (a local checkout already has it: `pip install -e .`)
import sys

if "google.colab" in sys.modules:
    %pip install -q "keras_mvit2[{extras}] @ git+https://github.com/{REPO}"'''


INSTALL = install()


def write(name, cells, out_dir=None):
    """Writes notebooks/<name> (or <out_dir>/<name>; default: argv[1] if given)."""
    if out_dir is None and len(sys.argv) > 1:
        out_dir = sys.argv[1]
    out_dir = out_dir or NOTEBOOKS
    os.makedirs(out_dir, exist_ok=True)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for index, (kind, src) in enumerate(cells):
        src = src.strip("\n")
        cell = (nbformat.v4.new_markdown_cell(src) if kind == "md"
                else nbformat.v4.new_code_cell(src))
        cell.id = f"cell-{index:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    nbformat.write(nb, os.path.join(out_dir, name))


if __name__ == "__main__":
    for script in sorted(glob.glob(os.path.join(os.path.dirname(__file__), "nb[0-9]*.py"))):
        runpy.run_path(script, run_name="__main__")
