"""The task models on real images (pasted Fashion-MNIST: real Fashion-MNIST items on real
scikit-image photos, built offline): their data pipelines, the committed checkpoints'
metrics against trivial baselines, and their export: TFLite float32 and full int8 run in
LiteRT and compared with Keras, Core ML converted and inspected.

The tests load the committed task checkpoints (`tests/make_checkpoints.py`: MobileViTv2-0.5
at 64x64, a segmenter from scratch in 300 steps, a detector from its backbone in 600).
Whether those recipes learn, over seeds, is a benchmark: `benchmarks/task_learning.py`.
"""

import json
import os

import numpy as np
import pytest
from shared_fixtures import (
    TASK_SIZE,
    detection_data,
    fashion_mnist_ready,
    load_task_models,
    segmentation_data,
    task_anchors,
)

import keras_mvit2 as mv
from keras_mvit2.tasks import data as td
from keras_mvit2.tasks import train as tt
from keras_mvit2.tasks.detection import postprocess_detections, ssd_anchors
from keras_mvit2.tasks.segmentation import confusion_matrix, mean_iou

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not fashion_mnist_ready(),
                       reason="needs the Debian package dataset-fashion-mnist"),
]
pytest.importorskip("skimage")

SIZE = TASK_SIZE
SMALL_ANCHORS = task_anchors()


@pytest.fixture(scope="module")
def seg_data():
    return segmentation_data("train"), segmentation_data("val")


@pytest.fixture(scope="module")
def det_data():
    return detection_data("train"), detection_data("val")


@pytest.fixture(scope="module")
def trained():
    """(segmenter, detector): the committed task checkpoints."""
    return load_task_models()


@pytest.fixture(scope="module")
def segmenter(trained):
    return trained[0]


@pytest.fixture(scope="module")
def detector(trained):
    return trained[1]


def _ground_truth(data: td.PastedDataset):
    return [data.objects(i) for i in range(len(data))]


# --------------------------------------------------------------------------------------
# Pipelines


def test_pasted_dataset_is_exact_and_reproducible(seg_data):
    train, val = seg_data
    assert train.images.shape == (1024, SIZE, SIZE, 3) and train.images.dtype == np.float32
    assert 0.0 <= train.images.min() and train.images.max() <= 1.0
    assert set(np.unique(train.masks)) == {0, 1, 2, 255}       # ignore band on
    assert set(np.unique(val.masks)) == {0, 1, 2}
    assert train.class_names == ("Trouser", "Bag")
    for i in range(50):
        for box, label in zip(*train.objects(i), strict=True):
            x1, y1, x2, y2 = np.round(box * SIZE).astype(int)
            # The box is the tight extent of visible pixels of its class inside it.
            inside = train.masks[i, y1:y2, x1:x2] == label
            assert inside[0].any() and inside[-1].any()
            assert inside[:, 0].any() and inside[:, -1].any()
    again = segmentation_data("val")
    np.testing.assert_array_equal(again.masks, val.masks)
    np.testing.assert_array_equal(again.boxes, val.boxes)


def test_training_pipelines_augment_and_match(seg_data, det_data):
    train, _ = seg_data
    ds = td.segmentation_dataset(train.images[:64], train.masks[:64], 8, training=True,
                                 crop_size=(48, 48), seed=5)
    images, masks = next(iter(ds))
    assert images.shape == (8, 48, 48, 3) and masks.shape == (8, 48, 48)
    assert set(np.unique(masks.numpy())) <= {0, 1, 2, 255}
    again = next(iter(td.segmentation_dataset(train.images[:64], train.masks[:64], 8,
                                              training=True, crop_size=(48, 48), seed=5)))
    np.testing.assert_array_equal(again[1], masks)  # seeded: reproducible
    det_train, _ = det_data
    anchors = ssd_anchors([(8, 8), (4, 4), (2, 2), (1, 1)], SMALL_ANCHORS)
    ds = td.detection_dataset(det_train.images[:64], det_train.boxes[:64], det_train.labels[:64],
                              anchors, 8, training=True, config=SMALL_ANCHORS, seed=1)
    images, targets = next(iter(ds))
    assert images.shape == (8, SIZE, SIZE, 3) and targets.shape == (8, len(anchors), 5)
    labels = targets.numpy()[..., 4]
    assert set(np.unique(labels)) <= {0, 1, 2, 3} and (labels > 0).any()


