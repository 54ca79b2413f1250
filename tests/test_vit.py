"""ViT / DeiT: numpy oracles of eq. (1)-(4), exact timm parameter counts, any attention,
`.keras` round trip, argument errors, and the timm port against real timm logits."""

import json
import math

import keras
import numpy as np
import pytest
from model_utils import TORCH_READY

import keras_mvit2 as mv
from keras_mvit2.layers import (  # noqa: F401 (registers every mechanism)
    attention_registry,
    linformer_attention,
    mobile_attention,
    multi_head_attention,
    random_feature_attention,
)
from keras_mvit2.layers.multi_head_attention import MultiHeadSelfAttention
from keras_mvit2.models import vit as vit_module  # registers deit_*
from keras_mvit2.models.timm_port import load_timm_weights, timm_port_targets
from keras_mvit2.models.vit.vit_builders import ViT
from keras_mvit2.models.vit.vit_layers import (
    ClassTokenPositionEmbedding,
    PatchEmbedding,
    TokenPooling,
    ViTBlock,
    attention_layer,
)

#: timm 1.0.31, `sum(p.numel() for p in timm.create_model(name).parameters())` (all
#: trainable), 1000 classes; measured once with `timm.create_model(name, pretrained=False)`.
TIMM_PARAMS = {
    "deit_tiny": 5_717_416,    # deit_tiny_patch16_224
    "deit_small": 22_050_664,  # deit_small_patch16_224
    "deit_base": 86_567_656,   # deit_base_patch16_224
}

SMALL = dict(patch_size=16, input_shape=(64, 64, 3), embed_dim=48, depth=2, num_heads=3)

# ---------------------------------------------------------------- numpy oracles


def np_layer_norm(x, gamma, beta, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


_erf = np.vectorize(math.erf)


def np_gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_msa(z, w_qkv, b_qkv, w_proj, b_proj, heads):
    """ViT eq. (5)-(8): [q|k|v] = z U_qkv, A = softmax(q k^T / sqrt(D_h)), concat heads, U_msa."""
    b, n, d = z.shape
    hd = d // heads
    qkv = z @ w_qkv + b_qkv
    q, k, v = qkv[..., :d], qkv[..., d : 2 * d], qkv[..., 2 * d :]

    def heads_first(t):
        return t.reshape(b, n, heads, hd).transpose(0, 2, 1, 3)

    q, k, v = heads_first(q), heads_first(k), heads_first(v)
    a = np_softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd))
    out = (a @ v).transpose(0, 2, 1, 3).reshape(b, n, d)
    return out @ w_proj + b_proj


def np_weights(layer):
    return {w.path.split("/", 1)[-1]: keras.ops.convert_to_numpy(w).astype("float64")
            for w in layer.weights}


def np_vit_block(z, w, heads, eps, act):
    """Eq. (2)-(3): z' = z + MSA(LN(z)); z = z' + MLP(LN(z'))."""
    y = np_layer_norm(z, w["norm1/gamma"], w["norm1/beta"], eps)
    z = z + np_msa(y, w["attn/qkv/kernel"], w["attn/qkv/bias"], w["attn/proj/kernel"],
                   w["attn/proj/bias"], heads)
    y = np_layer_norm(z, w["norm2/gamma"], w["norm2/beta"], eps)
    y = act(y @ w["fc1/kernel"] + w["fc1/bias"]) @ w["fc2/kernel"] + w["fc2/bias"]
    return z + y


