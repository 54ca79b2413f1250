"""What users install: the version in one place, `mvit2 --version`, the built wheel holds
every file of the package tree, and the notebooks' install settings name that wheel.

The wheel test reads the sdist and wheel in `$MVIT2_DIST` when set (CI builds them once with
`python -m build` and tests the same files it installs); otherwise it builds them here with
`python -m build --no-isolation` (a few seconds, no network).
"""

import configparser
import glob
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile

import pytest

import keras_mvit2 as mv
from keras_mvit2.cli.main import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))


def test_cli_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"mvit2 {mv.__version__}"


def test_version_in_one_place():
    assert re.fullmatch(r"\d+\.\d+\.\d+", mv.__version__), mv.__version__
    setup = configparser.ConfigParser()
    setup.read(os.path.join(ROOT, "setup.cfg"))
    assert setup["metadata"]["version"] == "attr: keras_mvit2._version.__version__"
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        assert not re.search(r"^version\s*=", f.read(), re.M), "a second version in pyproject"
    with open(os.path.join(ROOT, "CHANGELOG.md")) as f:
        versions = re.findall(r"^## (\S+)", f.read(), re.M)
    assert versions[0] == mv.__version__, f"CHANGELOG.md's newest entry is {versions[0]}"
    assert versions == sorted(versions, key=lambda v: [int(p) for p in v.split(".")],
                              reverse=True), versions


def _install_setting(path: str) -> str:
    with open(path) as f:
        cells = [c for c in json.load(f)["cells"] if c["cell_type"] == "code"]
    match = re.search(r'^KERAS_MVIT2 = "([^"]+)"', "".join(cells[0]["source"]), re.M)
    assert match, f"{os.path.basename(path)}: no KERAS_MVIT2 setting in the first code cell"
    return match.group(1)


def test_notebook_install_setting_names_this_version_wheel():
    """The default of each notebook's install setting is the wheel `python -m build` makes of
    this version (regenerate the notebooks after a version bump: make_nb.py reads it)."""
    assert NOTEBOOKS, "no notebooks found"
    wheel = f"keras_mvit2-{mv.__version__}-py3-none-any.whl"
    for path in NOTEBOOKS:
        setting = _install_setting(path)
        assert re.fullmatch(re.escape(wheel) + r"\[[a-z,]+\]", setting), (path, setting)
        with open(path) as f:
            text = f.read()
        # No address that does not exist (the badges pointed at an invented repository).
        assert "keras-mvit2/keras_mvit2" not in text and "colab-badge" not in text, path


def _package_files() -> set[str]:
    """Files of the package tree: git's tracked and not-ignored files under keras_mvit2/."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "keras_mvit2"],
            cwd=ROOT, check=True, capture_output=True, text=True).stdout
        files = {p for p in out.splitlines() if os.path.isfile(os.path.join(ROOT, p))}
    except (OSError, subprocess.CalledProcessError):  # not a git checkout
        files = set()
        for folder, dirs, names in os.walk(os.path.join(ROOT, "keras_mvit2")):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            files |= {os.path.relpath(os.path.join(folder, n), ROOT) for n in names
                      if not n.endswith(".pyc")}
    assert files, "no package files found"
    return {p.replace(os.sep, "/") for p in files}


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """The folder with this version's sdist and wheel ($MVIT2_DIST, or built here)."""
    folder = os.environ.get("MVIT2_DIST")
    if not folder:
        pytest.importorskip("build")
        folder = str(tmp_path_factory.mktemp("dist"))
        subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", folder,
                        ROOT], check=True, capture_output=True)
    return folder


@pytest.mark.slow
def test_wheel_holds_every_package_file(dist):
    """A data file left out of setup.cfg's package_data (or a folder without __init__.py)
    works in an editable checkout and breaks the installed wheel: compare the two."""
    wheel = os.path.join(dist, f"keras_mvit2-{mv.__version__}-py3-none-any.whl")
    sdist = os.path.join(dist, f"keras_mvit2-{mv.__version__}.tar.gz")
    with zipfile.ZipFile(wheel) as z:
        in_wheel = set(z.namelist())
    with tarfile.open(sdist) as t:
        prefix = f"keras_mvit2-{mv.__version__}/"
        in_sdist = {n[len(prefix):] for n in t.getnames() if n.startswith(prefix)}
    package = _package_files()
    assert any(p.endswith(".yaml") for p in package) and any(p.endswith(".tsv") for p in package)
    assert sorted(package - in_wheel) == [], "missing from the wheel (setup.cfg package_data)"
    assert sorted(package - in_sdist) == [], "missing from the sdist"
    with zipfile.ZipFile(wheel) as z:
        entry_points = z.read(f"keras_mvit2-{mv.__version__}.dist-info/entry_points.txt")
    assert "mvit2 = keras_mvit2.cli:main" in entry_points.decode()
