"""Exact geometry of the task code: anchors, box coding, matching, NMS, hard negative
mining, the SSD and segmentation losses, mIoU, COCO mAP, pooling/resizing layers and
the augmentations (masks and boxes follow the pixels). Oracles are hand-computed
values or numpy code written here."""

import math

import numpy as np
import pytest
import tensorflow as tf

from keras_mvit2.tasks import data as td
from keras_mvit2.tasks.detection import (
    AnchorConfig,
    Detections,
    SSDLoss,
    center_to_corner,
    coco_map,
    corner_to_center,
    decode_boxes,
    encode_boxes,
    hard_negative_mask,
    iou_matrix,
    match_anchors,
    nms,
    postprocess_detections,
    ssd_anchors,
)
from keras_mvit2.tasks.segmentation import (
    AdaptiveAveragePooling2D,
    BilinearResize,
    SegmentationCrossEntropy,
    SegmentationMeanIoU,
    confusion_matrix,
    iou_from_confusion,
    mean_iou,
)

# --------------------------------------------------------------------------------------
# Anchors


def test_anchors_match_a_hand_computed_list():
    config = AnchorConfig(output_strides=(16, -1), aspect_ratios=((2,), (2, 2)),
                          min_scale=0.2, max_scale=0.8)
    anchors = ssd_anchors([(1, 2), (1, 1)], config)
    # scales = linspace(0.2, 0.8, 3) = [0.2, 0.5, 0.8]
    # level 0: small 0.2, big sqrt(0.2 * 0.5) = 0.31622777, ratio 2 -> 0.2*sqrt2 = 0.28284271
    #          and 0.2/sqrt2 = 0.14142136; centers x in {0.25, 0.75}, y = 0.5.
    # level 1 (duplicate ratio counted once): small 0.5, big sqrt(0.5 * 0.8) = 0.63245553,
    #          ratio 2 -> 0.70710678 / 0.35355339; center (0.5, 0.5).
    expected = [
        [0.25, 0.5, 0.2, 0.2], [0.25, 0.5, 0.31622777, 0.31622777],
        [0.25, 0.5, 0.28284271, 0.14142136], [0.25, 0.5, 0.14142136, 0.28284271],
        [0.75, 0.5, 0.2, 0.2], [0.75, 0.5, 0.31622777, 0.31622777],
        [0.75, 0.5, 0.28284271, 0.14142136], [0.75, 0.5, 0.14142136, 0.28284271],
        [0.5, 0.5, 0.5, 0.5], [0.5, 0.5, 0.63245553, 0.63245553],
        [0.5, 0.5, 0.70710678, 0.35355339], [0.5, 0.5, 0.35355339, 0.70710678],
    ]
    np.testing.assert_allclose(anchors, expected, rtol=0, atol=1e-6)
    assert anchors.dtype == np.float32
    assert config.num_anchors_per_location() == [4, 4]


def test_anchor_rows_are_row_major_and_clipped():
    config = AnchorConfig(output_strides=(16, -1), aspect_ratios=((3,), (3,)),
                          min_scale=0.6, max_scale=0.9)
    anchors = ssd_anchors([(2, 3), (1, 1)], config)
    assert anchors.shape == (2 * 3 * 4 + 4, 4)
    centers = anchors[:24:4, :2]
    np.testing.assert_allclose(centers, [[1 / 6, 0.25], [0.5, 0.25], [5 / 6, 0.25],
                                         [1 / 6, 0.75], [0.5, 0.75], [5 / 6, 0.75]], atol=1e-6)
    # 0.6 * sqrt(3) = 1.039 > 1 -> clipped to 1 (ml-cvnets clips anchors to [0, 1]).
    assert anchors[2, 2] == 1.0 and anchors[3, 3] == 1.0
    unclipped = ssd_anchors([(2, 3), (1, 1)], AnchorConfig(
        output_strides=(16, -1), aspect_ratios=((3,), (3,)), min_scale=0.6, max_scale=0.9,
        clip=False))
    assert unclipped[2, 2] == pytest.approx(0.6 * math.sqrt(3), rel=1e-6)


def test_paper_anchor_count_at_320():
    # COCO config at 320x320: maps 20, 10, 5, 3, 2, 1; 6 anchors (4 for the global map).
    anchors = ssd_anchors([(20, 20), (10, 10), (5, 5), (3, 3), (2, 2), (1, 1)])
    assert anchors.shape == (6 * (400 + 100 + 25 + 9 + 4) + 4, 4) == (3232, 4)


