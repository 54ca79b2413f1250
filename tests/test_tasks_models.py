"""Task models: sizes against the paper's Table 3 / Table 4, MACs, the multi-scale
backbone with dilation, weights shared with the classifier, any attention, `.keras`
round trips and input validation."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from model_utils import perturb_norms

import keras_mvit2 as mv
from keras_mvit2.models.mobilevitv2.mobilevitv2_features import _dilate_depthwise
from keras_mvit2.models.mobilevitv2.mobilevitv2_port import model_port_targets
from keras_mvit2.profiling import count_params
from keras_mvit2.tasks import (
    DeepLabV3,
    PSPNet,
    SSDLite,
    anchors_for_model,
    feature_strides,
    mobilevitv2_features,
)
from keras_mvit2.tasks.paper_tables import PAPER_ROWS, build_paper_model
from keras_mvit2.tasks.segmentation import AtrousConv2D
from keras_mvit2.weights.port import TRANSFORMS

# --------------------------------------------------------------------------------------
# Sizes and MACs against the paper


@pytest.mark.parametrize("head,width,paper_params,paper_gmacs", PAPER_ROWS)
def test_parameters_match_the_paper(head, width, paper_params, paper_gmacs):
    # Parameters do not depend on the input size: build small.
    model = build_paper_model(head, width, input_size=64)
    params = sum(count_params(model))
    # The paper prints millions with one decimal, i.e. +-0.05 M: our count must round to
    # the printed value (relative slack 2.5 % at 2.0 M, 0.2 % at 22.5 M).
    assert round(params / 1e6, 1) == paper_params, params
    assert abs(params / (paper_params * 1e6) - 1) <= 0.025
    keras.backend.clear_session()


@pytest.mark.parametrize("head,width,size", [("ssdlite", 0.5, 320), ("deeplabv3", 0.75, 512)])
def test_macs_match_the_paper(head, width, size):
    paper = {(h, w): g for h, w, _, g in PAPER_ROWS}[(head, width)]
    model = build_paper_model(head, width, input_size=size)
    ours = mv.profile(model).gmacs
    # Measured: SSDLite-0.5 0.891 G (paper 0.9), DeepLabv3-0.75 39.67 G (paper 40.0).
    # 2.5 %: the paper's one-decimal rounding at 0.9 G is +-5.6 %, and the measured gaps
    # of the other rows (docs/downstream.md) are within 2 %.
    assert abs(ours / paper - 1) <= 0.025, ours
    keras.backend.clear_session()


@pytest.mark.parametrize("depthwise", [False, True])
def test_dilated_convolutions_are_counted_over_their_output(depthwise):
    # TF pads a dilated conv's input to a multiple of the rate (SpaceToBatchND); the
    # count is the layer's own output size x kernel, as the paper counts it.
    inputs = keras.Input((60, 60, 4))
    if depthwise:
        conv = keras.layers.DepthwiseConv2D(3, dilation_rate=12, padding="same")
        expected = 60 * 60 * 9 * 4
    else:
        conv = keras.layers.Conv2D(8, 3, dilation_rate=12, padding="same")
        expected = 60 * 60 * 9 * 4 * 8
    assert mv.profiling.count_macs(keras.Model(inputs, conv(inputs))) == expected


# --------------------------------------------------------------------------------------
# Multi-scale features and dilation


@pytest.fixture(scope="module")
def classifier_file(tmp_path_factory):
    model = mv.MobileViTV2(0.5, input_shape=(64, 64, 3), classes=7)
    perturb_norms(model, seed=3)
    path = str(tmp_path_factory.mktemp("cls") / "cls.weights.h5")
    model.save_weights(path)
    return model, path


def test_output_stride_32_features_are_the_classifiers(classifier_file):
    classifier, path = classifier_file
    features = mobilevitv2_features(0.5, input_shape=(64, 64, 3), weights=path)
    x = np.random.default_rng(0).random((2, 64, 64, 3), dtype=np.float32)
    out = features(x)
    for level in ("stage1", "stage2", "stage3", "stage4"):
        ref = keras.Model(classifier.input,
                          classifier.get_layer(f"stage{level[-1]}_block1").output)(x)
        np.testing.assert_array_equal(np.asarray(out[level]), np.asarray(ref))


@pytest.mark.parametrize("output_stride", [8, 16, 32])
def test_output_stride_shapes_and_dilations(output_stride):
    features = mobilevitv2_features(0.5, input_shape=(64, 128, 3), output_stride=output_stride)
    strides = feature_strides(output_stride)
    for level, tensor in features.output.items():
        assert tuple(tensor.shape[1:3]) == (64 // strides[level], 128 // strides[level])
    dilation = {name: layer for name, layer in
                ((n, features.get_layer(n)) for n in
                 ("stage3_block0", "stage3_block1", "stage4_block0", "stage4_block1"))}
    # ml-cvnets: the dilated stage's inverted residual keeps the previous dilation and
    # stride 1; its MobileViTv2 block's depthwise conv gets the doubled dilation.
    expected = {32: (1, 1, 1, 1), 16: (1, 1, 1, 2), 8: (1, 2, 2, 4)}[output_stride]
    got = (dilation["stage3_block0"].depthwise_conv.dilation_rate[0],
           dilation["stage3_block1"].local_conv.dilation_rate[0],
           dilation["stage4_block0"].depthwise_conv.dilation_rate[0],
           dilation["stage4_block1"].local_conv.dilation_rate[0])
    assert got == expected
    assert dilation["stage4_block0"].strides == (2 if output_stride == 32 else 1)
    assert dilation["stage3_block0"].strides == (1 if output_stride == 8 else 2)
    # The same variables at every output stride (checkpoints are shared).
    base = mobilevitv2_features(0.5, input_shape=(64, 128, 3))
    assert [tuple(w.shape) for w in features.weights] == [tuple(w.shape) for w in base.weights]


def test_dilation_is_applied_at_call_time():
    layer = keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False,
                                         depthwise_initializer="ones")
    layer.build((1, 9, 9, 1))
    _dilate_depthwise(layer, 3)
    impulse = np.zeros((1, 9, 9, 1), np.float32)
    impulse[0, 4, 4, 0] = 1.0
    response = np.asarray(layer(impulse))[0, ..., 0]
    # A 3x3 kernel of ones dilated by 3 spreads the impulse to offsets {-3, 0, 3}.
    assert sorted(zip(*np.nonzero(response), strict=True)) == [
        (r, c) for r in (1, 4, 7) for c in (1, 4, 7)]
    strided = keras.layers.DepthwiseConv2D(3, strides=2, padding="valid")
    strided.build((1, 9, 9, 1))
    with pytest.raises(ValueError, match="Only stride-1 'same'"):
        _dilate_depthwise(strided, 2)


def _timm_state_dict(model: keras.Model) -> dict:
    """The classifier's variables as a timm-named PyTorch-layout state dict."""
    targets, _ = model_port_targets(model)
    state = {}
    for key, target in targets.items():
        array = target.variable.numpy()
        perm = TRANSFORMS[target.transform]
        state[key] = array if perm is None else np.transpose(array, np.argsort(perm))
    return state


