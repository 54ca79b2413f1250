"""MobileViTV2 builders, registry, exact sizes, MACs, `.keras` round trip."""

import json
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from model_utils import perturb_norms

import keras_mvit2 as mv
from keras_mvit2.profiling import count_params, profile

# Reference (ml-cvnets / timm) trainable parameters at 1000 classes and MACs at 256x256.
REFERENCE = {
    "mobilevitv2_050": (1_370_593, 0.465),
    "mobilevitv2_075": (2_866_009, 1.028),
    "mobilevitv2_100": (4_901_841, 1.812),
    "mobilevitv2_125": (7_478_089, 2.817),
    "mobilevitv2_150": (10_594_753, 4.042),
    "mobilevitv2_175": (14_251_833, 5.489),
    "mobilevitv2_200": (18_449_329, 7.156),
}


def test_registry_lists_every_width():
    assert mv.list_models("mobilevitv2*") == sorted(REFERENCE)
    assert mv.list_models("nothing*") == []


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_exact_parameters_and_macs(name):
    params, gmacs = REFERENCE[name]
    model = mv.create_model(name)
    result = profile(model)
    assert result.trainable_params == params
    assert result.params == params  # BN moving statistics are not parameters
    assert abs(result.gmacs / gmacs - 1.0) <= 0.02, (result.gmacs, gmacs)
    # The graph executes fewer: the key projection runs once per pixel position.
    assert result.executed_macs < result.macs
    assert model.name == name


def test_executed_macs_saving_equals_the_key_projection_formula():
    """MobileViTV2-0.5 @256: per layer d^2 (N - 1) P saved, N = 256/64/16, P = 4."""
    model = mv.create_model("mobilevitv2_050")
    result = profile(model)
    saved = sum(layers * d * d * (n - 1) * 4 for layers, d, n in
                [(2, 64, 256), (4, 96, 64), (3, 128, 16)])
    assert result.macs - result.executed_macs == saved
    mha = profile(mv.create_model("mobilevitv2_050", attention="mha"))
    assert mha.macs == mha.executed_macs


@pytest.mark.parametrize(
    "alpha,stages",
    [
        # ml-cvnets' make_divisible rule (timm's int(c * alpha) differs at these widths).
        (0.6, (24, 48, 80, 152, 232, 304)),
        (1.1, (32, 64, 144, 280, 424, 560)),
    ],
)
def test_any_width_follows_the_cvnets_rule(alpha, stages):
    widths = mv.models.mobilevitv2_widths(alpha)
    assert (widths.stem, *widths.stages) == stages
    model = mv.MobileViTV2(alpha, input_shape=(64, 64, 3), classes=10)
    assert model.get_layer("stage4_block1").output.shape[-1] == stages[-1]


def test_1_1_width_reference_numbers():
    # 1.1: stem 32*1.1=35.2 -> 32; L1 64*1.1=70.4 -> 64 (divisor 16); L2 140.8 -> 144;
    # L3 281.6 -> 280; L4 422.4 -> 424; L5 563.2 -> 560 (all nearest multiple of 8/16).
    assert mv.models.mobilevitv2_widths(1.1).attention_dims == (144, 208, 280)


def test_keras_applications_conventions(rng):
    x = rng.uniform(size=(2, 96, 128, 3)).astype("float32")
    model = mv.MobileViTV2(0.5, input_shape=(96, 128, 3), classes=7)
    probs = keras.ops.convert_to_numpy(model(x))
    assert probs.shape == (2, 7)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)  # softmax by default

    logits = mv.MobileViTV2(0.5, input_shape=(96, 128, 3), classifier_activation=None)
    assert logits.get_layer("predictions").activation.__name__ == "linear"

    features = mv.MobileViTV2(0.5, include_top=False, input_shape=(96, 128, 3))
    assert features.output_shape == (None, 4, 4, 256)  # 96 -> 3 -> upsized to 4
    for pooling in ("avg", "max"):
        pooled = mv.MobileViTV2(0.5, include_top=False, pooling=pooling, input_shape=(96, 96, 3))
        assert pooled.output_shape == (None, 256)

    tensor = keras.Input((64, 64, 3))
    model = mv.MobileViTV2(0.5, input_tensor=tensor, classes=3)
    assert model.inputs[0] is tensor


