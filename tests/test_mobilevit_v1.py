"""MobileViT v1: the block against a numpy transcription, exact timm parameter counts, any
attention, `.keras` round trip, argument errors, and the timm port against real timm logits."""

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
from keras_mvit2.models import mobilevit as mobilevit_module  # noqa: F401 (registers)
from keras_mvit2.models.mobilevit.mobilevit_block import MobileViTBlock
from keras_mvit2.models.mobilevit.mobilevit_builders import (
    MOBILEVIT_CONFIGS,
    MobileViT,
    MobileViTConfig,
)
from keras_mvit2.models.timm_port import load_timm_weights, timm_port_targets

#: timm 1.0.31, `sum(p.numel() for p in timm.create_model(name).parameters())` (all
#: trainable), 1000 classes; measured once with `timm.create_model(name, pretrained=False)`.
TIMM_PARAMS = {
    "mobilevit_xxs": 1_272_024,
    "mobilevit_xs": 2_317_848,
    "mobilevit_s": 5_578_632,
}

# ---------------------------------------------------------------- numpy oracle


def np_silu(x):
    return x / (1.0 + np.exp(-x))


def np_bn(x, w, prefix, eps=1e-5):
    return ((x - w[f"{prefix}/moving_mean"]) / np.sqrt(w[f"{prefix}/moving_variance"] + eps)
            * w[f"{prefix}/gamma"] + w[f"{prefix}/beta"])


def np_conv_same(x, kernel):
    """Stride-1 convolution, zero padding (k - 1) / 2 on every side; kernel (k, k, C, O)."""
    k = kernel.shape[0]
    pad = (k - 1) // 2
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    h, w = x.shape[1], x.shape[2]
    out = np.zeros(x.shape[:3] + (kernel.shape[-1],))
    for i in range(k):
        for j in range(k):
            out += xp[:, i : i + h, j : j + w, :] @ kernel[i, j]
    return out


def np_resize_axis(x, axis, size):
    """PyTorch `interpolate(mode="bilinear", align_corners=False)` along one axis."""
    n = x.shape[axis]
    scale = n / size
    out = []
    for o in range(size):
        src = max((o + 0.5) * scale - 0.5, 0.0)
        i0 = math.floor(src)
        i1 = min(i0 + 1, n - 1)
        lam = src - i0
        out.append((1 - lam) * np.take(x, i0, axis) + lam * np.take(x, i1, axis))
    return np.stack(out, axis=axis)


def np_resize(x, h, w):
    return np_resize_axis(np_resize_axis(x, 1, h), 2, w)


def np_layer_norm(x, gamma, beta, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_transformer(z, w, prefix, heads, eps=1e-5):
    """timm `Block` (pre-norm, MHA, MLP with SiLU) on tokens (B, N, d)."""
    b, n, d = z.shape
    hd = d // heads
    y = np_layer_norm(z, w[f"{prefix}/norm1/gamma"], w[f"{prefix}/norm1/beta"], eps)
    qkv = y @ w[f"{prefix}/attn/qkv/kernel"] + w[f"{prefix}/attn/qkv/bias"]
    q, k, v = (qkv[..., i * d : (i + 1) * d].reshape(b, n, heads, hd).transpose(0, 2, 1, 3)
               for i in range(3))
    a = np_softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd))
    o = (a @ v).transpose(0, 2, 1, 3).reshape(b, n, d)
    z = z + o @ w[f"{prefix}/attn/proj/kernel"] + w[f"{prefix}/attn/proj/bias"]
    y = np_layer_norm(z, w[f"{prefix}/norm2/gamma"], w[f"{prefix}/norm2/beta"], eps)
    y = np_silu(y @ w[f"{prefix}/fc1/kernel"] + w[f"{prefix}/fc1/bias"])
    return z + y @ w[f"{prefix}/fc2/kernel"] + w[f"{prefix}/fc2/bias"]