def test_task_models_load_classifier_checkpoints(classifier_file):
    classifier, path = classifier_file
    reference = {w.path: w.numpy() for w in classifier.weights}
    state = _timm_state_dict(classifier)
    built = [
        DeepLabV3(0.5, input_shape=(64, 64, 3), classes=5, output_stride=8,
                  aspp_channels=32, backbone_weights=path),
        PSPNet(0.5, input_shape=(64, 64, 3), classes=5, psp_channels=32,
               backbone_weights=state),
        SSDLite(0.5, input_shape=(64, 64, 3), classes=5, backbone_weights=path),
    ]
    for model in built:
        checked = 0
        for w in model.weights:
            if w.path in reference:
                np.testing.assert_array_equal(w.numpy(), reference[w.path], err_msg=w.path)
                checked += 1
        assert checked == len(classifier.weights) - 2  # all but the Dense head


def test_task_models_pass_their_backbone_on(classifier_file, tmp_path):
    # A task model passes its backbone on (a trained segmenter starts a detector), and
    # only the backbone: the detector's own head keeps its initialization.
    classifier, path = classifier_file
    seg = DeepLabV3(0.5, input_shape=(64, 64, 3), classes=5, output_stride=8,
                    aspp_channels=32, backbone_weights=path)
    perturb_norms(seg, seed=4)
    keras.utils.set_random_seed(7)
    det = SSDLite(0.5, input_shape=(64, 64, 3), classes=5, backbone_weights=seg,
                  name="from_segmenter")
    keras.utils.set_random_seed(7)
    fresh = SSDLite(0.5, input_shape=(64, 64, 3), classes=5, name="fresh")
    seg_weights = {w.path: w.numpy() for w in seg.weights}
    copied = 0
    for w, w_fresh in zip(det.weights, fresh.weights, strict=True):
        if w.path.startswith(("stem_", "stage")):
            np.testing.assert_array_equal(w.numpy(), seg_weights[w.path], err_msg=w.path)
            copied += 1
        else:
            np.testing.assert_array_equal(w.numpy(), w_fresh.numpy(), err_msg=w.path)
    assert copied == len(classifier.weights) - 2
    # ... or its saved .keras file (mvit2 train --task ... --backbone-weights run/model.keras).
    det.save(tmp_path / "det.keras")
    psp = PSPNet(0.5, input_shape=(64, 64, 3), classes=5, psp_channels=32,
                 backbone_weights=tmp_path / "det.keras", name="from_file")
    for w in psp.weights:
        if w.path.startswith(("stem_", "stage")):
            np.testing.assert_array_equal(w.numpy(), seg_weights[w.path], err_msg=w.path)