def test_anchor_config_rejects_bad_input():
    with pytest.raises(ValueError, match="one aspect-ratio list per output stride"):
        AnchorConfig(output_strides=(16, 32), aspect_ratios=((2,),))
    with pytest.raises(ValueError, match="only be the last"):
        AnchorConfig(output_strides=(-1, 16), aspect_ratios=((2,), (2,)))
    with pytest.raises(ValueError, match="one feature size per output stride"):
        ssd_anchors([(2, 2)])


# --------------------------------------------------------------------------------------
# Box coding, IoU, matching


def test_encode_is_the_ssd_formula_and_decode_inverts_it():
    anchor = np.array([[0.5, 0.5, 0.2, 0.4]], np.float64)
    box = np.array([[0.52, 0.46, 0.3, 0.2]], np.float64)
    # (0.02 / (0.2 * 0.1), -0.04 / (0.4 * 0.1), log(1.5) / 0.2, log(0.5) / 0.2)
    np.testing.assert_allclose(encode_boxes(box, anchor),
                               [[1.0, -1.0, 2.0273255, -3.4657359]], atol=1e-6)
    rng = np.random.default_rng(0)
    anchors = np.concatenate([rng.uniform(0.1, 0.9, (500, 2)), rng.uniform(0.05, 1, (500, 2))], 1)
    boxes = np.concatenate([rng.uniform(0, 1, (500, 2)), rng.uniform(0.01, 1, (500, 2))], 1)
    np.testing.assert_allclose(decode_boxes(encode_boxes(boxes, anchors), anchors), boxes,
                               rtol=1e-9, atol=1e-12)
    # The same in TF (float32).
    tf_round_trip = decode_boxes(encode_boxes(tf.constant(boxes, tf.float32),
                                              tf.constant(anchors, tf.float32)),
                                 tf.constant(anchors, tf.float32))
    np.testing.assert_allclose(np.asarray(tf_round_trip), boxes, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(corner_to_center(center_to_corner(boxes)), boxes, atol=1e-12)


def test_iou_hand_values():
    a = np.array([[0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 1.0, 1.0]])
    b = np.array([[1.0, 1.0, 3.0, 3.0], [5.0, 5.0, 6.0, 6.0], [0.0, 0.0, 2.0, 2.0]])
    np.testing.assert_allclose(iou_matrix(a, b), [[1 / 7, 0.0, 1.0], [0.0, 0.0, 0.25]])
    np.testing.assert_allclose(np.asarray(iou_matrix(tf.constant(a), tf.constant(b))),
                               [[1 / 7, 0.0, 1.0], [0.0, 0.0, 0.25]], atol=1e-7)


def test_match_anchors_threshold_and_forced_match():
    config = AnchorConfig(iou_threshold=0.5)
    anchors = np.array([[0.25, 0.25, 0.5, 0.5],     # corner [0, 0, .5, .5]
                        [0.75, 0.75, 0.5, 0.5],     # corner [.5, .5, 1, 1]
                        [0.5, 0.5, 0.2, 0.2],       # corner [.4, .4, .6, .6]
                        [0.9, 0.1, 0.1, 0.1]], np.float32)
    gt = np.array([[0.0, 0.0, 0.5, 0.4],            # IoU 0.8 with anchor 0
                   [0.45, 0.45, 0.7, 0.7]], np.float32)  # best: anchor 2 (IoU 0.0625/...)
    locations, labels = match_anchors(gt, np.array([2, 3]), anchors, config)
    locations, labels = np.asarray(locations), np.asarray(labels)
    ious = iou_matrix(gt.astype(np.float64), center_to_corner(anchors.astype(np.float64)))
    assert ious[0, 0] == pytest.approx(0.8)
    assert ious[1].max() < 0.5 and int(np.argmax(ious[1])) == 2  # only a forced match
    np.testing.assert_array_equal(labels, [2, 0, 3, 0])
    expected = encode_boxes(corner_to_center(gt), anchors[[0, 2]])
    np.testing.assert_allclose(locations[[0, 2]], expected, atol=1e-5)
    np.testing.assert_array_equal(locations[[1, 3]], 0.0)
    # No objects: all background.
    locations, labels = match_anchors(np.zeros((0, 4), np.float32), np.zeros((0,), np.int32),
                                      anchors, config)
    assert np.asarray(labels).tolist() == [0, 0, 0, 0]
    assert not np.asarray(locations).any()


# --------------------------------------------------------------------------------------
# NMS


def _nms_oracle(boxes, scores, threshold):
    """Plain greedy NMS: repeatedly take the best remaining box, drop its overlaps."""
    remaining = list(range(len(scores)))
    keep = []
    while remaining:
        best = max(remaining, key=lambda i: (scores[i], -i))
        keep.append(best)
        remaining.remove(best)
        bx = boxes[best]
        survivors = []
        for i in remaining:
            ix = max(0.0, min(bx[2], boxes[i][2]) - max(bx[0], boxes[i][0]))
            iy = max(0.0, min(bx[3], boxes[i][3]) - max(bx[1], boxes[i][1]))
            inter = ix * iy
            union = ((bx[2] - bx[0]) * (bx[3] - bx[1])
                     + (boxes[i][2] - boxes[i][0]) * (boxes[i][3] - boxes[i][1]) - inter)
            if inter / union <= threshold:
                survivors.append(i)
        remaining = survivors
    return keep


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.7])
def test_nms_matches_a_numpy_oracle(threshold):
    rng = np.random.default_rng(int(threshold * 10))
    for _ in range(20):
        n = int(rng.integers(1, 40))
        xy = rng.uniform(0, 0.7, (n, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(0.05, 0.3, (n, 2))], 1)
        scores = rng.choice(np.linspace(0.1, 1.0, 7), n)   # ties on purpose
        assert nms(boxes, scores, threshold).tolist() == _nms_oracle(boxes, scores, threshold)


