"""PyTorch checkpoint porting: exact parity with timm, key renaming and error handling.

The timm reference outputs come from `tests/torch_oracle.py`, run once in a
subprocess: torch convolutions segfault once TensorFlow is imported in the same
process, so torch never runs a model here (it only `torch.load`s files, which
is safe after TensorFlow).
"""

import csv
import os

import keras
import numpy as np
import pytest
from shared_fixtures import ORACLE_BATCH, ORACLE_BLOCK_SIZES, ORACLE_MODELS, ORACLE_SIZES

import keras_mvit2
from keras_mvit2.models import convert_weights
from keras_mvit2.models.mobilevitv2.mobilevitv2_port import cvnets_to_timm_key, model_port_targets
from keras_mvit2.models.torch_weights import load_torch_weights
from keras_mvit2.weights import read_torch_state_dict

HERE = os.path.dirname(os.path.abspath(__file__))
KEYMAP_TSV = os.path.join(HERE, "data", "mobilevitv2_keymap_alpha1.0.tsv")


WIDTHS = {"mobilevitv2_050": 0.5, "mobilevitv2_100": 1.0}
SIZES = ((256, 256), (224, 224), (256, 320))
BLOCK_SIZES = ((32, 32), (15, 17))  # 15x17: odd sides, exercises the align-corners resize
BATCH = ORACLE_BATCH
assert set(WIDTHS) <= set(ORACLE_MODELS) and set(SIZES) <= set(ORACLE_SIZES)
assert set(BLOCK_SIZES) <= set(ORACLE_BLOCK_SIZES)

LOGIT_ATOL = 1e-4      # required; measured ~5e-7 (see the printed figures)
FEATURE_ATOL = 1e-4    # last feature map before pooling, values of order 1-10
BLOCK_ATOL = 2e-5      # MobileViTV2Block outputs of magnitude ~10; measured ~6e-6
ATTN_ATOL = 2e-6       # SeparableSelfAttention, outputs of magnitude ~1.4; measured ~5e-7


def _tag(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"


def _report(capsys, text: str) -> None:
    with capsys.disabled():
        print(f"\n[parity] {text}", end="")


def _max_diff(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b)))


def _keymap_rows() -> list[dict[str, str]]:
    with open(KEYMAP_TSV, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def _snapshot(model: keras.Model) -> list[np.ndarray]:
    return [np.array(v) for v in model.weights]


def _assert_unchanged(model: keras.Model, before: list[np.ndarray]) -> None:
    after = model.weights
    assert len(after) == len(before)
    for variable, old in zip(after, before, strict=True):
        np.testing.assert_array_equal(np.asarray(variable), old, err_msg=variable.path)


def _scramble(model: keras.Model) -> None:
    for variable in model.weights:
        variable.assign(np.full(variable.shape, 0.5, dtype=variable.dtype))


# --------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def oracle(timm_oracle_dir) -> dict:
    """The run's timm oracle (conftest.py); returns paths and reference arrays per model."""
    out_dir = timm_oracle_dir
    result = {"dir": str(out_dir)}
    for name in WIDTHS:
        with np.load(out_dir / f"{name}.npz") as data:
            arrays = dict(data)
        result[name] = {
            "pth": str(out_dir / f"{name}.pth"),
            "safetensors": str(out_dir / f"{name}.safetensors"),
            "ref": arrays,
        }
    return result


@pytest.fixture(scope="module")
def ported(oracle):
    """`get(name, size)`: a Keras model ported from the timm `.pth`, built once and reused."""
    cache: dict[tuple[str, tuple[int, int]], keras.Model] = {}

    def get(name: str, size: tuple[int, int] = (256, 256)) -> keras.Model:
        key = (name, tuple(size))
        if key not in cache:
            model = keras_mvit2.create_model(
                name, input_shape=(*size, 3), classifier_activation=None
            )
            load_torch_weights(model, oracle[name]["pth"])
            cache[key] = model
        return cache[key]

    return get


# --------------------------------------------------------------------------------------
# Parity with timm
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES, ids=_tag)
@pytest.mark.parametrize("name", list(WIDTHS))
@pytest.mark.torch
def test_logit_parity(oracle, ported, capsys, name, size):
    ref = oracle[name]["ref"]
    model = ported(name, size)
    tag = _tag(size)
    logits = model(ref[f"x_{tag}"], training=False)
    logit_diff = _max_diff(logits, ref[f"logits_{tag}"])

    features_model = keras.Model(model.input, model.get_layer("stage4_block1").output)
    features = np.asarray(features_model(ref[f"x_{tag}"], training=False))
    feature_diff = _max_diff(features, ref[f"features_{tag}"].transpose(0, 2, 3, 1))
    _report(
        capsys,
        f"{name} {tag}: max|dlogit| = {logit_diff:.2e} (|logit| <= "
        f"{np.abs(ref[f'logits_{tag}']).max():.2f}), max|dfeature| = {feature_diff:.2e} "
        f"(final map {features.shape[1]}x{features.shape[2]}, |feature| <= "
        f"{np.abs(features).max():.2f})",
    )
    assert logit_diff <= LOGIT_ATOL
    assert feature_diff <= FEATURE_ATOL