def np_vit(x, model, patch, heads, eps=1e-6):
    """Eq. (1)-(4) and the head on the class token, from the model's weights."""
    b, h, w_, c = x.shape
    nh, nw = h // patch, w_ // patch
    # x_p: (B, N, P^2 C), patches row-major, pixels (row, col, channel) inside a patch.
    xp = x.reshape(b, nh, patch, nw, patch, c).transpose(0, 1, 3, 2, 4, 5)
    xp = xp.reshape(b, nh * nw, patch * patch * c)
    embed = np_weights(model.get_layer("patch_embed"))
    e = embed["proj/kernel"].reshape(patch * patch * c, -1)     # E: (P^2 C, D)
    tokens = xp @ e + embed["proj/bias"]
    cls_pos = np_weights(model.get_layer("cls_pos_embed"))
    cls = np.broadcast_to(cls_pos["cls_token"], (b, 1, tokens.shape[-1]))
    z = np.concatenate([cls, tokens], axis=1) + cls_pos["pos_embed"]
    i = 0
    while True:
        try:
            block = model.get_layer(f"block_{i}")
        except ValueError:
            break
        z = np_vit_block(z, np_weights(block), heads, eps, np_gelu)
        i += 1
    norm = np_weights(model.get_layer("norm"))
    y = np_layer_norm(z[:, 0], norm["gamma"], norm["beta"], eps)  # eq. (4)
    head = np_weights(model.get_layer("predictions"))
    return y @ head["kernel"] + head["bias"]


def randomize(model, seed=0, scale=0.2):
    """Every weight random (gammas around 1), so no term of the oracle is trivial."""
    rng = np.random.default_rng(seed)
    for w in model.weights:
        value = rng.normal(0.0, scale, w.shape)
        if w.path.endswith("gamma"):
            value = 1.0 + value
        w.assign(value.astype("float32"))


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


# ---------------------------------------------------------------- oracles


def test_small_vit_matches_numpy_eq_1_to_4(rng):
    model = ViT(classes=7, classifier_activation=None, **SMALL)
    randomize(model)
    x = rng.normal(size=(2, 64, 64, 3)).astype("float32")
    expected = np_vit(x.astype("float64"), model, patch=16, heads=3)
    got = to_numpy(model(x))
    assert np.abs(expected).max() > 0.5  # non-trivial logits
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=0)


@pytest.mark.parametrize("activation,eps", [("gelu", 1e-6), ("silu", 1e-5)])
def test_vit_block_numpy_oracle_both_layouts(rng, activation, eps):
    block = ViTBlock(num_heads=4, mlp_ratio=2.0, activation=activation, norm_epsilon=eps)
    x3 = rng.normal(size=(2, 9, 16)).astype("float32")
    block(x3)
    randomize(block, seed=3)
    act = np_gelu if activation == "gelu" else (lambda t: t / (1.0 + np.exp(-t)))
    w = np_weights(block)
    expected = np_vit_block(x3.astype("float64"), w, 4, eps, act)
    np.testing.assert_allclose(to_numpy(block(x3)), expected, atol=1e-5, rtol=0)

    # MobileViT layout (B, N, P, d): attention over N separately for every pixel position P.
    block4 = ViTBlock.from_config(block.get_config())
    x4 = rng.normal(size=(2, 9, 4, 16)).astype("float32")
    block4(x4)
    for src, dst in zip(block.weights, block4.weights, strict=True):
        dst.assign(src)
    expected4 = np.stack(
        [np_vit_block(x4[:, :, p].astype("float64"), w, 4, eps, act) for p in range(4)], axis=2
    )
    np.testing.assert_allclose(to_numpy(block4(x4)), expected4, atol=1e-5, rtol=0)


def test_patch_embedding_and_class_token_oracles(rng):
    x = rng.normal(size=(2, 8, 12, 3)).astype("float32")
    embed = PatchEmbedding(4, 5)
    tokens = to_numpy(embed(x))
    assert tokens.shape == (2, 6, 5)
    w = np_weights(embed)
    for i in range(2):
        for j in range(3):
            patch = x[:, 4 * i : 4 * i + 4, 4 * j : 4 * j + 4, :]
            expected = np.einsum("bhwc,hwcd->bd", patch, w["proj/kernel"]) + w["proj/bias"]
            np.testing.assert_allclose(tokens[:, i * 3 + j], expected, atol=1e-5)

    cls_pos = ClassTokenPositionEmbedding()
    out = to_numpy(cls_pos(tokens))
    cw = np_weights(cls_pos)
    assert cw["cls_token"].shape == (1, 1, 5) and cw["pos_embed"].shape == (1, 7, 5)
    np.testing.assert_allclose(out[:, 0], np.broadcast_to(cw["cls_token"][0, 0] +
                                                          cw["pos_embed"][0, 0], (2, 5)),
                               atol=1e-6)
    np.testing.assert_allclose(out[:, 1:], tokens + cw["pos_embed"][:, 1:], atol=1e-6)


