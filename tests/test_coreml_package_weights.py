"""Core ML packages run on Linux with their own (decompressed) weights, and the
compression recipes: `keras_mvit2.export.coreml.package_weights`, `.recipes`,
`.activation_quantization`.

Oracles: the Keras model (an uncompressed float32 package must reproduce it), a numpy
decompression of the palettized weights written here from the MIL op's own attributes,
numpy loops for the convolution padding modes, and the packages' sizes on disk."""

import inspect
import os

import numpy as np
import pytest

from keras_mvit2.export.coreml.compress import check_compression
from keras_mvit2.export.coreml.recipes import COMPRESSION_RECIPES

pytestmark = pytest.mark.usefixtures("ct")

NUM_IMAGES = 500  # Fashion-MNIST test images for the top-1 agreement


# --------------------------------------------------------------------------------------
# fast: the recipe table and the argument checks (no conversion)


def test_recipe_table_is_what_to_coreml_takes():
    from keras_mvit2.export.coreml.convert import to_coreml

    expected = {"fp16", "int8_linear", "palettize_8bit", "palettize_6bit", "palettize_4bit",
                "palettize_8bit_grouped", "palettize_6bit_grouped", "palettize_4bit_grouped",
                "w8a8"}
    assert expected <= set(COMPRESSION_RECIPES)
    parameters = set(inspect.signature(to_coreml).parameters)
    for name, recipe in COMPRESSION_RECIPES.items():
        assert recipe.name == name
        assert set(recipe.arguments) <= parameters, name
        options = recipe.options(np.zeros((1, 8, 8, 3), np.float32))
        check_compression(options.get("weight_compression"),
                          bits=options.get("palettize_bits", 4), sparsity=0.5,
                          granularity=options.get("palettize_granularity", "per_tensor"),
                          group_size=options.get("palettize_group_size", 16),
                          minimum_deployment_target=options.get("minimum_deployment_target",
                                                                "iOS16"))
    grouped = [r for r in COMPRESSION_RECIPES.values() if "grouped" in r.name]
    assert len(grouped) == 3
    assert all(r.arguments["minimum_deployment_target"] == "iOS18" for r in grouped)
    w8a8 = COMPRESSION_RECIPES["w8a8"]
    assert not w8a8.measurable and w8a8.needs_calibration
    assert all(r.measurable for r in COMPRESSION_RECIPES.values() if r is not w8a8)
    with pytest.raises(ValueError, match="calibration_images"):
        w8a8.options()
    assert "calibration_images" not in COMPRESSION_RECIPES["palettize_4bit"].options()


def test_grouped_palettization_needs_ios18():
    with pytest.raises(ValueError, match="minimum_deployment_target='iOS18'"):
        check_compression("palettize", bits=4, sparsity=0.5, granularity="per_grouped_channel",
                          group_size=16, minimum_deployment_target="iOS17")
    with pytest.raises(ValueError, match="palettize_granularity must be one of"):
        check_compression("palettize", bits=4, sparsity=0.5, granularity="per_channel",
                          group_size=16, minimum_deployment_target="iOS18")
    with pytest.raises(ValueError, match="palettize_bits"):
        check_compression("palettize", bits=5, sparsity=0.5, granularity="per_tensor",
                          group_size=16, minimum_deployment_target="iOS16")


# --------------------------------------------------------------------------------------
# slow: real packages


def _package_bytes(path) -> int:
    return sum(os.path.getsize(os.path.join(folder, name))
               for folder, _, names in os.walk(path) for name in names)


@pytest.fixture(scope="module")
def trained(trained_classifier_path):
    import keras

    return keras.saving.load_model(trained_classifier_path)


@pytest.fixture(scope="module")
def fashion_test(trained):
    """`NUM_IMAGES` Fashion-MNIST test images at the classifier's size, and labels."""
    from shared_fixtures import fashion_mnist_rgb

    from keras_mvit2.data.files import load_fashion_mnist_arrays

    images, labels = load_fashion_mnist_arrays("test")
    return fashion_mnist_rgb(images[:NUM_IMAGES], trained.input_shape[1]), labels[:NUM_IMAGES]