def test_odd_resolution_grows_last_feature_map():
    """As the reference: 224 -> ... 7x7 is upsized to 8x8 before the last block."""
    model = mv.MobileViTV2(0.5, include_top=False, input_shape=(224, 224, 3))
    assert model.output_shape == (None, 8, 8, 256)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"input_shape": (None, None, None)}, "known number of channels"),
        ({"input_shape": (16, 16, 3)}, "at least 32x32"),
        ({"input_shape": (256, 256)}, "height, width, channels"),
        ({"width_multiplier": 0.0}, "width_multiplier"),
        ({"width_multiplier": 5.0}, "width_multiplier"),
        ({"width_multiplier": "big"}, r"width_multiplier must be a number.*Received: "
                                      r"width_multiplier='big'"),
        ({"width_multiplier": None}, "width_multiplier must be a number"),
        ({"width_multiplier": True}, "width_multiplier must be a number"),
        ({"weights": "imagenet"}, r"trained at 256x256; with include_top=True"),
        ({"pooling": "mean", "include_top": False}, "pooling"),
        ({"classes": 0}, "classes"),
    ],
)
def test_bad_arguments_name_the_problem(kwargs, match):
    kwargs.setdefault("input_shape", (64, 64, 3))
    with pytest.raises(ValueError, match=match):
        mv.MobileViTV2(**kwargs)


def test_missing_weights_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        mv.MobileViTV2(0.5, input_shape=(64, 64, 3), weights=str(tmp_path / "nope.pt"))


def test_unknown_model_name():
    with pytest.raises(ValueError, match=r"Unknown model 'mobilevitv2_300'.*mobilevitv2_050"):
        mv.create_model("mobilevitv2_300")


def test_preprocess_input_is_rgb_in_unit_range():
    x = np.array([[[[0, 128, 255]]]], dtype="uint8")
    np.testing.assert_allclose(mv.preprocess_input(x), [[[[0.0, 128 / 255, 1.0]]]])
    t = keras.ops.convert_to_numpy(mv.preprocess_input(keras.ops.convert_to_tensor(x)))
    np.testing.assert_allclose(t, [[[[0.0, 128 / 255, 1.0]]]])


def test_count_params_excludes_only_bn_statistics():
    model = mv.MobileViTV2(0.5, input_shape=(64, 64, 3))
    trainable, frozen = count_params(model)
    assert frozen == 0
    bn_stats = sum(int(np.prod(w.shape)) for w in model.non_trainable_weights)
    assert model.count_params() == trainable + bn_stats == 1_370_593 + 7_776