def np_mobilevit_block(x, w, num_layers, heads, patch, fusion):
    """Mehta & Rastegari 2022, Fig. 1b, as timm's MobileVitBlock.forward."""
    b, h, w_, _ = x.shape
    y = np_silu(np_bn(np_conv_same(x, w["conv_kxk/kernel"]), w, "conv_kxk_bn"))
    y = np_conv_same(y, w["conv_1x1/kernel"])
    d = y.shape[-1]
    nh, nw = math.ceil(h / patch), math.ceil(w_ / patch)
    if (nh * patch, nw * patch) != (h, w_):
        y = np_resize(y, nh * patch, nw * patch)
    # unfold: token n = i * nw + j (patch grid, row-major), pixel p = ph * patch + pw
    tokens = np.zeros((b, patch * patch, nh * nw, d))
    for i in range(nh):
        for j in range(nw):
            for ph in range(patch):
                for pw in range(patch):
                    tokens[:, ph * patch + pw, i * nw + j] = y[:, i * patch + ph, j * patch + pw]
    t = tokens.reshape(b * patch * patch, nh * nw, d)   # attention over patches, per pixel
    for layer in range(num_layers):
        t = np_transformer(t, w, f"transformer_{layer}", heads)
    t = np_layer_norm(t, w["norm/gamma"], w["norm/beta"], 1e-5).reshape(tokens.shape)
    y = np.zeros((b, nh * patch, nw * patch, d))
    for i in range(nh):
        for j in range(nw):
            for ph in range(patch):
                for pw in range(patch):
                    y[:, i * patch + ph, j * patch + pw] = t[:, ph * patch + pw, i * nw + j]
    if y.shape[1:3] != (h, w_):
        y = np_resize(y, h, w_)
    y = np_silu(np_bn(np_conv_same(y, w["conv_proj/kernel"]), w, "conv_proj_bn"))
    if not fusion:
        return y
    y = np.concatenate([x, y], axis=-1)
    return np_silu(np_bn(np_conv_same(y, w["conv_fusion/kernel"]), w, "conv_fusion_bn"))


def randomize(layer, seed=0, scale=0.3):
    rng = np.random.default_rng(seed)
    for w in layer.weights:
        if w.path.endswith("moving_variance"):
            value = rng.uniform(0.5, 1.5, w.shape)
        elif w.path.endswith("gamma"):
            value = 1.0 + rng.normal(0.0, scale, w.shape)
        else:
            value = rng.normal(0.0, scale, w.shape)
        w.assign(value.astype("float32"))


def np_weights(layer):
    return {w.path.split("/", 1)[-1]: keras.ops.convert_to_numpy(w).astype("float64")
            for w in layer.weights}


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


@pytest.mark.parametrize(
    "height,width,filters,fusion",
    [(8, 8, None, True), (7, 9, None, True), (8, 6, 10, False)],
    ids=["divisible", "resized", "no-fusion"],
)
def test_block_matches_numpy(rng, height, width, filters, fusion):
    block = MobileViTBlock(8, num_layers=2, num_heads=4, filters=filters, fusion=fusion)
    x = rng.normal(size=(2, height, width, 6)).astype("float32")
    block(x)
    randomize(block, seed=height)
    expected = np_mobilevit_block(x.astype("float64"), np_weights(block), 2, 4, 2, fusion)
    got = to_numpy(block(x, training=False))
    assert got.shape == (2, height, width, filters or 6)
    assert np.abs(expected).max() > 0.5
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=0)


def test_block_config_round_trip(rng):
    block = MobileViTBlock(16, 1, attention={"name": "linformer", "projected_tokens": 4},
                           num_heads=2, mlp_ratio=3.0, patch_size=2, name="mvb")
    x = rng.normal(size=(1, 8, 8, 12)).astype("float32")
    y = to_numpy(block(x))
    clone = MobileViTBlock.from_config(block.get_config())
    clone(x)
    clone.set_weights(block.get_weights())
    np.testing.assert_array_equal(to_numpy(clone(x)), y)
    assert keras.saving.get_registered_name(MobileViTBlock) == "keras_mvit2>MobileViTBlock"
    assert clone.transformer[0].attn.num_heads == 2
    assert clone.transformer[0].attn.num_tokens == 16  # linformer: 4x4 patches