@pytest.mark.torch
def test_parity_through_safetensors(oracle, capsys):
    name = "mobilevitv2_100"
    ref = oracle[name]["ref"]
    model = keras_mvit2.create_model(name, classifier_activation=None)
    load_torch_weights(model, oracle[name]["safetensors"])
    diff = _max_diff(model(ref["x_256x256"], training=False), ref["logits_256x256"])
    _report(capsys, f"{name} 256x256 via .safetensors: max|dlogit| = {diff:.2e}")
    assert diff <= LOGIT_ATOL


@pytest.mark.torch
def test_parity_through_builder_weights_argument(oracle, capsys):
    name = "mobilevitv2_050"
    ref = oracle[name]["ref"]
    model = keras_mvit2.MobileViTV2(
        0.5, weights=oracle[name]["pth"], input_shape=(224, 224, 3), classifier_activation=None
    )
    diff = _max_diff(model(ref["x_224x224"], training=False), ref["logits_224x224"])
    _report(capsys, f"{name} 224x224 via MobileViTV2(weights=.pth): max|dlogit| = {diff:.2e}")
    assert diff <= LOGIT_ATOL


@pytest.mark.parametrize("name", list(WIDTHS))
@pytest.mark.torch
def test_attention_layer_parity(oracle, ported, capsys, name):
    ref = oracle[name]["ref"]
    attn = ported(name).get_layer("stage2_block1").transformer[0].attn
    # torch (B, d, P, N) -> keras_mvit2 (B, N, P, d)
    out = attn(ref["attn_in"].transpose(0, 3, 2, 1), training=False)
    diff = _max_diff(out, ref["attn_out"].transpose(0, 3, 2, 1))
    _report(capsys, f"{name} stages[2][1].transformer[0].attn: max|d| = {diff:.2e} "
                    f"(|out| <= {np.abs(ref['attn_out']).max():.2f})")
    assert diff <= ATTN_ATOL


@pytest.mark.parametrize("size", BLOCK_SIZES, ids=_tag)
@pytest.mark.parametrize("name", list(WIDTHS))
@pytest.mark.torch
def test_mobilevitv2_block_parity(oracle, ported, capsys, name, size):
    ref = oracle[name]["ref"]
    tag = _tag(size)
    block = ported(name).get_layer("stage2_block1")
    out = block(ref[f"block_in_{tag}"].transpose(0, 2, 3, 1), training=False)
    expected = ref[f"block_out_{tag}"].transpose(0, 2, 3, 1)
    diff = _max_diff(out, expected)
    _report(capsys, f"{name} stages[2][1] block on {tag} -> {expected.shape[1]}x"
                    f"{expected.shape[2]}: max|d| = {diff:.2e} "
                    f"(|out| <= {np.abs(expected).max():.2f})")
    assert diff <= BLOCK_ATOL


# --------------------------------------------------------------------------------------
# Other namings: ml-cvnets and HF transformers
# --------------------------------------------------------------------------------------