def test_nms_hand_case():
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [0, 0, 10, 9.0]])
    scores = np.array([0.9, 0.8, 0.7, 0.95])
    # Box 3 (0.95) first; box 0 has IoU 0.9 with it -> dropped; box 1 has IoU
    # 72/(90+100-72) = 0.61 with box 3 -> dropped at 0.5; box 2 is disjoint.
    assert nms(boxes, scores, 0.5).tolist() == [3, 2]
    assert nms(boxes, scores, 0.95).tolist() == [3, 0, 1, 2]
    assert nms(np.zeros((0, 4)), np.zeros((0,)), 0.5).tolist() == []


def test_postprocess_decodes_and_suppresses_per_class():
    anchors = np.array([[0.3, 0.3, 0.2, 0.2], [0.32, 0.3, 0.2, 0.2], [0.7, 0.7, 0.2, 0.2]],
                       np.float32)
    logits = np.full((1, 3, 3), -10.0, np.float32)
    logits[0, 0, 1] = 5.0    # anchor 0: class 1, strong
    logits[0, 1, 1] = 4.0    # anchor 1: class 1, overlaps anchor 0 -> suppressed
    logits[0, 2, 2] = 3.0    # anchor 2: class 2
    predictions = np.concatenate([np.zeros((1, 3, 4), np.float32), logits], axis=-1)
    (det,) = postprocess_detections(predictions, anchors, score_threshold=0.3)
    assert det.classes.tolist() == [1, 2]
    np.testing.assert_allclose(det.boxes, [[0.2, 0.2, 0.4, 0.4], [0.6, 0.6, 0.8, 0.8]],
                               atol=1e-6)
    assert det.scores[0] == pytest.approx(math.exp(5) / (math.exp(5) + 2 * math.exp(-10)))


# --------------------------------------------------------------------------------------
# Losses


def test_hard_negative_mining_counts_and_choice():
    background_loss = np.array([
        [0.1, 0.9, 0.3, 0.8, 0.2, 0.7, 0.05, 0.6, 0.4, 0.5],
        [0.1, 0.9, 0.3, 0.8, 0.2, 0.7, 0.05, 0.6, 0.4, 0.5],
        [0.1, 0.9, 0.3, 0.8, 0.2, 0.7, 0.05, 0.6, 0.4, 0.5],
    ], np.float32)
    labels = np.array([
        [0, 2, 0, 0, 0, 0, 0, 0, 0, 0],     # 1 positive -> 3 negatives
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 3],     # 2 positives -> 6 negatives
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0],     # no positive -> nothing
    ])
    mask = np.asarray(hard_negative_mask(background_loss, labels, 3))
    assert mask.sum(axis=1).tolist() == [4, 8, 0]
    # Row 0: the positive (1) + the 3 largest negative losses: 0.8 (3), 0.7 (5), 0.6 (7).
    assert np.nonzero(mask[0])[0].tolist() == [1, 3, 5, 7]
    # Row 1: positives 0, 9; negatives by loss 0.9 (1), 0.8, 0.7, 0.6, 0.4 (8), 0.3 (2).
    assert np.nonzero(mask[1])[0].tolist() == [0, 1, 2, 3, 5, 7, 8, 9]
    # Ratio larger than the negatives available: every anchor is used.
    dense = np.array([[1, 1, 1, 0, 0, 0, 0, 0, 0, 0]])
    assert np.asarray(hard_negative_mask(background_loss[:1], dense, 3)).sum() == 10


