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


@pytest.fixture(scope="session")
def timm_oracle_v1_dir(tmp_path_factory) -> Path:
    """Folder of the run's one MobileViT v1 / DeiT timm oracle run
    (shared_fixtures.V1_VIT_ORACLE_*): per model `<model>.safetensors` and `<model>.npz`,
    and `manifest.json` (see tests/timm_oracle_v1_vit.py)."""
    from model_utils import TORCH_READY
    from shared_fixtures import once_per_run, run_timm_oracle_v1_vit

    if not TORCH_READY:
        pytest.skip("needs torch, timm and safetensors")
    return once_per_run(tmp_path_factory.getbasetemp(), "timm_oracle_v1_vit",
                        run_timm_oracle_v1_vit)


@pytest.fixture(scope="module", autouse=True)
def _free_keras_state():
    """After each module, Keras' global state (layer-name counters, traced functions) is
    cleared, so what a module sees does not depend on which modules ran before it in the
    same process (pytest-xdist gives each process its own mix). It did not lower a run's
    memory peak (13-15 GB for `.ci/run` either way)."""
    yield
    import keras

    keras.backend.clear_session(free_memory=True)


#: Fixtures that put a test in the slow tier wherever it uses them: the timm oracles start a
#: subprocess; the trained checkpoints load in a second, but every test that takes one
#: converts or quantizes it, or runs it in a client (MediaPipe, the browser).
SLOW_FIXTURES = {"trained_classifier_path", "trained_detector", "timm_oracle_dir",
                 "timm_oracle_v1_dir"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def client_classifier_tflite(trained_classifier_path, tmp_path_factory) -> dict[str, Path]:
    """{quantization: `.tflite`} of the trained classifier for
    shared_fixtures.CLIENT_CLASSIFIER_QUANTIZATIONS (float32, int8; float I/O, Fashion-MNIST's
    class names: `write_client_classifier_tflite`), made once per run for the client modules
    (tests/test_web.py, tests/test_mediapipe_clients.py), which only read them."""
    from shared_fixtures import (
        CLIENT_CLASSIFIER_QUANTIZATIONS,
        once_per_run,
        write_client_classifier_tflite,
    )

    folder = once_per_run(tmp_path_factory.getbasetemp(), "client_classifier_tflite",
                          lambda out: write_client_classifier_tflite(out, trained_classifier_path))
    return {q: folder / f"classifier_{q}.tflite" for q in CLIENT_CLASSIFIER_QUANTIZATIONS}


@pytest.fixture(scope="session")
def client_detector_tflite(trained_detector, tmp_path_factory) -> Path:
    """`.tflite` of the committed detector with its post-processing op (float32, its class
    names: `write_client_detector_tflite`), made once per run for the client modules
    (tests/test_web.py, tests/test_mediapipe_clients.py), which only read it."""
    from shared_fixtures import once_per_run, write_client_detector_tflite

    model, _, names = trained_detector
    folder = once_per_run(tmp_path_factory.getbasetemp(), "client_detector_tflite",
                          lambda out: write_client_detector_tflite(out, model, names))
    return folder / "detector.tflite"