def test_cvnets_to_timm_key_matches_keymap():
    rows = _keymap_rows()
    assert len(rows) == 244
    for row in rows:
        assert cvnets_to_timm_key(row["cvnets_key"]) == row["timm_key"], row["cvnets_key"]
        assert cvnets_to_timm_key(row["hf_key"]) == row["timm_key"], row["hf_key"]
        assert cvnets_to_timm_key(row["timm_key"]) == row["timm_key"]
    # num_batches_tracked buffers rename like the other BN buffers
    assert (cvnets_to_timm_key("layer_4.1.local_rep.0.block.norm.num_batches_tracked")
            == "stages.3.1.conv_kxk.bn.num_batches_tracked")


@pytest.mark.parametrize("key", ["encoder.foo", "layer_3.1.unknown.weight", "classifier.2.weight"])
def test_cvnets_to_timm_key_rejects_unknown(key):
    with pytest.raises(ValueError, match="not a MobileViTv2 checkpoint key"):
        cvnets_to_timm_key(key)


@pytest.mark.parametrize("naming", ["cvnets_key", "hf_key"])
@pytest.mark.torch
def test_other_namings_give_identical_logits(oracle, ported, capsys, naming):
    name = "mobilevitv2_100"
    ref = oracle[name]["ref"]
    model = ported(name)
    expected = np.asarray(model(ref["x_256x256"], training=False))
    to_other = {row["timm_key"]: row[naming] for row in _keymap_rows()}
    state = read_torch_state_dict(oracle[name]["pth"])
    renamed = {to_other[k]: v for k, v in state.items()}
    assert len(renamed) == len(state) == 244
    try:
        _scramble(model)
        load_torch_weights(model, renamed)
        logits = np.asarray(model(ref["x_256x256"], training=False))
    finally:
        load_torch_weights(model, oracle[name]["pth"])
    np.testing.assert_array_equal(logits, expected)
    diff = _max_diff(logits, ref["logits_256x256"])
    _report(capsys, f"{name} 256x256 via {naming.split('_')[0]} names: max|dlogit| = {diff:.2e}")
    assert diff <= LOGIT_ATOL


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------


@pytest.mark.torch
def test_width_mismatch_names_tensor_and_both_shapes(oracle, ported):
    model = ported("mobilevitv2_100")
    before = _snapshot(model)
    with pytest.raises(ValueError) as info:
        load_torch_weights(model, oracle["mobilevitv2_050"]["pth"])
    message = str(info.value)
    assert "'stem.conv.weight': torch shape (16, 3, 3, 3)" in message
    assert "'stem_conv/kernel' has shape (3, 3, 3, 32)" in message
    assert "expects torch shape (32, 3, 3, 3)" in message
    assert "width_multiplier=0.5" in message
    assert "nothing was loaded" in message
    _assert_unchanged(model, before)


@pytest.mark.torch
def test_head_mismatch_suggests_classes_or_include_top(oracle):
    model = keras_mvit2.MobileViTV2(0.5, input_shape=(64, 64, 3), classes=10)
    before = _snapshot(model)
    with pytest.raises(ValueError) as info:
        load_torch_weights(model, oracle["mobilevitv2_050"]["pth"])
    message = str(info.value)
    assert "'head.fc.weight': torch shape (1000, 256)" in message
    assert "has shape (256, 10)" in message
    assert "classes=1000" in message and "include_top=False" in message
    assert "stem.conv" not in message  # only the head is wrong
    _assert_unchanged(model, before)


@pytest.mark.torch
def test_include_top_false_ignores_head(oracle, ported):
    name = "mobilevitv2_050"
    reference = ported(name)
    model = keras_mvit2.MobileViTV2(0.5, include_top=False, pooling="avg",
                                    input_shape=(64, 64, 3))
    load_torch_weights(model, oracle[name]["pth"])
    targets, has_head = model_port_targets(model)
    assert not has_head and not any(k.startswith("head.") for k in targets)
    checked = 0
    for layer in model.layers:
        for variable, expected in zip(layer.weights, reference.get_layer(layer.name).weights,
                                      strict=True):
            np.testing.assert_array_equal(np.asarray(variable), np.asarray(expected))
            checked += 1
    assert checked == len(model.weights) > 0


