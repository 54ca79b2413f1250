"""Notebooks run in CI through nbmake with small settings (each notebook reads MVIT2_SMALL).

Notebook 01 downloads `weights="imagenet"`: in CI (no internet) it gets them from the loopback
stand-in of the Hugging Face hub of the tests (tests/hub_standin.py), serving a checkpoint made
by timm with random weights (tests/torch_oracle.py, in a subprocess); HF_ENDPOINT and HF_HOME
point the notebook's kernel at it and at a temporary cache. MVIT2_HUB_STANDIN=1 tells the
notebook its labels are meaningless.

Notebook 03 quantizes and exports a trained classifier: in CI it loads the tests' committed
one (MVIT2_MODEL: tests/data/checkpoints/classifier.keras, MobileViTV2-0.5 at 32x32, made by
tests/make_checkpoints.py) instead of training its own, as a user passes their model (44
against 69 s on 2 cores). The training it would run is `keras_mvit2.demo`'s small one, which
tests/test_demo.py runs.
"""

import os
import subprocess
import sys
import tempfile

os.environ.setdefault("MVIT2_SMALL", "1")

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
NEEDS_HUB = {"01_quickstart.ipynb": ["mobilevitv2_050"]}
#: Environment a notebook's kernel gets (unless the run's environment sets it already).
NEEDS_ENV = {"03_quantize_and_export.ipynb": {
    "MVIT2_MODEL": os.path.join(TESTS, "data", "checkpoints", "classifier.keras")}}
_saved: dict[str, str | None] = {}
_running: list = []


def _start_standin(models: list[str]) -> dict[str, str]:
    sys.path.insert(0, TESTS)
    from hub_standin import HubStandIn

    work = tempfile.mkdtemp(prefix="mvit2_nb_hub_")
    subprocess.run(
        [sys.executable, os.path.join(TESTS, "torch_oracle.py"), "--out-dir", work,
         "--models", ",".join(models), "--sizes", "32x32", "--block-sizes", "8x8",
         "--batch", "1"],
        check=True, stdout=subprocess.DEVNULL,
    )
    server = HubStandIn()
    for model in models:
        with open(os.path.join(work, f"{model}.safetensors"), "rb") as f:
            server.serve(f"timm/{model}.cvnets_in1k", "model.safetensors", f.read())
    _running.append(server)
    return {"HF_ENDPOINT": server.url, "HF_HOME": os.path.join(work, "hf"),
            "HF_HUB_DISABLE_PROGRESS_BARS": "1", "MVIT2_HUB_STANDIN": "1"}


def pytest_runtest_setup(item):
    name = os.path.basename(str(item.fspath))
    for key, value in NEEDS_ENV.get(name, {}).items():
        if key not in os.environ:
            _saved[key] = None
            os.environ[key] = value
    models = NEEDS_HUB.get(name)
    if not models:
        return
    env = _start_standin(models)
    _saved["HF_HUB_OFFLINE"] = os.environ.pop("HF_HUB_OFFLINE", None)
    for key, value in env.items():
        _saved[key] = os.environ.get(key)
        os.environ[key] = value  # the notebook's kernel starts with this environment


def pytest_runtest_teardown(item):
    while _running:
        _running.pop().stop()
    for key, value in _saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _saved.clear()