# --------------------------------------------------------------------------------------
# The committed checkpoints against image-blind baselines (the bars of
# benchmarks/task_learning.py, which trains the same recipes over seeds)


def test_committed_segmenter_beats_the_all_background_predictor(segmenter, seg_data):
    _, val = seg_data
    result = tt.evaluate_segmentation(segmenter, val.images, val.masks, val.num_classes)
    all_background = mean_iou(confusion_matrix(val.masks, np.zeros_like(val.masks),
                                               val.num_classes))
    assert result["miou"] > all_background, (result, all_background)
    assert len(result["per_class_iou"]) == val.num_classes


def test_committed_detector_beats_centred_and_random_boxes(detector, det_data):
    pytest.importorskip("pycocotools")  # COCO mAP
    _, val = det_data
    truth = _ground_truth(val)
    result = tt.evaluate_detection(detector, val.images, truth, detector.anchors, SMALL_ANCHORS)
    center = tt.center_box_baseline(truth)["map"]
    random = tt.random_box_baseline(truth)["map"]
    assert result["map"] > 0.06 and result["map"] > 20 * max(center, random), (
        result, center, random)
    assert result["map_50"] > 0.2, result


# --------------------------------------------------------------------------------------
# Export: TFLite float32 / int8 in LiteRT against Keras, Core ML structure


def _tflite_runner(path):
    return lambda batch: mv.export.run_tflite(path, batch)


def test_segmenter_tflite_float_and_int8(segmenter, seg_data, tmp_path):
    model = segmenter
    train, val = seg_data
    images = val.images[:48]
    keras_logits = model.predict(images, verbose=0)
    keras_miou = tt.evaluate_segmentation(model, images, val.masks[:48], 3)["miou"]

    report = mv.export.to_tflite(model, tmp_path / "seg.tflite")
    assert report.flex_ops == [] and report.num_xnnpack_partitions >= 1
    float_logits = mv.export.run_tflite(report.path, images)
    np.testing.assert_allclose(float_logits, keras_logits, atol=1e-3 * np.abs(keras_logits).max())
    assert (float_logits.argmax(-1) == keras_logits.argmax(-1)).mean() > 0.999

    int8 = mv.export.to_tflite(model, tmp_path / "seg_int8.tflite", quantization="int8",
                               representative_data=train.images[:200])
    assert int8.float_ops == {}
    int8_logits = mv.export.run_tflite(int8.path, images)
    agreement = (int8_logits.argmax(-1) == keras_logits.argmax(-1)).mean()
    int8_miou = tt.evaluate_segmentation(None, images, val.masks[:48], 3,
                                         predict_fn=_tflite_runner(int8.path))["miou"]
    print(json.dumps({  # shown with pytest -s (figures for docs/downstream.md)
        "seg_float": {"ops": report.op_histogram, "max_abs_diff":
                      float(np.abs(float_logits - keras_logits).max()),
                      "outside_xnnpack": report.ops_outside_xnnpack},
        "seg_int8": {"ops": int8.op_histogram, "argmax_agreement": float(agreement),
                     "miou": int8_miou, "keras_miou": keras_miou,
                     "outside_xnnpack": int8.ops_outside_xnnpack,
                     "size": int8.size_bytes, "float_size": report.size_bytes}}))
    assert agreement > 0.95, agreement
    assert int8_miou > keras_miou - 0.05, (int8_miou, keras_miou)