@pytest.mark.torch
def test_missing_and_unexpected_keys_are_named(oracle, ported):
    model = ported("mobilevitv2_050")
    before = _snapshot(model)
    state = read_torch_state_dict(oracle["mobilevitv2_050"]["pth"])
    del state["stages.3.1.transformer.2.mlp.fc1.bias"]
    state["stages.3.1.transformer.4.norm1.weight"] = np.ones(96, "float32")
    with pytest.raises(ValueError) as info:
        load_torch_weights(model, state)
    message = str(info.value)
    assert "1 tensor(s) the model needs are missing" in message
    assert "stages.3.1.transformer.2.mlp.fc1.bias" in message
    assert "1 unexpected tensor(s)" in message
    assert "stages.3.1.transformer.4.norm1.weight" in message
    _assert_unchanged(model, before)


@pytest.mark.torch
def test_missing_head_suggests_include_top_false(oracle):
    model = keras_mvit2.MobileViTV2(0.5, input_shape=(64, 64, 3))
    state = read_torch_state_dict(oracle["mobilevitv2_050"]["safetensors"])
    backbone = {k: v for k, v in state.items() if not k.startswith("head.")}
    with pytest.raises(ValueError, match=r"(?s)head\.fc\.weight.*include_top=False"):
        load_torch_weights(model, backbone)


def test_missing_file(tmp_path):
    missing = str(tmp_path / "nope.pth")
    with pytest.raises(FileNotFoundError, match=r"nope\.pth"):
        read_torch_state_dict(missing)
    with pytest.raises(FileNotFoundError, match=r"nope\.pth"):
        keras_mvit2.MobileViTV2(0.5, input_shape=(64, 64, 3), weights=missing)


@pytest.mark.torch
@pytest.mark.parametrize("filename", ["x.pth", "x.pt", "x.bin", "x.safetensors"])
def test_corrupt_file(tmp_path, ported, filename):
    path = tmp_path / filename
    path.write_bytes(b"\x00garbage, not a checkpoint\xff" * 40)
    with pytest.raises(ValueError, match=r"x\.\w+' is not a valid (PyTorch|safetensors) checkp"):
        read_torch_state_dict(path)
    model = ported("mobilevitv2_050")
    before = _snapshot(model)
    with pytest.raises(ValueError, match="is not a valid"):
        load_torch_weights(model, str(path))
    _assert_unchanged(model, before)


def test_unknown_extension(tmp_path):
    path = tmp_path / "weights.npz"
    path.write_bytes(b"12345")
    with pytest.raises(ValueError, match=r"Unknown checkpoint extension.*\.safetensors"):
        read_torch_state_dict(path)
    keras_file = tmp_path / "model.keras"
    keras_file.write_bytes(b"12345")
    with pytest.raises(ValueError, match="load_weights"):
        read_torch_state_dict(keras_file)


def test_read_state_dict_unwraps_and_cleans():
    inner = {
        "module.stem.conv.weight": np.zeros((16, 3, 3, 3), "float32"),
        "module.stem.bn.num_batches_tracked": np.array(3),
    }
    for wrapper in ("state_dict", "model", "model_state", "state_dict_ema"):
        state = read_torch_state_dict({wrapper: inner, "epoch": 7})
        assert list(state) == ["stem.conv.weight"]
    # the model's weights win over the EMA ones when both are there
    both = {"state_dict_ema": {"a": np.ones(1)}, "state_dict": {"a": np.zeros(1)}}
    assert read_torch_state_dict(both)["a"][0] == 0.0


@pytest.mark.parametrize("state", [{}, {"epoch": 3, "optimizer": {"lr": 0.1}},
                                   {"x.num_batches_tracked": np.array(1)}])
def test_read_state_dict_without_tensors(state):
    with pytest.raises(ValueError, match="holds no tensors"):
        read_torch_state_dict(state)


