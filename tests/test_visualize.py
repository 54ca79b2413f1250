"""Context-score maps: the fold, the scores, the PNG and the CLI."""

import numpy as np
import pytest
from PIL import Image

import keras_mvit2 as mv
from keras_mvit2.visualize import (
    context_score_figure,
    context_scores,
    plot_context_scores,
    scores_to_map,
)


def test_fold_puts_a_known_pattern_on_the_right_pixels():
    rows, cols, p = 3, 4, 2
    scores = np.zeros((1, rows * cols, p * p), "float32")
    # Patch (i=1, j=2), pixel-in-patch (ph=1, pw=0) -> image pixel (2*1+1, 2*2+0) = (3, 4)
    scores[0, 1 * cols + 2, 1 * p + 0] = 1.0
    # Patch (i=2, j=3), pixel (0, 1) -> (4, 7)
    scores[0, 2 * cols + 3, 0 * p + 1] = 0.5
    folded = scores_to_map(scores, (rows, cols), p)
    assert folded.shape == (1, rows * p, cols * p)
    expected = np.zeros((rows * p, cols * p), "float32")
    expected[3, 4] = 1.0
    expected[4, 7] = 0.5
    np.testing.assert_array_equal(folded[0], expected)


@pytest.fixture(scope="module")
def model():
    return mv.MobileViTV2(0.5, input_shape=(96, 128, 3), classes=10)


@pytest.fixture(scope="module")
def photo():
    skimage_data = pytest.importorskip("skimage.data")
    return np.asarray(Image.fromarray(skimage_data.chelsea()).resize((128, 96)))


def test_one_map_per_attention_layer_at_each_output_stride(model, photo):
    maps = context_scores(model, photo)
    # B = 2, 4, 3 separable attention layers at output strides 8, 16, 32 (Fig. 8).
    assert [m.output_stride for m in maps] == [8] * 2 + [16] * 4 + [32] * 3
    assert [m.scores.shape for m in maps[::4]] == [(12, 16), (6, 8), (4, 4)]  # 3x4 -> 4x4
    for m in maps:
        # Each pixel-in-patch position carries a softmax over the patches: it sums to 1.
        for ph in range(2):
            for pw in range(2):
                np.testing.assert_allclose(m.scores[ph::2, pw::2].sum(), 1.0, atol=1e-5)
        assert m.normalized.min() == 0.0 and m.normalized.max() == 1.0


def test_png_is_written(model, photo, tmp_path):
    maps = context_scores(model, photo)
    out = plot_context_scores(photo, maps, tmp_path / "maps.png")
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert Image.open(out).size[0] > 400


def test_errors_name_the_problem(model, photo):
    with pytest.raises(ValueError, match=r"input shape \(96, 128, 3\)"):
        context_scores(model, photo[:64])
    mha = mv.MobileViTV2(0.5, input_shape=(64, 64, 3), attention="mha")
    with pytest.raises(ValueError, match="separable self-attention"):
        context_scores(mha, np.zeros((64, 64, 3), "uint8"))


def test_cli(tmp_path, photo):
    from keras_mvit2.cli import main

    Image.fromarray(photo).save(tmp_path / "cat.png")
    out = tmp_path / "out.png"
    assert main(["visualize", "mobilevitv2_050", str(tmp_path / "cat.png"), "-o", str(out),
                 "--input-size", "64"]) == 0
    assert out.exists()
    (tmp_path / "bad.jpg").write_bytes(b"not an image")
    assert main(["visualize", "mobilevitv2_050", str(tmp_path / "bad.jpg"), "-o",
                 str(tmp_path / "x.png"), "--input-size", "64"]) == 2
    assert not (tmp_path / "x.png").exists()


def test_one_patch_maps_are_flagged_flat_and_the_figure_says_so(photo, tmp_path):
    # At 64x64 the OS=32 feature map is 2x2 pixels: one 2x2 patch, every score is 1.
    small = mv.MobileViTV2(0.5, input_shape=(64, 64, 3), classes=10)
    image = np.asarray(Image.fromarray(photo).resize((64, 64)))
    maps = context_scores(small, image)
    flat = [m for m in maps if m.is_flat]
    assert [m.output_stride for m in flat] == [32, 32, 32]
    assert all(m.num_patches == 1 and np.allclose(m.scores, 1.0) for m in flat)
    assert all(not m.is_flat and m.num_patches > 1 for m in maps if m.output_stride < 32)

    figure = context_score_figure(image, maps)
    texts = [t.get_text() for ax in figure.axes for t in ax.texts]
    assert sum("1 patch" in t for t in texts) == 3
    labels = [ax.get_ylabel() for ax in figure.axes]
    assert any("context score" in label for label in labels), labels  # the colour bar
    out = plot_context_scores(image, maps, tmp_path / "maps.png")
    assert Image.open(out).size[0] > 400

