"""Core ML export: the ML Program's structure on Linux, predictions on macOS."""

import json
import os

import keras
import numpy as np
import pytest
from model_utils import perturb_norms

import keras_mvit2 as mv
from keras_mvit2.export import get_target
from keras_mvit2.export.coreml import (
    coreml_predictions_available,
    inspect_coreml,
    to_coreml,
)

pytestmark = pytest.mark.usefixtures("ct")


@pytest.fixture(scope="module")
def classifier():
    model = mv.MobileViTV2(0.5, input_shape=(256, 256, 3), classes=1000)
    perturb_norms(model)
    return model


@pytest.fixture(scope="module")
def fp16_package(classifier, tmp_path_factory):
    path = tmp_path_factory.mktemp("coreml") / "mobilevitv2_050.mlpackage"
    return to_coreml(classifier, path)


@pytest.mark.slow
def test_ml_program_structure(fp16_package, capsys):
    report = fp16_package
    with capsys.disabled():
        print(f"\n[coreml] MobileViTV2-0.5 @256 fp16 MIL ops: {report.op_histogram}")
    assert report.spec_version >= 7  # iOS16 ML Program
    assert report.max_tensor_rank <= 4  # Core ML's limit is 5; we keep 4
    # The only matrix product is the classifier: the separable attention has none.
    assert report.op_histogram.get("matmul", 0) == 1
    assert "einsum" not in report.op_histogram
    assert report.op_histogram["conv"] >= 50
    # One fold per MobileViTv2 block; the unfolds are depthwise 0/1 convolutions
    # (export/coreml/layout.py), and the only layout changes are the folds' and the
    # one before the global pooling.
    assert report.op_histogram["depth_to_space"] == 3
    assert "space_to_depth" not in report.op_histogram
    assert report.op_histogram["transpose"] == 4
    (image,) = report.inputs
    assert image == {"name": "image", "type": "imageType", "width": 256, "height": 256,
                     "color_space": "RGB"}
    (probs,) = report.outputs
    assert probs["name"] == "probabilities" and probs["shape"] == [1, 1000]
    assert probs["dtype"] == "FLOAT16"
    assert '"scale": 0.00392156862745098' in report.metadata["keras_mvit2.preprocessing"]
    # The export target reads the default format back from the package.
    assert get_target("coreml").metadata(report.path)["quantization"] == "float16"


@pytest.mark.slow
def test_classifier_labels_and_float32(ct, tmp_path):
    """Converted through the export target (`get_target("coreml").convert`, which
    `mvit2 export` and `validate` call; it hands the model to `to_coreml`): its one op count
    and the names and format it reads back, besides the package's labels and precision."""
    model = mv.MobileViTV2(0.5, input_shape=(64, 64, 3), classes=3, classifier_activation=None)
    target = get_target("coreml")
    report = target.convert(model, tmp_path / "c.mlpackage", quantization="float32",
                            class_names=["cat", "dog", "fox"])
    # One op count for every report: compute ops, constants not counted (TFLite holds its
    # constants as tensors, not ops).
    assert report.num_ops == sum(n for op, n in report.op_histogram.items() if op != "const")
    assert 0 < report.num_ops < sum(report.op_histogram.values())
    meta = target.metadata(report.path)
    assert meta["class_names"] == ["cat", "dog", "fox"] and meta["quantization"] == "float32"
    if not target.can_run():
        assert "need macOS" in target.host_note()
    names = [o["name"] for o in report.outputs]
    assert names == ["classLabel", "classLabel_probs"]
    # A logits model gets a softmax so the classifier's probabilities are probabilities:
    # one besides the 9 attention layers' softmax over the tokens.
    assert report.op_histogram.get("softmax", 0) == 9 + 1
    assert report.metadata["keras_mvit2.precision"] == "float32"
    # The package records the keras_mvit2 version that wrote it (read back from the file).
    assert report.metadata["keras_mvit2.version"] == mv.__version__
    assert ct.models.MLModel(report.path, skip_model_load=True).short_description.endswith(
        f"exported by keras_mvit2 {mv.__version__}")