@pytest.fixture(scope="module")
def fp32_package(trained, tmp_path_factory) -> str:
    """The trained classifier as an uncompressed float32 package with logits output."""
    from keras_mvit2.export.coreml import to_coreml

    path = tmp_path_factory.mktemp("fp32") / "fp32.mlpackage"
    report = to_coreml(trained, path, quantization="float32")
    assert report.metadata["keras_mvit2.pointwise_fusions"] != "[]"  # fused pairs present
    return str(path)


@pytest.mark.slow
def test_float32_package_reproduces_keras(trained, fashion_test, fp32_package):
    """Every weight of the program found and used where Core ML uses it: the folded batch
    norms, the fused 1x1 pairs and the channels-first transformer give Keras' logits."""
    from keras_mvit2.export.coreml.package_weights import (
        measurement_kind,
        package_weights,
        predict_with_package_weights,
    )

    weights = package_weights(fp32_package)
    assert len(weights) > 60 and all(w.dtype == np.float32 for w in weights.values())
    images = fashion_test[0][:128]
    want = trained.predict(images, verbose=0)
    got = predict_with_package_weights(trained, fp32_package, images, batch_size=50)
    assert got.shape == want.shape == (128, 10)
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * scale)
    assert measurement_kind(fp32_package) == "exact"
    with pytest.raises(ValueError, match="takes"):
        predict_with_package_weights(trained, fp32_package, np.zeros((1, 64, 64, 3), np.float32))


def _numpy_lut_to_dense(op) -> np.ndarray:
    """The iOS 16 ``constexpr_lut_to_dense`` written from its definition: `indices` are
    `nbits`-bit entries packed into bytes, least significant bit first."""
    lut, packed, shape = op.lut.val, op.indices.val, tuple(op.shape.val)
    nbits = int(np.log2(lut.size))
    count = int(np.prod(shape))
    bits = np.unpackbits(packed.astype(np.uint8), bitorder="little")[:count * nbits]
    indices = bits.reshape(count, nbits).astype(np.int64) @ (1 << np.arange(nbits))
    return lut[indices].reshape(shape)


@pytest.mark.slow
def test_palettized_weights_are_the_look_up_tables_applied(trained, fashion_test, fp32_package,
                                                         tmp_path, capsys):
    from keras_mvit2.export.coreml import to_coreml
    from keras_mvit2.export.coreml.package_weights import (
        load_package_program,
        measurement_kind,
        predict_with_package_weights,
    )

    path = tmp_path / "palettize_4bit.mlpackage"
    report = to_coreml(trained, path, class_names=[str(i) for i in range(10)],
                       **COMPRESSION_RECIPES["palettize_4bit"].options())
    program = load_package_program(path)
    luts = [op for op in program.function.operations if op.op_type == "constexpr_lut_to_dense"]
    assert len(luts) > 40
    assert report.op_histogram["constexpr_lut_to_dense"] == len(luts)  # what the report says
    float_weights = load_package_program(fp32_package).weights
    compared = approximated = 0
    for op in luts:
        name = op.outputs[0].name
        recovered = program.weights[name]
        np.testing.assert_array_equal(recovered, _numpy_lut_to_dense(op))
        # (float32: numpy's float16 sort is not reliable here, so neither is its unique)
        assert len(np.unique(recovered.astype(np.float32))) <= 16
        original = float_weights.get(name.removesuffix("_palettized").removesuffix("_to_fp16"))
        if original is None:
            continue
        compared += 1                 # the same weight, uncompressed (names kept by the passes)
        assert recovered.shape == original.shape
        if len(np.unique(original)) <= 16:   # e.g. the unfold's 0/1 kernels: kept exactly
            np.testing.assert_array_equal(recovered, original)
        else:
            approximated += 1
            error = recovered.astype(np.float32) - original
            relative = np.sqrt(np.mean(error ** 2) / np.mean(original ** 2))
            assert 1e-3 < relative < 0.5     # 4-bit k-means: ~10 % RMS error
    assert compared >= len(luts) - 1    # the classifier's matrix is renamed (transposed)
    assert approximated >= len(luts) - 5
    assert measurement_kind(path) == "approximate: float16 activations"

    images, labels = fashion_test
    probs = predict_with_package_weights(trained, path, images)
    logits = trained.predict(images, verbose=0)
    keras_probs = np.exp(logits - logits.max(1, keepdims=True))
    keras_probs /= keras_probs.sum(1, keepdims=True)
    agreement = float(np.mean(probs.argmax(1) == logits.argmax(1)))
    change = float(np.abs(probs - keras_probs).mean())
    with capsys.disabled():
        print(f"\n[coreml] palettize_4bit, trained classifier: top-1 agreement with Keras "
              f"{agreement:.3f} on {len(images)} Fashion-MNIST test images; top-1 "
              f"{np.mean(probs.argmax(1) == labels):.3f} (Keras "
              f"{np.mean(logits.argmax(1) == labels):.3f}); mean |probability change| "
              f"{change:.4f}")
    assert 1e-4 < change < 0.1     # changed, plausibly
    assert 0.7 <= agreement < 1.0


