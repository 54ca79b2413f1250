"""Runs exported `.tflite` files in MediaPipe Tasks' Python API, as an app would load them.

Run by tests/test_mediapipe_clients.py with the Python of the MediaPipe virtualenv
(``.venv-mediapipe``, made by ``.ci/run``, or ``MVIT2_MEDIAPIPE_PYTHON``). Usage:
``python mediapipe_client.py REQUEST.json``; the request is
``{"images": "x.npy" (uint8 (N, H, W, 3) RGB), "out": "out.npz", "models": [{"task":
"classifier" | "segmenter" | "detector", "path": "m.tflite", "key": "name"}, ...]}``. Writes,
per model key: classifier ``<key>.index`` / ``.score`` (N,) and ``<key>.names`` (N,) strings;
segmenter ``<key>.mask`` (N, H, W) uint8 and ``<key>.labels``; detector ``<key>.boxes``
(D, 4) xmin, ymin, xmax, ymax in pixels, ``.classes`` (D,) (-1: not given) / ``.scores``,
``.names`` and
``.image`` (D,) the image of each box. Imports only mediapipe and numpy.
"""

import json
import sys

import mediapipe as mp
import numpy as np
from mediapipe.tasks.python import BaseOptions, vision


def _classify(path, images):
    options = vision.ImageClassifierOptions(base_options=BaseOptions(model_asset_path=path),
                                            max_results=1)
    index, score, names = [], [], []
    with vision.ImageClassifier.create_from_options(options) as classifier:
        for image in images:
            result = classifier.classify(mp.Image(image_format=mp.ImageFormat.SRGB, data=image))
            top = result.classifications[0].categories[0]
            index.append(top.index)
            score.append(top.score)
            names.append(top.category_name or "")
    return {"index": np.array(index), "score": np.array(score), "names": np.array(names)}


def _segment(path, images):
    options = vision.ImageSegmenterOptions(base_options=BaseOptions(model_asset_path=path),
                                           output_category_mask=True,
                                           output_confidence_masks=False)
    masks = []
    with vision.ImageSegmenter.create_from_options(options) as segmenter:
        labels = list(segmenter.labels)
        for image in images:
            result = segmenter.segment(mp.Image(image_format=mp.ImageFormat.SRGB, data=image))
            masks.append(np.array(result.category_mask.numpy_view()).reshape(image.shape[:2]))
    return {"mask": np.stack(masks), "labels": np.array(labels)}


def _detect(path, images):
    options = vision.ObjectDetectorOptions(base_options=BaseOptions(model_asset_path=path),
                                           max_results=-1, score_threshold=0.0)
    boxes, classes, scores, names, which = [], [], [], [], []
    with vision.ObjectDetector.create_from_options(options) as detector:
        for i, image in enumerate(images):
            result = detector.detect(mp.Image(image_format=mp.ImageFormat.SRGB, data=image))
            for d in result.detections:
                b = d.bounding_box
                boxes.append([b.origin_x, b.origin_y, b.origin_x + b.width,
                              b.origin_y + b.height])
                index = d.categories[0].index  # None when the labels give the name
                classes.append(-1 if index is None else index)
                scores.append(d.categories[0].score)
                names.append(d.categories[0].category_name or "")
                which.append(i)
    return {"boxes": np.array(boxes, dtype=np.float64).reshape(-1, 4),
            "classes": np.array(classes, dtype=np.int64), "scores": np.array(scores),
            "names": np.array(names), "image": np.array(which, dtype=np.int64)}


def main(request_path):
    with open(request_path) as f:
        request = json.load(f)
    images = np.load(request["images"])
    run = {"classifier": _classify, "segmenter": _segment, "detector": _detect}
    out = {}
    for model in request["models"]:
        for name, value in run[model["task"]](model["path"], images).items():
            out[f"{model['key']}.{name}"] = value
    np.savez(request["out"], **out)
    print(json.dumps({"mediapipe": mp.__version__, "models": len(request["models"])}))


if __name__ == "__main__":
    main(sys.argv[1])
