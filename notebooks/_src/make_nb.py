"""Generator of the notebooks: each nbNN.py lists ("md" | "code", source) cells (no outputs).

Regenerate one notebook:  python notebooks/_src/nb02.py
Regenerate all of them:   python notebooks/_src/make_nb.py
Write elsewhere (to diff): python notebooks/_src/make_nb.py /tmp/nb
Cell ids are derived from the cell position, so regenerating an unchanged notebook gives
the same file.
"""
import glob
import os
import re
import runpy
import sys

import nbformat

NOTEBOOKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSION_FILE = os.path.join(os.path.dirname(NOTEBOOKS), "keras_mvit2", "_version.py")


def version():
    """keras_mvit2.__version__, read from the source (importing it would load TensorFlow)."""
    with open(VERSION_FILE) as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def wheel():
    """The file name of the wheel that `python -m build` writes into dist/."""
    return f"keras_mvit2-{version()}-py3-none-any.whl"


#: Where the notebooks say to look for Colab instructions (no badge: no public URL is known).
COLAB_NOTE = ("To run this notebook in Colab, upload it and the keras_mvit2 wheel (or point "
              "`KERAS_MVIT2` in the first code cell at a Git repository): see *Notebooks in "
              "Colab* in the project's README.")


def install(extras="torch,coreml", colab_only=""):
    """The first code cell: the `KERAS_MVIT2` setting (a pip requirement with `extras`) and
    an install that runs only where keras_mvit2 does not import yet; `colab_only` is a
    shell line run on Colab only."""
    cell = f'''# ======== SETTING: where pip installs keras_mvit2 from (edit this line) ========
KERAS_MVIT2 = "{wheel()}[{extras}]"
# Default: the wheel that `python -m build` writes into dist/, uploaded to this session
# (Colab: Files pane > Upload, into /content). Or a pip requirement such as
#   "keras_mvit2[{extras}] @ git+https://github.com/<you>/keras_mvit2@main"  (a Git repository)
#   "keras_mvit2[{extras}]=={version()}"  (a version published on PyPI; none is yet)
# Nothing is installed where keras_mvit2 already imports (a checkout after `pip install -e .`,
# or a session that ran this cell before: to change versions there, run
# `%pip uninstall -y keras_mvit2`, restart the runtime and run this cell again).
import importlib.util
import os
import sys

spec = importlib.util.find_spec("keras_mvit2")
if spec is None:
    source = KERAS_MVIT2.split("[")[0]
    if source.endswith(".whl") and not os.path.exists(source):
        raise FileNotFoundError(
            f"{{source}} is not in {{os.getcwd()}}: upload the wheel built by `python -m build` "
            "there, or set KERAS_MVIT2 to a Git URL or a published version")
    %pip install -q "{{KERAS_MVIT2}}"
else:
    print(f"keras_mvit2 already imports from {{os.path.dirname(spec.origin)}}: not installing")'''
    if colab_only:
        cell += f'''
if "google.colab" in sys.modules:
    {colab_only}'''
    return cell


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