def test_task_models_refuse_a_backbone_that_does_not_fit(classifier_file, tmp_path):
    classifier, path = classifier_file
    (tmp_path / "broken.keras").write_bytes(b"not a zip archive")
    with pytest.raises(ValueError, match="Cannot load the Keras model"):
        PSPNet(0.5, input_shape=(64, 64, 3), classes=5, psp_channels=32,
               backbone_weights=tmp_path / "broken.keras", name="from_broken")
    # A checkpoint or model of another width is refused with a clear message.
    with pytest.raises(ValueError, match="shape"):
        DeepLabV3(0.75, input_shape=(64, 64, 3), classes=5, aspp_channels=32,
                  backbone_weights=path, name="other_width")
    with pytest.raises(ValueError, match=rf"shape .* in model '{classifier.name}'"):
        PSPNet(0.75, input_shape=(64, 64, 3), classes=5, psp_channels=32,
               backbone_weights=classifier, name="other_width_from_model")
    with pytest.raises(ValueError, match="has no layer 'stem_conv': not a MobileViTv2"):
        SSDLite(0.5, input_shape=(64, 64, 3), classes=5, name="from_a_stranger",
                backbone_weights=keras.Sequential([keras.layers.Dense(2)], name="stranger"))


# --------------------------------------------------------------------------------------
# Outputs, attention, serialization


def test_output_shapes():
    x = np.random.default_rng(1).random((2, 64, 64, 3), dtype=np.float32)
    seg = DeepLabV3(0.5, input_shape=(64, 64, 3), classes=6, output_stride=16, aspp_channels=32)
    assert seg(x).shape == (2, 64, 64, 6)
    low = PSPNet(0.5, input_shape=(64, 64, 3), classes=6, output_stride=8, psp_channels=32,
                 upsample_logits=False)
    assert low(x).shape == (2, 8, 8, 6)
    det = SSDLite(0.5, input_shape=(64, 64, 3), classes=4)
    assert det(x).shape == (2, det.anchors.shape[0], 8)
    assert det.feature_sizes == [(4, 4), (2, 2), (1, 1), (1, 1), (1, 1), (1, 1)]
    assert det.anchors.shape[0] == 6 * (16 + 4 + 1 + 1 + 1) + 4