def test_ssd_loss_hand_computed():
    # 1 image, 3 anchors, 3 classes; anchor 0 positive (class 2), 1 and 2 negatives.
    y_true = np.array([[[0.5, -0.5, 2.0, 0.0, 2.0],
                        [0.0, 0.0, 0.0, 0.0, 0.0],
                        [0.0, 0.0, 0.0, 0.0, 0.0]]], np.float32)
    logits = np.array([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0], [3.0, 0.0, 0.0]], np.float32)
    locs = np.array([[0.0, 0.0, 0.0, 0.5], [9.0, 9.0, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]],
                    np.float32)
    y_pred = np.concatenate([locs, logits], axis=-1)[None]
    # smooth L1 of (0.5, 0.5, 2.0, 0.5): 0.125 + 0.125 + 1.5 + 0.125 = 1.875.
    box = 1.875
    lse = [math.log(math.exp(0) + math.exp(0) + math.exp(1)),
           math.log(1 + math.exp(2) + 1), math.log(math.exp(3) + 2)]
    # Positive CE: lse0 - 1. Negative background losses: lse1 - 0 (1.55) and lse2 - 3
    # (0.10); 1 positive x ratio 3 -> both negatives are used.
    cls = (lse[0] - 1.0) + lse[1] + (lse[2] - 3.0)
    total, box_loss, class_loss = (float(v) for v in SSDLoss(3).components(y_true, y_pred))
    assert box_loss == pytest.approx(box, rel=1e-6)
    assert class_loss == pytest.approx(cls, rel=1e-6)
    assert total == pytest.approx(box + cls, rel=1e-6)
    # Ratio 1: only the hardest negative (anchor 1) is used.
    _, _, class_loss = SSDLoss(1).components(y_true, y_pred)
    assert float(class_loss) == pytest.approx((lse[0] - 1.0) + lse[1], rel=1e-6)
    assert float(SSDLoss(3)(y_true, y_pred)) == pytest.approx(box + cls, rel=1e-6)


def test_segmentation_cross_entropy_skips_ignored_pixels():
    logits = np.array([[[[2.0, 0.0], [0.0, 1.0]], [[5.0, -5.0], [0.3, 0.3]]]], np.float32)
    labels = np.array([[[0, 1], [255, 255]]])
    expected = np.mean([math.log(1 + math.exp(-2)), math.log(1 + math.exp(-1))])
    loss = SegmentationCrossEntropy(ignore_index=255)
    assert float(loss(labels, logits)) == pytest.approx(expected, rel=1e-6)
    # Ignoring everything gives 0, not NaN.
    assert float(loss(np.full((1, 2, 2), 255), logits)) == 0.0
    # Low-resolution logits are resized to the labels (a constant map stays constant).
    low = np.tile(np.array([1.0, 0.0], np.float32), (1, 1, 1, 1))
    full = np.zeros((1, 4, 4), np.int64)
    assert float(loss(full, low)) == pytest.approx(math.log(1 + math.exp(-1)), rel=1e-6)


# --------------------------------------------------------------------------------------
# mIoU and COCO mAP