def test_rejects_models_not_built_by_the_package():
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3)])
    with pytest.raises(ValueError, match="ports models built by keras_mvit2: MobileViTv2"):
        load_torch_weights(model, {"stem.conv.weight": np.zeros((16, 3, 3, 3))})
    with pytest.raises(TypeError, match=r"keras\.Model"):
        load_torch_weights(keras.layers.Dense(3), {})


def test_rejects_unknown_naming():
    model = keras_mvit2.MobileViTV2(0.5, input_shape=(64, 64, 3))
    with pytest.raises(ValueError, match="does not look like a MobileViTv2 state dict"):
        load_torch_weights(model, {"features.0.weight": np.zeros((3, 3))})


def test_round_trip_without_torch():
    """Keras -> timm-layout numpy dict (inverse transforms) -> a fresh model: same weights."""
    source = keras_mvit2.MobileViTV2(0.5, input_shape=(64, 64, 3), classes=7)
    targets, _ = model_port_targets(source)
    state = {}
    for key, target in targets.items():
        value = np.asarray(target.variable)
        perm = {"conv": (3, 2, 0, 1), "depthwise": (2, 3, 0, 1), "dense": (1, 0)}.get(
            target.transform)
        state[key] = value if perm is None else np.transpose(value, perm)
        assert state[key].shape == target.torch_shape, key
    # Perturb BN statistics so they differ from a fresh model's.
    for key in state:
        if key.endswith("running_var"):
            state[key] = state[key] + 0.25
    dest = keras_mvit2.MobileViTV2(0.5, input_shape=(96, 64, 3), classes=7)
    load_torch_weights(dest, state)
    for key, target in model_port_targets(dest)[0].items():
        expected = targets[key].to_keras(state[key])
        np.testing.assert_array_equal(np.asarray(target.variable), expected, err_msg=key)


# --------------------------------------------------------------------------------------
# convert_weights
# --------------------------------------------------------------------------------------


@pytest.mark.torch
def test_convert_weights_round_trip(oracle, tmp_path, capsys):
    name = "mobilevitv2_050"
    ref = oracle[name]["ref"]
    dst = tmp_path / "out" / f"{name}.weights.h5"
    converted = convert_weights(oracle[name]["pth"], dst, name, classifier_activation=None)
    assert dst.is_file()
    assert sorted(os.listdir(dst.parent)) == [dst.name]  # no temporary left behind
    reloaded = keras_mvit2.MobileViTV2(0.5, weights=str(dst), classifier_activation=None)
    x = ref["x_256x256"]
    logits = np.asarray(reloaded(x, training=False))
    np.testing.assert_array_equal(logits, np.asarray(converted(x, training=False)))
    diff = _max_diff(logits, ref["logits_256x256"])
    _report(capsys, f"{name} 256x256 via convert_weights -> .weights.h5: max|dlogit| = "
                    f"{diff:.2e}")
    assert diff <= LOGIT_ATOL


def test_convert_weights_requires_weights_h5(tmp_path):
    dst = tmp_path / "model.h5"
    with pytest.raises(ValueError, match=r"must end with '\.weights\.h5'"):
        convert_weights({"stem.conv.weight": np.zeros((16, 3, 3, 3))}, dst)
    assert not dst.exists()


@pytest.mark.torch
def test_convert_weights_failure_leaves_no_file(oracle, tmp_path, monkeypatch):
    dst = tmp_path / "m.weights.h5"
    # A port failure (0.5 checkpoint, 1.0 model): nothing is written.
    with pytest.raises(ValueError, match="torch shape"):
        convert_weights(oracle["mobilevitv2_050"]["pth"], dst, "mobilevitv2_100")
    assert os.listdir(tmp_path) == []

    # A failure half-way through writing: no partial file, an existing dst is kept.
    dst.write_bytes(b"previous")

    def broken_save(self, filepath, *args, **kwargs):
        with open(filepath, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(keras.Model, "save_weights", broken_save)
    with pytest.raises(OSError, match="disk full"):
        convert_weights(oracle["mobilevitv2_050"]["pth"], dst, "mobilevitv2_050",
                        input_shape=(64, 64, 3))
    assert dst.read_bytes() == b"previous"
    assert os.listdir(tmp_path) == [dst.name]