@pytest.fixture(scope="module")
def small_cnn():
    """A small CNN (about 90k weights, random): compression recipes convert it in seconds."""
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((16, 16, 3)), keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.Conv2D(64, 3, strides=2, padding="same", activation="relu"),
        keras.layers.Conv2D(128, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])


@pytest.mark.slow
def test_palettized_sizes_shrink_with_bits(small_cnn, tmp_path):
    from keras_mvit2.export.coreml import to_coreml

    sizes = {}
    for name in ("fp16", "palettize_8bit", "palettize_6bit", "palettize_4bit",
                 "palettize_4bit_grouped"):
        to_coreml(small_cnn, tmp_path / f"{name}.mlpackage",
                  **COMPRESSION_RECIPES[name].options())
        sizes[name] = _package_bytes(tmp_path / f"{name}.mlpackage")
    assert (sizes["fp16"] > sizes["palettize_8bit"] > sizes["palettize_6bit"]
            > sizes["palettize_4bit"])
    # the weights dominate: about bits / 16 of the float16 file, plus the tables and the rest
    assert sizes["palettize_4bit"] < 0.4 * sizes["fp16"]
    assert sizes["palettize_8bit"] < 0.65 * sizes["fp16"]
    # one table per 16 output channels: more tables, a little larger than one per tensor
    assert sizes["palettize_4bit"] < sizes["palettize_4bit_grouped"] < sizes["palettize_6bit"]


@pytest.mark.slow
def test_w8a8_is_calibrated_here_and_labelled_not_measurable(small_cnn, tmp_path, rng):
    """coremltools calibrates W8A8 with Core ML predictions (macOS only); here the
    program's MIL run in TensorFlow gives the ranges, and the result is labelled as a
    simulation."""
    from keras_mvit2.export.coreml import to_coreml
    from keras_mvit2.export.coreml.package_weights import (
        load_package_program,
        measurement_kind,
        predict_with_package_weights,
    )

    model = small_cnn
    images = rng.uniform(0, 1, (32, 16, 16, 3)).astype(np.float32)
    recipe = COMPRESSION_RECIPES["w8a8"]
    with pytest.raises(ValueError, match="iOS17"):
        to_coreml(model, tmp_path / "old.mlpackage", quantization="float32",
                  activation_quantization="int8", calibration_images=images)
    path = tmp_path / "w8a8.mlpackage"
    report = to_coreml(model, path, **recipe.options(images[:16]))
    ops = report.op_histogram
    assert ops.get("quantize", 0) >= 3 and ops.get("dequantize", 0) >= 3
    assert ops.get("constexpr_affine_dequantize", 0) + ops.get(
        "constexpr_blockwise_shift_scale", 0) >= 2                 # int8 weights too
    assert report.spec_version >= 8                                # iOS 17
    assert measurement_kind(path) == "simulated: activation quantization"
    program = load_package_program(path)
    assert program.activation_quantization
    simulated = predict_with_package_weights(model, path, images)
    want = model.predict(images, verbose=0)
    error = np.abs(simulated - want).max() / np.abs(want).max()
    assert 0 < error < 0.1    # int8 activations, simulated: close, not equal


