"""The exports in a real browser: MediaPipe Tasks for the web in headless Chromium.

The page of the web target (`mvit2 export -o NAME.web`, `mvit2 web`) is served on
127.0.0.1 and driven by Playwright; the oracles are the Keras model (top-1 agreement, class
names), LiteRT on the same `.tflite` (scores, the int8 agreement figure) and
`postprocess_detections` (the detector's boxes). One Chromium for the module; the 200 test
images go through each page in batches. Skips, with the reason, where Chromium, Playwright
or the page's runtime are absent (`.ci/run` installs all three).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request

import keras
import numpy as np
import pytest
from shared_fixtures import (
    CLASSIFIER_SIZE,
    DETECTOR_SCORE_THRESHOLD,
    DETECTOR_SIZE,
    client_classifier,
    client_pixels,
    client_rgb_uint8,
    fashion_mnist_ready,
)

from keras_mvit2.data.files import FASHION_MNIST_CLASSES, load_fashion_mnist_arrays
from keras_mvit2.export import get_target, run_tflite
from keras_mvit2.export.web import Browser, browser_unavailable, build_site, serve

SIZE = CLASSIFIER_SIZE
NUM_TEST = 200
#: Latency: median of this many timed runs (after 10 untimed ones).
BENCH_RUNS = 50
REASON = browser_unavailable()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(REASON is not None, reason=f"no browser here: {REASON}"),
    pytest.mark.skipif(not fashion_mnist_ready(), reason="Fashion-MNIST not installed "
                       "(apt-get install dataset-fashion-mnist)"),
]


@pytest.fixture(scope="module")
def browser():
    with Browser() as chromium:
        yield chromium


@pytest.fixture(scope="module")
def data():
    """The first NUM_TEST test images as a page has them (RGB uint8), and their labels."""
    xs, ys = load_fashion_mnist_arrays("test")
    return client_rgb_uint8(xs[:NUM_TEST], SIZE), ys[:NUM_TEST]


@pytest.fixture(scope="module")
def classifier(trained_classifier_path):
    """The run's trained Fashion-MNIST MobileViTV2-0.5 (32x32) with a softmax."""
    return client_classifier(trained_classifier_path)


@pytest.fixture(scope="module")
def pages(client_classifier_tflite, tmp_path_factory):
    """The float32 and full-int8 (float I/O) exports as `.web` page folders: the run's
    `.tflite` files of the classifier with a softmax and Fashion-MNIST's names, the int8 one
    calibrated on the first 200 training images (conftest.py's `client_classifier_tflite`,
    which tests/test_mediapipe_clients.py loads too), each in the page `build_site` writes
    around it, as `mvit2 export -o classifier_<quantization>.web` does."""
    folder = tmp_path_factory.mktemp("web")
    web = get_target("web")
    out = {}
    for quantization in ("float32", "int8"):
        path = folder / f"classifier_{quantization}.web"
        build_site(client_classifier_tflite[quantization], path)
        report = web.inspect(path)
        assert {"index.html", "app.js", "config.json", "model.tflite",
                "mediapipe/vision_wasm_internal.wasm"} <= set(report.files)
        assert web.metadata(path)["quantization"] == quantization
        out[quantization] = path
    return out