def test_miou_against_a_hand_computed_confusion_matrix():
    y_true = np.array([[0, 0, 1], [1, 2, 255]])
    y_pred = np.array([[0, 1, 1], [2, 2, 0]])
    # rows = true class, columns = predicted (the 255 pixel is skipped):
    expected = np.array([[1, 1, 0],
                         [0, 1, 1],
                         [0, 0, 1]])
    matrix = confusion_matrix(y_true, y_pred, 3, ignore_index=255)
    np.testing.assert_array_equal(matrix, expected)
    # IoU: class 0 = 1 / (2 + 1 - 1) = 0.5; class 1 = 1 / (2 + 2 - 1); class 2 = 1 / (1 + 2 - 1)
    np.testing.assert_allclose(iou_from_confusion(matrix), [0.5, 1 / 3, 0.5])
    assert mean_iou(matrix) == pytest.approx((0.5 + 1 / 3 + 0.5) / 3)
    # The Keras metric accumulates the same matrix over batches.
    metric = SegmentationMeanIoU(num_classes=4, ignore_index=255)
    logits = np.eye(4, dtype=np.float32)[y_pred][None]
    metric.update_state(y_true[None, :1], logits[:, :1])
    metric.update_state(y_true[None, 1:], logits[:, 1:])
    np.testing.assert_array_equal(metric.confusion()[:3, :3], expected)
    # Class 3 never occurs: it is left out of the mean, as in mean_iou.
    assert float(metric.result()) == pytest.approx((0.5 + 1 / 3 + 0.5) / 3, rel=1e-6)
    with pytest.raises(ValueError, match=r"Labels must be in \[0, 3\)"):
        confusion_matrix(np.array([0, 7]), np.array([0, 1]), 3)


def test_coco_map_hand_cases():
    pytest.importorskip("pycocotools")
    gt = [(np.array([[0.1, 0.1, 0.5, 0.5]]), np.array([1])),
          (np.array([[0.2, 0.2, 0.6, 0.6], [0.5, 0.5, 0.9, 0.9]]), np.array([1, 2]))]
    perfect = [Detections(b.astype(np.float32), lab, np.ones(len(lab), np.float32))
               for b, lab in gt]
    assert coco_map(gt, perfect, (100, 100))["map"] == pytest.approx(1.0)
    # One image, one object; a detection of IoU 0.62: a true positive at the thresholds
    # 0.50, 0.55, 0.60 only -> AP 3/10.
    one = [(np.array([[0.0, 0.0, 0.5, 0.5]]), np.array([1]))]
    side = math.sqrt(0.62) * 0.5
    det = [Detections(np.array([[0.0, 0.0, side, side]], np.float32), np.array([1]),
                      np.array([0.9], np.float32))]
    assert coco_map(one, det, (100, 100))["map"] == pytest.approx(0.3, abs=1e-6)
    # A higher-scoring false positive first: precision 1/2 at recall 1 -> AP 0.5.
    det = [Detections(np.array([[0.6, 0.6, 0.9, 0.9], [0.0, 0.0, 0.5, 0.5]], np.float32),
                      np.array([1, 1]), np.array([0.9, 0.8], np.float32))]
    assert coco_map(one, det, (100, 100))["map"] == pytest.approx(0.5, abs=1e-6)
    # The right box with the wrong class scores nothing; no detections at all is 0.
    det = [Detections(np.array([[0.0, 0.0, 0.5, 0.5]], np.float32), np.array([2]),
                      np.array([0.9], np.float32))]
    assert coco_map(one, det, (100, 100), category_ids=[1])["map"] == pytest.approx(0.0)
    assert coco_map(one, [Detections()], (100, 100))["map"] == 0.0


# --------------------------------------------------------------------------------------
# Layers


def test_adaptive_average_pooling_is_pytorch_binning():
    x = np.arange(2 * 7 * 5 * 3, dtype=np.float32).reshape(2, 7, 5, 3)
    out = np.asarray(AdaptiveAveragePooling2D((3, 2))(x))
    expected = np.zeros((2, 3, 2, 3), np.float32)
    for i in range(3):
        h0, h1 = (i * 7) // 3, -(-((i + 1) * 7) // 3)
        for j in range(2):
            w0, w1 = (j * 5) // 2, -(-((j + 1) * 5) // 2)
            expected[:, i, j] = x[:, h0:h1, w0:w1].mean(axis=(1, 2))
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    # Divisible sizes take the average-pooling path; the result is the same binning.
    y = np.asarray(AdaptiveAveragePooling2D(2)(x[:, :6, :4]))
    np.testing.assert_allclose(y[:, 1, 0], x[:, 3:6, 0:2].mean(axis=(1, 2)), rtol=1e-6)