def test_detector_tflite_float_and_int8(detector, det_data, tmp_path):
    pytest.importorskip("pycocotools")  # COCO mAP
    model = detector
    train, val = det_data
    images, truth = val.images[:64], _ground_truth(val)[:64]
    keras_raw = model.predict(images, verbose=0)
    keras_map = tt.evaluate_detection(model, images, truth, model.anchors, SMALL_ANCHORS)["map"]

    report = mv.export.to_tflite(model, tmp_path / "det.tflite")
    assert report.flex_ops == [] and "TFLite_Detection_PostProcess" not in report.op_histogram
    float_raw = mv.export.run_tflite(report.path, images)
    np.testing.assert_allclose(float_raw, keras_raw, atol=1e-3 * np.abs(keras_raw).max())
    float_map = tt.evaluate_detection(None, images, truth, model.anchors, SMALL_ANCHORS,
                                      predict_fn=_tflite_runner(report.path))["map"]
    assert float_map == pytest.approx(keras_map, abs=0.005)

    int8 = mv.export.to_tflite(model, tmp_path / "det_int8.tflite", quantization="int8",
                               representative_data=train.images[:200])
    assert int8.float_ops == {}
    int8_map = tt.evaluate_detection(None, images, truth, model.anchors, SMALL_ANCHORS,
                                     predict_fn=_tflite_runner(int8.path))["map"]
    print(json.dumps({
        "det_float": {"ops": report.op_histogram, "max_abs_diff":
                      float(np.abs(float_raw - keras_raw).max()), "map": float_map,
                      "keras_map": keras_map, "outside_xnnpack": report.ops_outside_xnnpack},
        "det_int8": {"ops": int8.op_histogram, "map": int8_map,
                     "outside_xnnpack": int8.ops_outside_xnnpack,
                     "size": int8.size_bytes, "float_size": report.size_bytes}}))
    assert int8_map > 0.8 * keras_map, (int8_map, keras_map)
    # The decoded top detection of each image mostly agrees with Keras.
    keras_det = postprocess_detections(keras_raw, model.anchors, SMALL_ANCHORS)
    int8_det = postprocess_detections(mv.export.run_tflite(int8.path, images), model.anchors,
                                      SMALL_ANCHORS)
    same = [len(a) and len(b) and a.classes[0] == b.classes[0] for a, b in
            zip(keras_det, int8_det, strict=True)]
    assert np.mean(same) > 0.8


def test_task_models_convert_to_coreml(segmenter, detector, tmp_path):
    pytest.importorskip("coremltools")
    for model in (segmenter, detector):
        report = mv.export.to_coreml(model, tmp_path / f"{model.name}.mlpackage")
        assert os.path.isdir(report.path)
        assert report.op_histogram.get("conv", 0) >= 60
        (output,) = report.outputs
        assert output["shape"][1:] == list(model.output_shape[1:]), output
        assert report.max_tensor_rank <= 5
        json.dumps(report.to_dict())


# --------------------------------------------------------------------------------------
# Command line


def test_eval_task_command_reads_a_saved_detector(detector, det_data, tmp_path, capsys):
    pytest.importorskip("pycocotools")  # COCO mAP
    from keras_mvit2.cli.main import main

    model = detector
    folder = tmp_path / "run"
    folder.mkdir()
    model.save(folder / "model.keras")
    config = {"task": "detection", "classes": [1, 7, 8], "scale_range": [0.4, 0.8],
              "objects_per_image": [1, 2], "anchor_config": SMALL_ANCHORS.to_dict()}
    (folder / "config.json").write_text(json.dumps(config))
    out = tmp_path / "metrics.json"
    code = main(["eval-task", str(folder / "model.keras"), "--val-images", "32",
                 "--seed", "3", "--json", str(out)])
    assert code == 0
    metrics = json.loads(out.read_text())
    # The same images as the fixture's first 32 validation images (same seed and size).
    _, val = det_data
    expected = tt.evaluate_detection(model, val.images[:32], _ground_truth(val)[:32],
                                     model.anchors, SMALL_ANCHORS)
    assert metrics["map"] == pytest.approx(expected["map"], abs=1e-6)
    assert metrics["map"] > metrics["baseline_center_box_map"]
    assert "map" in capsys.readouterr().out


def test_train_command_rejects_a_wrong_task_head(tmp_path, capsys):
    from keras_mvit2.cli.main import main

    code = main(["train", "--task", "detection", "--head", "pspnet", "-o", str(tmp_path)])
    assert code == 2
    assert "--head for detection must be one of ('ssdlite',)" in capsys.readouterr().err