@pytest.mark.parametrize("attention", ["mha", "linformer"])
def test_any_attention_backbone(attention):
    seg = DeepLabV3(0.5, input_shape=(64, 64, 3), classes=3, aspp_channels=16,
                    output_stride=16, attention=attention)
    det = SSDLite(0.5, input_shape=(64, 64, 3), classes=3, attention=attention)
    x = np.random.default_rng(2).random((1, 64, 64, 3), dtype=np.float32)
    assert np.isfinite(np.asarray(seg(x))).all() and np.isfinite(np.asarray(det(x))).all()
    expected = type(mv.attention.get(attention))
    for model in (seg, det):
        block = model.get_layer("stage3_block1")
        assert all(isinstance(t.attn, expected) for t in block.transformer)


def test_keras_round_trip(tmp_path):
    x = np.random.default_rng(3).random((2, 64, 64, 3), dtype=np.float32)
    seg = DeepLabV3(0.5, input_shape=(64, 64, 3), classes=4, output_stride=8, aspp_channels=16)
    det = SSDLite(0.5, input_shape=(64, 64, 3), classes=4)
    for model in (seg, det):
        perturb_norms(model, seed=5)
        path = str(tmp_path / f"{model.name}.keras")
        model.save(path)
        loaded = keras.saving.load_model(path)
        np.testing.assert_allclose(np.asarray(loaded(x)), np.asarray(model(x)),
                                   rtol=1e-5, atol=1e-5)
        # Dilation survives the round trip.
        assert loaded.get_layer("stage4_block1").local_conv.dilation_rate == (
            model.get_layer("stage4_block1").local_conv.dilation_rate)
    np.testing.assert_array_equal(anchors_for_model(loaded), det.anchors)


def test_invalid_arguments_are_explained():
    with pytest.raises(ValueError, match="output_stride must be one of"):
        mobilevitv2_features(0.5, input_shape=(64, 64, 3), output_stride=4)
    with pytest.raises(ValueError, match="levels must be distinct names"):
        mobilevitv2_features(0.5, input_shape=(64, 64, 3), levels=("stage9",))
    with pytest.raises(ValueError, match="classes must be an int >= 2"):
        DeepLabV3(0.5, input_shape=(64, 64, 3), classes=1)
    with pytest.raises(ValueError, match="aspp_rates must be 3 positive ints"):
        DeepLabV3(0.5, input_shape=(64, 64, 3), aspp_rates=(1, 2))
    with pytest.raises(ValueError, match="background included"):
        SSDLite(0.5, input_shape=(64, 64, 3), classes=1)
    with pytest.raises(FileNotFoundError, match="Weights file not found"):
        SSDLite(0.5, input_shape=(64, 64, 3), classes=3, backbone_weights="missing.pt")
    with pytest.raises(ValueError, match="weights='imagenet', include_top=False"):
        PSPNet(0.5, input_shape=(64, 64, 3), backbone_weights="imagenet")


def test_atrous_conv_past_the_map_is_its_center_tap():
    # A 3x3 conv whose rate reaches past the map only sees its center tap, whatever the
    # rate: AtrousConv2D then runs the 1x1 center conv. Compare with plain dilated convs.
    x = tf.random.stateless_uniform((1, 4, 6, 5), (1, 2))
    kernel = tf.random.stateless_normal((3, 3, 5, 7), (3, 4))
    results = {}
    for rate in (3, 6, 36):
        plain = keras.layers.Conv2D(7, 3, padding="same", dilation_rate=rate, use_bias=False)
        atrous = AtrousConv2D(7, rate)
        for layer in (plain, atrous):
            layer.build((1, 4, 6, 5))
            layer.kernel.assign(kernel)
        results[rate] = (np.asarray(plain(x)), np.asarray(atrous(x)), atrous.center_only)
    center = np.einsum("bhwc,cd->bhwd", np.asarray(x), np.asarray(kernel)[1, 1])
    for rate, (plain_out, atrous_out, center_only) in results.items():
        np.testing.assert_allclose(atrous_out, plain_out, atol=1e-5)
        assert center_only == (rate >= 6)
    np.testing.assert_allclose(results[36][0], center, atol=1e-5)
    assert not np.allclose(results[3][0], center, atol=1e-3)  # rate 3 < width: real taps