def test_bilinear_resize_align_corners():
    x = np.random.default_rng(0).normal(size=(1, 3, 4, 2)).astype(np.float32)
    out = np.asarray(BilinearResize((5, 7), align_corners=True)(x))
    # align_corners: output pixel i samples input i * (in - 1) / (out - 1).
    expected = np.zeros((1, 5, 7, 2), np.float32)
    for i in range(5):
        for j in range(7):
            y, xx = i * 2 / 4, j * 3 / 6
            y0, x0 = int(np.floor(y)), int(np.floor(xx))
            y1, x1 = min(y0 + 1, 2), min(x0 + 1, 3)
            dy, dx = y - y0, xx - x0
            expected[0, i, j] = ((1 - dy) * (1 - dx) * x[0, y0, x0] + (1 - dy) * dx * x[0, y0, x1]
                                 + dy * (1 - dx) * x[0, y1, x0] + dy * dx * x[0, y1, x1])
    np.testing.assert_allclose(out, expected, atol=1e-5)
    np.testing.assert_array_equal(out[0, 0, 0], x[0, 0, 0])
    np.testing.assert_array_equal(out[0, -1, -1], x[0, -1, -1])


# --------------------------------------------------------------------------------------
# Augmentations: masks and boxes follow the pixels


def _instances(size=64):
    """Two rectangles (instance ids 1, 2), their boxes, and an image coloured by id."""
    mask = np.zeros((size, size), np.int32)
    rects = [(8, 10, 30, 40), (36, 20, 60, 52)]   # x1, y1, x2, y2 (pixels, exclusive)
    for k, (x1, y1, x2, y2) in enumerate(rects, start=1):
        mask[y1:y2, x1:x2] = k
    image = np.zeros((size, size, 3), np.float32)
    image[..., 0] = mask == 1
    image[..., 1] = mask == 2
    boxes = np.array(rects, np.float32) / size
    return image, mask, boxes, np.array([1, 2], np.int32)


def _mask_box(mask, k):
    rows, cols = np.nonzero(mask == k)
    h, w = mask.shape
    return np.array([cols.min() / w, rows.min() / h, (cols.max() + 1) / w, (rows.max() + 1) / h])


def test_detection_augmentation_moves_boxes_with_the_pixels():
    image, mask, boxes, labels = _instances()
    config = td.DetectionAugment(crop_probability=1.0, photometric=False)
    flipped = 0
    for seed in range(12):
        out_image, out_boxes, out_labels, out_mask = (
            np.asarray(t) for t in td.augment_detection_example(
                image, boxes, labels, tf.constant([seed, 7]), (48, 48), config,
                mask=tf.constant(mask)))
        assert out_image.shape == (48, 48, 3)
        for box, label in zip(out_boxes, out_labels, strict=True):
            # Same geometry: the box is the extent of the instance's transformed pixels
            # (within one output pixel of nearest-neighbour resizing).
            np.testing.assert_allclose(box, _mask_box(out_mask, label), atol=1.5 / 48)
            # And the image moved too: the instance's colour channel is lit there.
            channel = out_image[..., label - 1]
            assert channel[out_mask == label].mean() > 0.8
        center_x = (out_boxes[:, 0] + out_boxes[:, 2]) / 2
        if len(out_labels) and out_labels[0] == 1 and center_x[0] > 0.5:
            flipped += 1  # instance 1 starts on the left
    assert flipped > 0


def test_segmentation_augmentation_keeps_mask_and_image_aligned():
    image, mask, _, _ = _instances()
    config = td.SegmentationAugment(photometric=False, blur_probability=0.0)
    for seed in range(6):
        out_image, out_mask = (np.asarray(t) for t in td.augment_segmentation_example(
            image, mask, tf.constant([seed, 3]), (48, 48), config, ignore_index=255))
        assert out_image.shape == (48, 48, 3) and out_mask.shape == (48, 48)
        assert set(np.unique(out_mask)) <= {0, 1, 2, 255}
        for k in (1, 2):
            inside = out_mask == k
            if inside.sum() > 20:
                # Bilinear vs nearest differ only on the borders of the regions.
                assert (out_image[..., k - 1][inside] > 0.5).mean() > 0.9
        background = out_mask == 0
        assert (out_image[..., :2].max(axis=-1)[background] < 0.5).mean() > 0.9
    # Same seed, same result (stateless).
    a = td.augment_segmentation_example(image, mask, tf.constant([1, 2]), (48, 48), config)
    b = td.augment_segmentation_example(image, mask, tf.constant([1, 2]), (48, 48), config)
    np.testing.assert_array_equal(np.asarray(a[1]), np.asarray(b[1]))