@pytest.mark.slow
def test_interpreter_convolutions_against_numpy(ct, tmp_path, rng):
    """MIL conv padding modes and a depthwise multiplier against numpy loops, and an op the
    interpreter lacks is an error naming it (never skipped)."""
    from coremltools.converters.mil import Builder as mb  # noqa: N813

    from keras_mvit2.export.coreml.package_weights import load_package_program, run_program

    images = rng.uniform(size=(2, 7, 6, 3)).astype(np.float32)          # (B, H, W, C)
    dense = rng.normal(size=(5, 3, 3, 3)).astype(np.float32)
    depthwise = rng.normal(size=(6, 1, 2, 2)).astype(np.float32)        # 2 outputs per channel

    def numpy_conv(x, w, stride, pads, groups):                          # x: (C, H, W)
        x = np.pad(x, [(0, 0), *pads])
        cout, cin_group, kh, kw = w.shape
        h, wd = (x.shape[1] - kh) // stride + 1, (x.shape[2] - kw) // stride + 1
        y = np.zeros((cout, h, wd))
        for o in range(cout):
            g = o // (cout // groups)
            for i in range(h):
                for j in range(wd):
                    patch = x[g * cin_group:(g + 1) * cin_group, i * stride:i * stride + kh,
                              j * stride:j * stride + kw]
                    y[o, i, j] = np.sum(patch * w[o])
        return y

    def run(build, name):
        program = mb.program(input_specs=[mb.TensorSpec(shape=(1, 7, 6, 3))],
                             opset_version=ct.target.iOS16)(build)
        mlmodel = ct.convert(program, convert_to="mlprogram",
                             compute_precision=ct.precision.FLOAT32,
                             minimum_deployment_target=ct.target.iOS16,
                             pass_pipeline=ct.PassPipeline.EMPTY)
        mlmodel.save(str(tmp_path / name))
        return run_program(load_package_program(tmp_path / name), images)

    pads = {"same": [(1, 1), (0, 1)], "same_lower": [(1, 1), (1, 0)], "valid": [(0, 0), (0, 0)]}
    def strided_conv(pad_type):
        def conv(t):
            return mb.conv(x=mb.transpose(x=t, perm=[0, 3, 1, 2]), weight=dense,
                           strides=[2, 2], pad_type=pad_type)
        return conv

    for pad_type, pad in pads.items():     # a 3x3 kernel, stride 2, on 7x6
        got = run(strided_conv(pad_type), f"conv_{pad_type}.mlpackage")
        for image, out in zip(images, got, strict=True):
            np.testing.assert_allclose(out, numpy_conv(image.transpose(2, 0, 1), dense, 2, pad,
                                                       1), atol=1e-5)

    def depthwise_conv(t):
        return mb.conv(x=mb.transpose(x=t, perm=[0, 3, 1, 2]), weight=depthwise, strides=[1, 1],
                       pad_type="custom", pad=[0, 1, 1, 0], groups=3)

    got = run(depthwise_conv, "depthwise.mlpackage")
    for image, out in zip(images, got, strict=True):
        np.testing.assert_allclose(out, numpy_conv(image.transpose(2, 0, 1), depthwise, 1,
                                                   [(0, 1), (1, 0)], 3), atol=1e-5)

    with pytest.raises(NotImplementedError, match="'cumsum'"):
        run(lambda t: mb.cumsum(x=t, axis=1), "cumsum.mlpackage")