# ---------------------------------------------------------------- timm sizes, registry


@pytest.mark.parametrize("name", sorted(TIMM_PARAMS))
def test_parameter_counts_equal_timm(name):
    model = mv.create_model(name)
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    assert trainable == TIMM_PARAMS[name]
    assert model.name == name and model.input_shape == (None, 256, 256, 3)


def test_variants_and_backbone():
    assert MOBILEVIT_CONFIGS["xxs"].expansion == 2.0
    assert MOBILEVIT_CONFIGS["s"].expansion == 4.0
    features = MobileViT("xxs", include_top=False)
    assert features.output_shape == (None, 8, 8, 320)
    assert features.get_layer("stage4_block1").output.shape == (None, 8, 8, 80)
    pooled = MobileViT("xxs", include_top=False, pooling="avg", input_shape=(96, 96, 3))
    assert pooled.output_shape == (None, 320)
    custom = MobileViTConfig(8, (8, 16, 24, 32, 40), (16, 24, 32), 64, expansion=2.0,
                             transformer_depths=(1, 1, 1), stage1_depth=1)
    model = MobileViT(custom, input_shape=(64, 64, 3), classes=3)
    assert model.output_shape == (None, 3) and model.name == "mobilevit"


# ---------------------------------------------------------------- any attention


@pytest.mark.parametrize("name", attention_registry.available())
def test_every_attention_builds_and_runs(name, rng):
    # 96x96: the MobileViT blocks see 12x12, 6x6 and 3x3 (resized to 4x4) feature maps,
    # i.e. 36, 9 and 4 patches (no degenerate single-token attention).
    model = MobileViT("xxs", input_shape=(96, 96, 3), attention=name, classes=4,
                      classifier_activation=None)
    attn = model.get_layer("stage2_block1").transformer[0].attn
    assert type(attn) is type(attention_registry.get(name))
    if "num_heads" in attn.get_config():
        assert attn.num_heads == 4
    x = rng.uniform(size=(2, 96, 96, 3)).astype("float32")
    y = to_numpy(model(x))
    assert y.shape == (2, 4) and np.isfinite(y).all()
    assert np.abs(y[0] - y[1]).max() > 1e-4


def test_keras_round_trip(tmp_path, rng):
    model = MobileViT("xxs", input_shape=(64, 64, 3), classes=6, name="v1_small")
    randomize(model, seed=5, scale=0.05)
    x = rng.uniform(size=(2, 64, 64, 3)).astype("float32")
    path = str(tmp_path / "v1.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(to_numpy(loaded(x)), to_numpy(model(x)))
    assert isinstance(loaded.get_layer("stage3_block1"), MobileViTBlock)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(variant="xxxl"), "variant must be one of"),
        (dict(input_shape=(16, 16, 3)), "at least 32x32"),
        (dict(input_shape=(None, None, None)), "known number of channels"),
        (dict(include_top=False, pooling="mean"), "pooling must be None"),
        (dict(attention="nope"), "Unknown attention"),
        (dict(weights="imagenet"), "publishes weights for MobileViTv2 only"),
        (dict(classes=0), "classes must be positive"),
    ],
)
def test_invalid_arguments(kwargs, match):
    kwargs = dict(kwargs)
    variant = kwargs.pop("variant", "xxs")
    kwargs.setdefault("input_shape", (64, 64, 3))
    with pytest.raises(ValueError, match=match):
        MobileViT(variant, **kwargs)


def test_invalid_block_arguments():
    with pytest.raises(ValueError, match="Received"):
        MobileViTBlock(0, 2)
    with pytest.raises(ValueError, match="Received"):
        MobileViTBlock(8, 1, filters=-1)
    with pytest.raises(ValueError, match="Received"):
        MobileViTBlock(8, 1)(np.zeros((1, 8, 8), "float32"))
    with pytest.raises(FileNotFoundError):
        MobileViT("xxs", input_shape=(64, 64, 3), weights="/nonexistent/mobilevit_xxs.pth")