def test_token_pooling_modes(rng):
    x = rng.normal(size=(3, 5, 4)).astype("float32")
    np.testing.assert_array_equal(to_numpy(TokenPooling("token")(x)), x[:, 0])
    np.testing.assert_allclose(to_numpy(TokenPooling("avg")(x)), x[:, 1:].mean(1), atol=1e-6)
    np.testing.assert_array_equal(to_numpy(TokenPooling("max")(x)), x[:, 1:].max(1))
    np.testing.assert_allclose(
        to_numpy(TokenPooling("avg", num_prefix_tokens=0)(x)), x.mean(1), atol=1e-6)


# ---------------------------------------------------------------- timm sizes, registry


@pytest.mark.parametrize("name", sorted(TIMM_PARAMS))
def test_parameter_counts_equal_timm(name):
    model = mv.create_model(name)  # build only (no forward pass: DeiT-Base is 86 M)
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    assert trainable == TIMM_PARAMS[name]
    assert not model.non_trainable_weights
    assert model.name == name
    assert model.input_shape == (None, 224, 224, 3)
    # 196 patches + the class token (the fixed token count Linformer needs).
    assert model.get_layer("cls_pos_embed").output.shape == (None, 197, vit_config(name))


def vit_config(name):
    return vit_module.DEIT_CONFIGS[name]["embed_dim"]


def test_deit_configs_and_user_kwargs_win():
    assert {n: vit_module.DEIT_CONFIGS[n]["num_heads"] for n in TIMM_PARAMS} == {
        "deit_base": 12, "deit_small": 6, "deit_tiny": 3}
    model = mv.create_model("deit_tiny", input_shape=(64, 64, 3), depth=1, classes=5)
    assert [layer.name for layer in model.layers if isinstance(layer, ViTBlock)] == ["block_0"]
    assert model.output_shape == (None, 5)


# ---------------------------------------------------------------- any attention


@pytest.mark.parametrize("name", attention_registry.available())
def test_every_attention_builds_and_runs(name, rng):
    model = ViT(attention=name, classes=4, classifier_activation=None, **SMALL)
    attn = model.get_layer("block_0").attn
    assert type(attn) is type(attention_registry.get(name))
    if "num_heads" in attn.get_config():
        assert attn.num_heads == 3  # the model's heads reach every mechanism that has heads
    x = rng.uniform(size=(2, 64, 64, 3)).astype("float32")
    y = to_numpy(model(x))
    assert y.shape == (2, 4) and np.isfinite(y).all()
    assert np.abs(y[0] - y[1]).max() > 1e-4  # the output depends on the image


def test_deit_small_mobile_attention_rows():
    # The DeiT-S-MobiAtt row of the Mobile-Attention paper (22.0 M, as DeiT-S): MobiAtt
    # has exactly MHA's parameters (qkv and output projections), so the count is DeiT-S's.
    model = mv.create_model("deit_small", attention="mobile_attention")
    attn = model.get_layer("block_0").attn
    assert type(attn).__name__ == "MobileAttention" and attn.num_heads == 6
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    assert trainable == TIMM_PARAMS["deit_small"]


def test_linformer_sees_the_fixed_token_count():
    model = ViT(attention={"name": "linformer", "projected_tokens": 8}, **SMALL)
    attn = model.get_layer("block_1").attn
    assert attn.num_tokens == 17 and attn.projected_tokens == 8  # 4x4 patches + class token
    assert attn.num_heads == 3