@pytest.mark.slow
def test_keras_round_trip_in_fresh_process(tmp_path, rng):
    model = mv.MobileViTV2(0.5, input_shape=(64, 96, 3), classes=5)
    perturb_norms(model)
    x = rng.uniform(size=(2, 64, 96, 3)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", keras.ops.convert_to_numpy(model(x, training=False)))
    model.save(tmp_path / "m.keras")
    script = textwrap.dedent(
        f"""
        import numpy as np, keras, keras_mvit2
        m = keras.saving.load_model({str(tmp_path / "m.keras")!r})
        x = np.load({str(tmp_path / "x.npy")!r})
        y = keras.ops.convert_to_numpy(m(x, training=False))
        np.save({str(tmp_path / "y2.npy")!r}, y)
        print(type(m.get_layer("stage2_block1")).__name__)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("MobileViTV2Block")
    np.testing.assert_array_equal(np.load(tmp_path / "y2.npy"), np.load(tmp_path / "y.npy"))


#: Where the family blocks lived before each family got its own folder (issue 49): `.keras`
#: files store a class's module beside its registered name.
_MODULES_BEFORE_THE_FAMILY_FOLDERS = {
    "keras_mvit2.models.mobilevitv2.mobilevitv2_block": "keras_mvit2.layers.mobilevitv2_block",
    "keras_mvit2.models.mobilevit.mobilevit_block": "keras_mvit2.layers.mobilevit_block",
    "keras_mvit2.models.vit.vit_layers": "keras_mvit2.layers.vit_layers",
}


def test_keras_files_written_before_the_family_folders_load(tmp_path, rng):
    """A `.keras` file naming the blocks' old modules loads (Keras finds a class by its
    registered name, `keras_mvit2>Name`, which the move kept), with the same outputs."""
    import zipfile

    x = keras.Input((16, 16, 8))
    h = mv.models.MobileViTV2Block(8, 1, name="v2")(x)
    h = mv.models.MobileViTBlock(8, 1, num_heads=2, filters=8, name="v1")(h)
    tokens = mv.models.PatchEmbedding(4, 8, name="patches")(h)
    tokens = mv.models.ClassTokenPositionEmbedding(name="cls_pos")(tokens)
    tokens = mv.models.ViTBlock(num_heads=2, name="vit")(tokens)
    model = keras.Model(x, mv.models.TokenPooling(name="pool")(tokens))
    for cls in (mv.models.MobileViTV2Block, mv.models.MobileViTBlock, mv.models.ViTBlock,
                mv.models.PatchEmbedding, mv.models.ClassTokenPositionEmbedding,
                mv.models.TokenPooling):
        assert keras.saving.get_registered_name(cls) == f"keras_mvit2>{cls.__name__}"
    perturb_norms(model)
    inputs = rng.uniform(size=(2, 16, 16, 8)).astype("float32")
    expected = keras.ops.convert_to_numpy(model(inputs))
    model.save(tmp_path / "new.keras")
    with zipfile.ZipFile(tmp_path / "new.keras") as src, \
            zipfile.ZipFile(tmp_path / "old.keras", "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "config.json":
                text = data.decode("utf-8")
                for new, old in _MODULES_BEFORE_THE_FAMILY_FOLDERS.items():
                    assert f'"{new}"' in text
                    text = text.replace(f'"{new}"', f'"{old}"')
                data = text.encode("utf-8")
            dst.writestr(item, data)
    loaded = keras.saving.load_model(tmp_path / "old.keras")
    assert type(loaded.get_layer("v2")) is mv.models.MobileViTV2Block
    assert type(loaded.get_layer("vit")) is mv.models.ViTBlock
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded(inputs)), expected)


def test_cli_list_and_profile(tmp_path):
    from keras_mvit2.cli import main

    assert main(["list", "mobilevitv2_0*"]) == 0
    out = tmp_path / "p.json"
    assert main(["profile", "mobilevitv2_050", "--input-size", "256", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["trainable_params"] == 1_370_593 and abs(row["gmacs"] - 0.465) < 0.01
    assert main(["profile", "mobilevitv2_999"]) == 2


def test_decode_predictions_uses_the_bundled_imagenet_classes():
    scores = np.zeros((2, 1000), "float32")
    scores[0, 1] = 0.9  # goldfish
    scores[0, 0] = 0.05
    scores[1, 999] = 1.0  # toilet tissue (last class)
    decoded = mv.decode_predictions(scores, top=2)
    assert decoded[0][0] == ("n01443537", "goldfish", pytest.approx(0.9))
    assert decoded[0][1][:2] == ("n01440764", "tench")
    assert decoded[1][0][1] == "toilet tissue"
    with pytest.raises(ValueError, match=r"\(batch, 1000\)"):
        mv.decode_predictions(np.zeros((1, 10)))


@pytest.mark.parametrize(
    "name,kwargs",
    [("mobilevitv2_050", {}), ("mobilevitv2_050", {"attention": "mobile_attention"}),
     ("mobilevit_xxs", {}), ("deit_tiny", {})],
)
def test_every_random_kernel_is_drawn_independently(name, kwargs):
    """Keras 3 repeats the values of a reused unseeded initializer: no two layers may
    start from identical weights (e.g. the FFNs of two transformer layers)."""
    model = mv.create_model(name, input_shape=(64, 64, 3), **kwargs)
    seen = {}
    for weight in model.weights:
        value = keras.ops.convert_to_numpy(weight)
        if value.size < 64 or value.std() == 0:  # constants (ones / zeros) may repeat
            continue
        assert value.tobytes() not in seen, (weight.path, seen.get(value.tobytes()))
        seen[value.tobytes()] = weight.path