# ---------------------------------------------------------------- port checks (no torch)


def test_port_is_strict(rng):
    model = MobileViT("xxs", input_shape=(64, 64, 3), classes=10)
    targets, family = timm_port_targets(model)
    assert family == "mobilevit"
    state = {k: rng.normal(size=t.torch_shape).astype("float32") for k, t in targets.items()}
    assert {"stem.conv.weight", "stages.1.2.conv2_kxk.conv.weight",
            "stages.2.1.transformer.1.attn.qkv.bias", "stages.4.1.conv_fusion.bn.running_var",
            "final_conv.bn.weight", "head.fc.weight"} <= set(state)
    state["stages.2.1.conv_kxk.bn.running_var"] = rng.uniform(0.5, 1.5, 48).astype("float32")
    load_timm_weights(model, state)
    np.testing.assert_array_equal(
        to_numpy(model.get_layer("stage2_block1").conv_kxk.kernel),
        state["stages.2.1.conv_kxk.conv.weight"].transpose(2, 3, 1, 0))

    bad = dict(state, **{"stages.3.1.conv_1x1.weight": np.zeros((80, 63, 1, 1), "float32")})
    with pytest.raises(ValueError, match=r"'stages\.3\.1\.conv_1x1\.weight': torch shape "
                                         r"\(80, 63, 1, 1\)[\s\S]*\(1, 1, 64, 80\)"):
        load_timm_weights(model, bad)
    with pytest.raises(ValueError, match="attention='mha'"):
        load_timm_weights(MobileViT("xxs", input_shape=(64, 64, 3), attention="rfa"), state)
    with pytest.raises(ValueError, match="neither"):
        load_timm_weights(mv.MobileViTV2(0.5, input_shape=(64, 64, 3)), state)


# ---------------------------------------------------------------- timm oracle (torch)

@pytest.fixture(scope="module")
def timm_xxs(timm_oracle_v1_dir):
    """The run's MobileViT v1 / DeiT oracle (conftest.py's `timm_oracle_v1_dir`: mobilevit_xxs
    at 256x256 and 224x224 among others) and its manifest."""
    manifest = json.loads((timm_oracle_v1_dir / "manifest.json").read_text())
    return timm_oracle_v1_dir, manifest


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.skipif(not TORCH_READY, reason="needs torch, timm and safetensors")
@pytest.mark.parametrize("size", [256, 224], ids=["256", "224-resized"])
def test_mobilevit_xxs_matches_timm_logits(timm_xxs, size):
    # 224: the last MobileViT block sees 7x7, resized to 8x8 and back (bilinear) as timm.
    out_dir, manifest = timm_xxs
    ref = np.load(out_dir / "mobilevit_xxs.npz")
    weights = str(out_dir / "mobilevit_xxs.safetensors")
    model = MobileViT("xxs", input_shape=(size, size, 3), weights=weights,
                      classifier_activation=None)
    tag = f"{size}x{size}"
    expected = ref[f"logits_{tag}"]
    logits = to_numpy(model(ref[f"x_{tag}"]))
    assert np.abs(expected).max() > 0.5  # O(1) logits: the tolerance is meaningful
    assert np.abs(logits - expected).max() <= 1e-4
    assert manifest["models"]["mobilevit_xxs"]["max_abs_logit"][tag] == pytest.approx(
        float(np.abs(expected).max()))


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.skipif(not TORCH_READY, reason="needs torch, timm and safetensors")
def test_xxs_checkpoint_into_xs_names_the_tensor(timm_xxs):
    out_dir, _ = timm_xxs
    weights = str(out_dir / "mobilevit_xxs.safetensors")
    with pytest.raises(ValueError, match=r"'stages\.0\.0\.conv1_1x1\.conv\.weight': torch shape "
                                         r"\(32, 16, 1, 1\)"):
        MobileViT("xs", input_shape=(64, 64, 3), weights=weights)