def test_attention_layer_num_heads_rules():
    assert attention_layer("mha", 6).num_heads == 6
    assert not hasattr(attention_layer("separable", 6), "num_heads")
    # A config dict's own num_heads wins; a layer instance is copied as configured.
    assert attention_layer({"name": "mha", "num_heads": 2}, 6).num_heads == 2
    assert attention_layer({"name": "rfa", "feature_dim": 8}, 6).num_heads == 6
    assert attention_layer(MultiHeadSelfAttention(num_heads=2), 6).num_heads == 2


# ---------------------------------------------------------------- API, serialization, errors


def test_backbone_outputs_and_pooling(rng):
    x = rng.uniform(size=(2, 64, 64, 3)).astype("float32")
    tokens = ViT(include_top=False, **SMALL)
    assert tokens.output_shape == (None, 17, 48)
    seq = to_numpy(tokens(x))
    for pooling, expected in (("token", seq[:, 0]), ("avg", seq[:, 1:].mean(1)),
                              ("max", seq[:, 1:].max(1))):
        pooled = ViT(include_top=False, pooling=pooling, **SMALL)
        pooled.set_weights(tokens.get_weights())
        np.testing.assert_allclose(to_numpy(pooled(x)), expected, atol=1e-5)
    probs = to_numpy(ViT(classes=3, **SMALL)(x))
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)  # softmax by default


def test_keras_round_trip(tmp_path, rng):
    model = ViT(classes=5, dropout=0.1, name="tiny_vit", **SMALL)
    randomize(model, seed=4, scale=0.05)
    x = rng.uniform(size=(2, 64, 64, 3)).astype("float32")
    path = str(tmp_path / "vit.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(to_numpy(loaded(x)), to_numpy(model(x)))
    assert loaded.name == "tiny_vit"
    assert isinstance(loaded.get_layer("block_1"), ViTBlock)
    weights = str(tmp_path / "vit.weights.h5")  # weights= also takes Keras weight files
    model.save_weights(weights)
    rebuilt = ViT(classes=5, weights=weights, **SMALL)
    np.testing.assert_array_equal(to_numpy(rebuilt(x)), to_numpy(model(x)))


@pytest.mark.parametrize(
    "layer",
    [PatchEmbedding(4, 8), ClassTokenPositionEmbedding(), TokenPooling("avg"),
     ViTBlock(num_heads=2, attention={"name": "mobile_attention"}, activation="silu")],
    ids=lambda layer: type(layer).__name__,
)
def test_layer_config_round_trip(layer, rng):
    shape = (2, 8, 8, 3) if isinstance(layer, PatchEmbedding) else (2, 5, 8)
    x = rng.normal(size=shape).astype("float32")
    y = to_numpy(layer(x))
    clone = type(layer).from_config(layer.get_config())
    clone(x)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(to_numpy(clone(x)), y)
    assert keras.saving.get_registered_name(type(layer)).startswith("keras_mvit2>")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(input_shape=(72, 64, 3)), "multiples of patch_size=16"),
        (dict(embed_dim=50), "divisible by num_heads"),
        (dict(depth=0), "depth must be a positive int"),
        (dict(num_heads=0), "num_heads must be a positive int"),
        (dict(mlp_ratio=0), "mlp_ratio must be positive"),
        (dict(pooling="avg"), "pooling must be None"),
        (dict(include_top=False, pooling="mean"), "pooling must be None, 'token'"),
        (dict(classes=0), "classes must be a positive int"),
        (dict(attention="nope"), "Unknown attention"),
        (dict(weights="imagenet"), "publishes weights for MobileViTv2 only"),
    ],
)
def test_invalid_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ViT(**dict(SMALL, **kwargs))


def test_invalid_layer_arguments():
    with pytest.raises(ValueError, match="Received"):
        PatchEmbedding(0, 8)
    with pytest.raises(ValueError, match="Received"):
        PatchEmbedding(16, 8)(np.zeros((1, 20, 16, 3), "float32"))
    with pytest.raises(ValueError, match="Received"):
        TokenPooling("cls")
    with pytest.raises(ValueError, match="Received"):
        ViTBlock(num_heads=2, dropout=1.0)
    with pytest.raises(ValueError, match="Received"):
        ViTBlock()(np.zeros((2, 8), "float32"))


