"""Shared pytest fixtures and settings."""

from pathlib import Path

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def ct():
    """coremltools, imported when a test asks for it; the test is skipped without it.

    Test modules take it through ``pytestmark = pytest.mark.usefixtures("ct")`` rather than
    a module-level ``pytest.importorskip``: every pytest-xdist worker collects every module,
    and importing coremltools imports torch and torchao (~6 s per worker, in the fast tier
    too, where no Core ML test may run in that worker).
    """
    return pytest.importorskip("coremltools")


@pytest.fixture(scope="session")
def trained_classifier_path() -> str:
    """`.keras` file of the committed trained Fashion-MNIST classifier (tests/data/checkpoints,
    made by tests/make_checkpoints.py: MobileViTV2-0.5, logits, 32x32, 80-82 % test
    accuracy)."""
    from shared_fixtures import CHECKPOINTS, fashion_mnist_ready

    if not fashion_mnist_ready():
        pytest.skip("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
    return str(CHECKPOINTS / "classifier.keras")


@pytest.fixture(scope="session")
def trained_detector():
    """(SSDLite, uint8 validation images, class names): the committed detector (see
    tests/make_checkpoints.py: 64x64 on the trained classifier's backbone, 120 steps)."""
    from shared_fixtures import fashion_mnist_ready, load_detector

    if not fashion_mnist_ready():
        pytest.skip("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
    pytest.importorskip("skimage")  # the photos of its validation images
    return load_detector()


@pytest.fixture(scope="session")
def timm_oracle_dir(tmp_path_factory) -> Path:
    """Folder of the run's one timm oracle run (shared_fixtures.ORACLE_*): per model
    `<model>.pth`, `<model>.safetensors` and `<model>.npz` (see tests/torch_oracle.py)."""
    from model_utils import TORCH_READY
    from shared_fixtures import once_per_run, run_timm_oracle

    if not TORCH_READY:
        pytest.skip("needs torch, timm and safetensors")
    return once_per_run(tmp_path_factory.getbasetemp(), "timm_oracle", run_timm_oracle)


@pytest.fixture(scope="module", autouse=True)
def _free_keras_state():
    """After each module, Keras' global state (layer-name counters, traced functions) is
    cleared, so what a module sees does not depend on which modules ran before it in the
    same process (pytest-xdist gives each process its own mix). It did not lower a run's
    memory peak (13-15 GB for `.ci/run` either way)."""
    yield
    import keras

    keras.backend.clear_session(free_memory=True)


#: Fixtures that put a test in the slow tier wherever it uses them: the timm oracle starts a
#: subprocess; the trained checkpoints load in a second, but every test that takes one
#: converts or quantizes it, or runs it in a client (MediaPipe, the browser).
SLOW_FIXTURES = {"trained_classifier_path", "trained_detector", "timm_oracle_dir"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