def test_classifier_pages_agree_with_keras_and_litert(browser, pages, classifier, data,
                                                      record_property, tmp_path):
    images, labels = data
    keras_top1 = np.asarray(classifier.predict(images / 255.0, verbose=0)).argmax(-1)
    assert np.mean(keras_top1 == labels) >= 0.6  # trained: the agreement means something
    figures = {}
    for quantization, path in pages.items():
        litert = run_tflite(path / "model.tflite", images / 255.0)
        with serve(path) as url:
            page = browser.open(url)
            assert page.config["task"] == "classifier"
            assert page.config["class_names"] == list(FASHION_MNIST_CLASSES)
            scores, names = page.classify(images)
            if quantization == "float32":
                shown = page.screenshot(tmp_path / "page.png", images[0])
            page.close()
        top1 = scores.argmax(-1)
        assert names == [FASHION_MNIST_CLASSES[i] for i in top1], quantization
        agreement = float(np.mean(top1 == keras_top1))
        litert_agreement = float(np.mean(litert.argmax(-1) == keras_top1))
        figures[quantization] = {"browser_vs_keras": agreement,
                                 "litert_vs_keras": litert_agreement,
                                 "browser_vs_litert": float(np.mean(top1 == litert.argmax(-1))),
                                 "max_abs_score_vs_litert": float(np.abs(scores - litert).max())}
        minimum = 0.99 if quantization == "float32" else min(0.95, litert_agreement)
        assert agreement >= minimum, (quantization, figures)
        # The same file in the same kernels (XNNPACK): the browser is LiteRT's twin.
        assert figures[quantization]["browser_vs_litert"] >= 0.99, figures
    assert figures["float32"]["max_abs_score_vs_litert"] < 1e-3, figures
    # The screenshot shows the first image's top-5 with its names, top-1 first.
    assert shown.startswith(FASHION_MNIST_CLASSES[keras_top1[0]]), shown
    with open(tmp_path / "page.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("MVIT2_WEB_SCREENSHOT"):  # docs/web-page.png is made this way
        shutil.copyfile(tmp_path / "page.png", os.environ["MVIT2_WEB_SCREENSHOT"])
    record_property("web_top1_agreement", json.dumps(figures))
    print("MediaPipe Tasks web (Chromium) top-1 agreement:", figures, file=sys.stderr)


def test_latency_in_the_browser_beside_litert(browser, pages, record_property):
    """Median ms per image over BENCH_RUNS runs: the page's task call (image in, results
    out) in Chromium, and LiteRT's invoke on this host, 1 thread and the cores' count."""
    from keras_mvit2.latency.host import bench_file, bench_tflite

    figures = {}
    for quantization, path in pages.items():
        record = bench_file(path, runs=BENCH_RUNS, warmup=10, browser=browser)
        assert record.runtime["name"] == "mediapipe-tasks-web"
        assert record.device["platform"] == "browser" and record.latency_ms.runs == BENCH_RUNS
        row = {"browser_1_thread": record.latency_ms.median}
        for threads in sorted({1, os.cpu_count() or 1}):
            litert = bench_tflite(path / "model.tflite", threads=threads, runs=BENCH_RUNS,
                                  warmup=10, measure_memory=False)
            row[f"litert_{threads}_threads"] = litert.latency_ms.median
        figures[quantization] = row
        assert 0 < row["browser_1_thread"] < 1000, row
    record_property("web_latency_ms", json.dumps(figures))
    print(f"median ms of {BENCH_RUNS} runs:", figures, file=sys.stderr)


def test_mvit2_web_serves_the_page_on_localhost(pages, data, tmp_path):
    """`mvit2 web MODEL.tflite --images DIR` in a subprocess: the printed address serves
    the page, the model's config (task, names) and the listed images, on 127.0.0.1."""
    from PIL import Image

    folder = tmp_path / "images"
    folder.mkdir()
    for i, image in enumerate(data[0][:3]):
        Image.fromarray(image).save(folder / f"test_{i}.png")
    process = subprocess.Popen(
        [sys.executable, "-c", "import sys; from keras_mvit2.cli.main import main; "
         "sys.exit(main())", "web", str(pages["int8"] / "model.tflite"),
         "--images", str(folder)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in process.stdout:
            match = re.search(r"Serving on (http://127\.0\.0\.1:\d+/)", line)
            if match:
                break
        else:
            pytest.fail(f"mvit2 web printed no address: {process.stderr.read()[-2000:]}")
        url = match.group(1)
        config = json.load(urllib.request.urlopen(url + "config.json", timeout=10))
        assert config["task"] == "classifier" and config["quantization"] == "int8"
        assert config["class_names"] == list(FASHION_MNIST_CLASSES)
        assert len(config["images"]) == 3
        page = urllib.request.urlopen(url, timeout=10).read().decode()
        assert '<script type="module" src="app.js">' in page
        image = urllib.request.urlopen(url + config["images"][0], timeout=10).read()
        assert image.startswith(b"\x89PNG")
        wasm = urllib.request.urlopen(url + "mediapipe/vision_wasm_internal.wasm", timeout=10)
        assert wasm.headers["Content-Type"] == "application/wasm"
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_detector_page_boxes_equal_postprocess_detections(browser, trained_detector,
                                                          client_detector_tflite, tmp_path,
                                                          record_property):
    """Every box the page reports is `postprocess_detections`' box of the same class on
    the same image within 1 pixel (x1, y1, x2, y2), with the same number of boxes per image.

    The page's file is the run's float32 `.tflite` of the detector with its post-processing
    op (score threshold DETECTOR_SCORE_THRESHOLD) and class names (conftest.py's
    `client_detector_tflite`, which tests/test_mediapipe_clients.py loads too).
    MediaPipe reports integer pixels, origin and size each truncated (`_client_pixels`):
    the comparison is in those; against the unrounded box that truncation alone moves a
    corner by up to 2 pixels."""
    from keras_mvit2.tasks import postprocess_detections

    model, images, names = trained_detector
    tflite = client_detector_tflite
    raw = np.asarray(model.predict(images / 255.0, verbose=0))
    expected = postprocess_detections(raw, model.anchors, model.anchor_config,
                                      score_threshold=DETECTOR_SCORE_THRESHOLD, top_k=100,
                                      max_detections=100)
    assert sum(len(d) for d in expected) >= NUM_TEST // 2  # trained: confident boxes
    assert build_site(tflite, tmp_path / "detector.web")["task"] == "detector"
    with serve(tmp_path / "detector.web") as url:
        page = browser.open(url)
        results = page.run_batch(images)
        page.close()
    errors, unrounded, counts = [], [], []
    for i, (out, want) in enumerate(zip(results, expected, strict=True)):
        counts.append((len(out["detections"]), len(want)))
        for d in out["detections"]:
            assert d["name"] in names, (i, d)
            cls = names.index(d["name"])
            candidates = np.nonzero(want.classes == cls + 1)[0]
            assert len(candidates), (i, d, want.classes)
            box = np.asarray(d["box"], np.float64)
            errors.append(min(float(np.abs(box - client_pixels(want.boxes[j])).max())
                              for j in candidates))
            unrounded.append(min(float(np.abs(box - want.boxes[j] * DETECTOR_SIZE).max())
                                 for j in candidates))
    assert all(a == b for a, b in counts), [c for c in counts if c[0] != c[1]][:10]
    figures = {"images": NUM_TEST, "boxes": len(errors), "max_px_error": max(errors),
               "mean_px_error": float(np.mean(errors)),
               "max_px_error_vs_unrounded": max(unrounded)}
    record_property("web_detector", json.dumps(figures))
    print("MediaPipe Tasks web ObjectDetector vs postprocess_detections:", figures,
          file=sys.stderr)
    assert max(errors) <= 1.0 and max(unrounded) < 2.0, figures


def test_int8_page_is_calibrated_on_the_images_given(tmp_path):
    """`mvit2 export -o x.web --quantization int8 --calibration-data ...`: the web target
    hands the calibration to the TFLite export inside the page (the classifier pages above
    wrap the run's shared files with `build_site`). A small convolutional model; its
    calibration is recorded in the page's metadata and the file is full int8."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(x))
    images = np.random.default_rng(0).random((20, 16, 16, 3), dtype=np.float32)
    web = get_target("web")
    path = tmp_path / "tiny_int8.web"
    report = web.convert(model, path, quantization="int8", calibration_data=images,
                         class_names=["a", "b", "c"])
    assert {"index.html", "model.tflite", "mediapipe/vision_wasm_internal.wasm"} <= set(
        report.files)
    meta = web.metadata(path)
    assert meta["quantization"] == "int8" and meta["class_names"] == ["a", "b", "c"]
    assert meta["calibration"]["num_samples"] == 20
    assert meta["calibration"]["source"] == "numpy array (20, 16, 16, 3) float32"
    assert report.tflite.float_ops == {}


def test_segmenter_run_gives_litert_masks(tmp_path):
    """`WebTarget.run` on a segmenter page (DeepLabV3, random weights: the browser is
    compared with LiteRT on the same file, not with a trained truth): MediaPipe's
    confidence masks are the file's outputs, its category mask their argmax."""
    from keras_mvit2.tasks import DeepLabV3

    keras.utils.set_random_seed(0)
    model = DeepLabV3(0.5, input_shape=(SIZE, SIZE, 3), classes=4, aspp_channels=32)
    web = get_target("web")
    path = tmp_path / "segmenter.web"
    web.convert(model, path, class_names=["background", "a", "b", "c"])
    images = np.random.default_rng(0).integers(0, 256, (8, SIZE, SIZE, 3), np.uint8)
    litert = run_tflite(path / "model.tflite", images / 255.0)
    masks = web.run(path, images / 255.0)
    assert masks.shape == litert.shape == (8, SIZE, SIZE, 4)
    np.testing.assert_allclose(masks, litert, atol=1e-3)