# ---------------------------------------------------------------- port checks (no torch)


def timm_named_state(model, rng):
    """A random checkpoint with timm's names and torch shapes for `model`."""
    targets, _ = timm_port_targets(model)
    return {k: rng.normal(size=t.torch_shape).astype("float32") for k, t in targets.items()}


def test_port_is_strict(rng):
    model = ViT(classes=10, **SMALL)
    state = timm_named_state(model, rng)
    assert {"cls_token", "pos_embed", "patch_embed.proj.weight", "blocks.1.attn.qkv.weight",
            "blocks.1.mlp.fc2.bias", "norm.weight", "head.weight", "head.bias"} <= set(state)
    assert len(state) == 4 + 12 * 2 + 2 + 2
    load_timm_weights(model, state)
    np.testing.assert_array_equal(
        to_numpy(model.get_layer("block_1").attn.qkv.kernel),
        state["blocks.1.attn.qkv.weight"].T)

    before = [to_numpy(w) for w in model.weights]
    bad = dict(state, pos_embed=np.zeros((1, 197, 48), "float32"))
    with pytest.raises(ValueError) as err:
        load_timm_weights(model, bad)
    message = str(err.value)
    assert "'pos_embed': torch shape (1, 197, 48)" in message and "(1, 17, 48)" in message
    assert "input size" in message
    missing = {k: v for k, v in state.items() if k != "blocks.0.norm1.bias"}
    with pytest.raises(ValueError, match=r"missing[\s\S]*blocks\.0\.norm1\.bias"):
        load_timm_weights(model, missing)
    with pytest.raises(ValueError, match=r"unexpected[\s\S]*dist_token"):
        load_timm_weights(model, dict(state, dist_token=np.zeros((1, 1, 48), "float32")))
    for w, b in zip(model.weights, before, strict=True):  # nothing was loaded
        np.testing.assert_array_equal(to_numpy(w), b)

    backbone = ViT(include_top=False, **SMALL)
    load_timm_weights(backbone, state)  # the head is ignored without a classifier
    with pytest.raises(ValueError, match="attention='mha'"):
        load_timm_weights(ViT(attention="separable", **SMALL), state)


# ---------------------------------------------------------------- timm oracle (torch)

@pytest.fixture(scope="module")
def timm_deit(timm_oracle_v1_dir):
    """The run's MobileViT v1 / DeiT oracle (conftest.py's `timm_oracle_v1_dir`:
    deit_tiny_patch16_224 at 224x224 among others) and its manifest."""
    manifest = json.loads((timm_oracle_v1_dir / "manifest.json").read_text())
    return timm_oracle_v1_dir, manifest


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.skipif(not TORCH_READY, reason="needs torch, timm and safetensors")
def test_deit_tiny_matches_timm_logits(timm_deit):
    out_dir, manifest = timm_deit
    ref = np.load(out_dir / "deit_tiny_patch16_224.npz")
    weights = str(out_dir / "deit_tiny_patch16_224.safetensors")
    model = mv.create_model("deit_tiny", weights=weights, classifier_activation=None)
    logits = to_numpy(model(ref["x_224x224"]))
    expected = ref["logits_224x224"]
    assert np.abs(expected).max() > 1.0  # O(1) logits: the tolerance is meaningful
    assert np.abs(logits - expected).max() <= 1e-4
    assert manifest["models"]["deit_tiny_patch16_224"]["num_tensors"] == 152


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.skipif(not TORCH_READY, reason="needs torch, timm and safetensors")
def test_timm_checkpoint_into_wrong_model_names_the_tensor(timm_deit):
    out_dir, _ = timm_deit
    weights = str(out_dir / "deit_tiny_patch16_224.safetensors")
    small = mv.create_model("deit_small")
    with pytest.raises(ValueError, match=r"'cls_token': torch shape \(1, 1, 192\)"):
        load_timm_weights(small, weights)