def test_small_model_converts_with_image_input_and_labels(ct, tmp_path):
    """The fast tier's Core ML conversion: one MobileViTv2 block (unfold, attention, fold)
    between a stem and a classifier, at 32x32, in seconds."""
    from keras_mvit2.models import MobileViTV2Block

    keras.utils.set_random_seed(0)
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="silu")(inputs)
    x = MobileViTV2Block(32, num_layers=1, ffn_dim=64, name="mvit")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(3)(x), name="small_mvit")
    report = to_coreml(model, tmp_path / "small.mlpackage", class_names=["a", "b", "c"])
    assert report.spec_version >= 7 and report.max_tensor_rank <= 4
    (image,) = report.inputs
    assert image == {"name": "image", "type": "imageType", "width": 32, "height": 32,
                     "color_space": "RGB"}
    assert [o["name"] for o in report.outputs] == ["classLabel", "classLabel_probs"]
    # One fold (depth_to_space), the attention's softmax over the tokens and the one added
    # for the logits, and no token-by-token matrix product (the classifier's is the one).
    assert report.op_histogram["depth_to_space"] == 1
    assert report.op_histogram["softmax"] == 2
    assert report.op_histogram.get("matmul", 0) == 1
    description = ct.models.MLModel(report.path, skip_model_load=True).get_spec().description
    assert description.predictedFeatureName == "classLabel"
    probs = description.output[1].type.dictionaryType  # label -> probability
    assert probs.WhichOneof("KeyType") == "stringKeyType"
    assert report.metadata["keras_mvit2.version"] == mv.__version__
    # The forms it was traced in: a float runtime's token sum (product and mean) for the
    # layers, the block's transformer channels-first (its unfold a depthwise convolution,
    # the one fold above: depth_to_space, no space_to_depth).
    forms = json.loads(report.metadata["keras_mvit2.forms"])
    assert forms == {
        "token_pooling": "product_mean", "token_normaliser": "exp_mean",
        "variance": "one_pass", "unfold": "space_to_depth", "flow_epsilon": "add",
        "products": "as_written", "layout": "channels_last",
        "mobilevitv2_blocks": {"token_pooling": "product_sum", "token_normaliser": "softmax",
                               "variance": "centred", "unfold": "depthwise_conv",
                               "flow_epsilon": "add", "products": "as_written",
                               "layout": "channels_first"}}
    assert "space_to_depth" not in report.op_histogram


# Palettization (to_coreml's defaults: 4 bits, one table per weight) is converted and its
# tables checked, on the trained MobileViTV2-0.5, by tests/test_coreml_package_weights.py::
# test_palettized_weights_are_the_look_up_tables_applied (more than 40 constexpr_lut_to_dense
# in the report and in the program).
@pytest.mark.slow
@pytest.mark.parametrize(
    "compression,op",
    [("int8", "constexpr_affine_dequantize"), ("prune", "constexpr_sparse_to_dense")],
)
def test_weight_compression(compression, op, tmp_path):
    model = mv.MobileViTV2(0.5, input_shape=(64, 64, 3), classes=10)
    report = to_coreml(model, tmp_path / "m.mlpackage", image_input=False,
                       weight_compression=compression)
    assert report.op_histogram.get(op, 0) >= 40, report.op_histogram
    assert report.inputs[0]["type"] == "multiArrayType"


def test_bad_arguments_leave_nothing_behind(tmp_path):
    model = mv.MobileViTV2(0.5, input_shape=(64, 64, 3), classes=3)
    with pytest.raises(ValueError, match=r"\.mlpackage"):
        to_coreml(model, tmp_path / "m.mlmodel")
    with pytest.raises(ValueError, match="class_names has 2 entries"):
        to_coreml(model, tmp_path / "m.mlpackage", class_names=["a", "b"])
    with pytest.raises(ValueError, match="quantization"):
        to_coreml(model, tmp_path / "m.mlpackage", quantization="int4")
    with pytest.raises(ValueError, match="weight_compression"):
        to_coreml(model, tmp_path / "m.mlpackage", weight_compression="int4")
    assert os.listdir(tmp_path) == []
    with pytest.raises(FileNotFoundError):
        inspect_coreml(tmp_path / "missing.mlpackage")


@pytest.mark.slow
@pytest.mark.skipif(not coreml_predictions_available(),
                    reason="Core ML predictions need macOS (Core ML's runtime is not on Linux)")
def test_predictions_match_keras_on_macos(classifier, tmp_path, rng):
    from keras_mvit2.export.coreml import run_coreml

    images = rng.integers(0, 256, size=(2, 256, 256, 3)).astype("uint8")
    path = tmp_path / "fp32.mlpackage"
    to_coreml(classifier, path, quantization="float32")
    want = keras.ops.convert_to_numpy(classifier(mv.preprocess_input(images), training=False))
    np.testing.assert_allclose(run_coreml(path, images), want, atol=1e-4)
