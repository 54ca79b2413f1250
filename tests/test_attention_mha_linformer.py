"""MultiHeadSelfAttention and LinformerSelfAttention against numpy transcriptions of their
formulas (ViT eq. 5-8; Linformer), keras.layers.MultiHeadAttention, timm's Attention, and
their cost, export and registry contracts."""

import importlib.util
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_mvit2
from keras_mvit2.layers import attention_registry
from keras_mvit2.layers.linformer_attention import LinformerSelfAttention
from keras_mvit2.layers.multi_head_attention import MultiHeadSelfAttention
from keras_mvit2.layers.transformer_layer import TransformerLayer

HERE = os.path.dirname(os.path.abspath(__file__))
HAS_TIMM = all(importlib.util.find_spec(name) is not None for name in ("torch", "timm"))

# ---------------------------------------------------------------- numpy oracles


def np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def np_msa(z, u_qkv, b_qkv, u_msa, b_msa, heads):
    """ViT eq. (5)-(8) for one sequence batch z: (B, N, D), one head at a time."""
    d = z.shape[-1]
    dh = d // heads
    qkv = z @ u_qkv + b_qkv                                    # (5)
    q, k, v = qkv[..., :d], qkv[..., d : 2 * d], qkv[..., 2 * d :]
    outs = []
    for m in range(heads):
        sl = slice(m * dh, (m + 1) * dh)
        a = np_softmax(q[..., sl] @ np.swapaxes(k[..., sl], 1, 2) / np.sqrt(dh))  # (6)
        outs.append(a @ v[..., sl])                            # (7)
    return np.concatenate(outs, axis=-1) @ u_msa + b_msa       # (8)


def np_linformer(z, u_qkv, b_qkv, e, f, u_out, b_out, heads):
    """head_m = softmax(q_m (E k_m)^T / sqrt(d_h)) (F v_m); E, F: (p, N); z: (B, N, D)."""
    d = z.shape[-1]
    dh = d // heads
    qkv = z @ u_qkv + b_qkv
    q, k, v = qkv[..., :d], qkv[..., d : 2 * d], qkv[..., 2 * d :]
    k_proj = np.einsum("pn,bnc->bpc", e, k)                    # (B, p, D)
    v_proj = np.einsum("pn,bnc->bpc", f, v)
    outs = []
    for m in range(heads):
        sl = slice(m * dh, (m + 1) * dh)
        a = np_softmax(q[..., sl] @ np.swapaxes(k_proj[..., sl], 1, 2) / np.sqrt(dh))  # (B,N,p)
        outs.append(a @ v_proj[..., sl])
    return np.concatenate(outs, axis=-1) @ u_out + b_out


def per_pixel(oracle, x, *args, **kwargs):
    """The MobileViT layout (B, N, P, D): the oracle on the N patches of each pixel p."""
    if x.ndim == 3:
        return oracle(x, *args, **kwargs)
    return np.stack([oracle(x[:, :, p], *args, **kwargs) for p in range(x.shape[2])], axis=2)


def np_group_norm1(x, gamma, beta, eps=1e-5):
    axes = tuple(range(1, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def to_np(x):
    return keras.ops.convert_to_numpy(x)


def randomize(layer, seed=1, scale=0.3):
    rng = np.random.default_rng(seed)
    for w in layer.weights:
        w.assign(rng.normal(0.0, scale, w.shape).astype("float32"))


def mha_weights(layer):
    return (to_np(layer.qkv.kernel), to_np(layer.qkv.bias),
            to_np(layer.proj.kernel), to_np(layer.proj.bias))


def linformer_weights(layer):
    return (to_np(layer.qkv.kernel), to_np(layer.qkv.bias), to_np(layer.e), to_np(layer.f),
            to_np(layer.proj.kernel), to_np(layer.proj.bias))


# ---------------------------------------------------------------- MultiHeadSelfAttention


@pytest.mark.parametrize("heads", [1, 2, 4])
@pytest.mark.parametrize("shape", [(2, 10, 16), (2, 9, 4, 16)])
def test_mha_matches_vit_eq5_to_8(shape, heads, rng):
    x = rng.normal(size=shape).astype("float32")
    layer = MultiHeadSelfAttention(num_heads=heads)
    layer.build(shape)
    randomize(layer)
    got = to_np(layer(x))
    want = per_pixel(np_msa, x, *mha_weights(layer), heads)
    assert got.shape == shape
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)


def test_mha_weight_layout_is_timm_like():
    layer = MultiHeadSelfAttention(num_heads=4, qkv_bias=False)
    layer.build((None, 7, 32))
    assert isinstance(layer.qkv, keras.layers.EinsumDense)
    assert tuple(layer.qkv.kernel.shape) == (32, 96) and layer.qkv.bias is None
    assert tuple(layer.proj.kernel.shape) == (32, 32) and tuple(layer.proj.bias.shape) == (32,)
    assert [w.path.split("/", 1)[1] for w in layer.weights] == [
        "qkv/kernel", "proj/kernel", "proj/bias"]


def test_mha_matches_keras_multi_head_attention(rng):
    dim, heads, n = 24, 3, 11
    hd = dim // heads
    x = rng.normal(size=(2, n, dim)).astype("float32")
    ours = MultiHeadSelfAttention(num_heads=heads)
    ours.build(x.shape)
    randomize(ours, seed=3)
    w_qkv, b_qkv, w_o, b_o = mha_weights(ours)
    ref = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=hd)
    ref(x, x)
    weights = []
    for i in range(3):  # query, key, value
        weights += [w_qkv[:, i * dim : (i + 1) * dim].reshape(dim, heads, hd),
                    b_qkv[i * dim : (i + 1) * dim].reshape(heads, hd)]
    weights += [w_o.reshape(heads, hd, dim), b_o]
    ref.set_weights(weights)
    got, want = to_np(ours(x)), to_np(ref(x, x))
    print(f"MHA vs keras.layers.MultiHeadAttention: max|diff| = {np.abs(got - want).max():.2e}")
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


_TIMM_SCRIPT = r"""
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from torch_oracle import install_torchvision_stub
install_torchvision_stub()
import torch
from timm.models.vision_transformer import Attention
data = dict(np.load(sys.argv[2]))
dim = data["x"].shape[-1]
attn = Attention(dim, num_heads=int(data["heads"]), qkv_bias=True).eval()
attn.load_state_dict({k: torch.from_numpy(data[k]) for k in
                      ("qkv.weight", "qkv.bias", "proj.weight", "proj.bias")})
with torch.no_grad():
    np.save(sys.argv[3], attn(torch.from_numpy(data["x"])).numpy())
"""


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.skipif(not HAS_TIMM, reason="needs torch and timm")
def test_mha_ports_timm_attention_by_transposition(tmp_path, rng):
    """timm's `attn.qkv.weight` (3D, D) and `attn.proj.weight` (D, D), transposed into our
    kernels, give timm's output: [q | k | v] ordering and head-major split agree.
    timm runs in a subprocess (torch and TensorFlow do not share a process here)."""
    dim, heads, n = 32, 4, 9
    x = rng.normal(size=(2, n, dim)).astype("float32")
    torch_weights = {
        "qkv.weight": rng.normal(0, 0.3, (3 * dim, dim)).astype("float32"),
        "qkv.bias": rng.normal(0, 0.3, (3 * dim,)).astype("float32"),
        "proj.weight": rng.normal(0, 0.3, (dim, dim)).astype("float32"),
        "proj.bias": rng.normal(0, 0.3, (dim,)).astype("float32"),
    }
    np.savez(tmp_path / "in.npz", x=x, heads=heads, **torch_weights)
    subprocess.run(
        [sys.executable, "-c", _TIMM_SCRIPT, HERE, str(tmp_path / "in.npz"),
         str(tmp_path / "out.npy")],
        check=True,
    )
    want = np.load(tmp_path / "out.npy")
    ours = MultiHeadSelfAttention(num_heads=heads)
    ours.build(x.shape)
    ours.qkv.kernel.assign(torch_weights["qkv.weight"].T)
    ours.qkv.bias.assign(torch_weights["qkv.bias"])
    ours.proj.kernel.assign(torch_weights["proj.weight"].T)
    ours.proj.bias.assign(torch_weights["proj.bias"])
    got = to_np(ours(x))
    print(f"MHA vs timm Attention: max|diff| = {np.abs(got - want).max():.2e}")
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_mha_dropouts_only_in_training(rng):
    x = rng.normal(size=(2, 12, 16)).astype("float32")
    for kwargs in ({"attn_dropout": 0.5}, {"proj_dropout": 0.5}):
        layer = MultiHeadSelfAttention(num_heads=2, **kwargs)
        a, b = to_np(layer(x, training=False)), to_np(layer(x, training=False))
        c = to_np(layer(x, training=True))
        np.testing.assert_array_equal(a, b)
        assert np.abs(a - c).max() > 1e-3


def test_mha_invalid_args():
    with pytest.raises(ValueError, match="Received: num_heads=0"):
        MultiHeadSelfAttention(num_heads=0)
    with pytest.raises(ValueError, match=re.escape("Received: num_heads=2.0")):
        MultiHeadSelfAttention(num_heads=2.0)
    with pytest.raises(ValueError, match=re.escape("Received: attn_dropout=1.0")):
        MultiHeadSelfAttention(attn_dropout=1.0)
    with pytest.raises(ValueError, match=re.escape("Received: proj_dropout=-0.1")):
        MultiHeadSelfAttention(proj_dropout=-0.1)
    message = "divisible by num_heads. Received: dim=30, num_heads=4"
    with pytest.raises(ValueError, match=re.escape(message)):
        MultiHeadSelfAttention(num_heads=4).build((None, 8, 30))
    with pytest.raises(ValueError, match="Received: input_shape"):
        MultiHeadSelfAttention().build((2, 8))


def test_mha_accepts_a_dynamic_token_count(rng):
    inputs = keras.Input((None, 16))
    model = keras.Model(inputs, MultiHeadSelfAttention(num_heads=2)(inputs))
    layer = model.layers[-1]
    for n in (3, 7):
        x = rng.normal(size=(2, n, 16)).astype("float32")
        np.testing.assert_allclose(
            to_np(model(x)), np_msa(x, *mha_weights(layer), 2), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- LinformerSelfAttention


@pytest.mark.parametrize("forms", ["KERAS", "INT8"])
@pytest.mark.parametrize(
    "shape,p,share_kv",
    # E k and F v first (k (H p + D) >= 2 p D) in the first three, (q k^T) E^T and
    # (A F) v in the last two (few tokens); the last two: p > N, allowed (see the docstring)
    [((2, 12, 16), 5, False), ((2, 12, 16), 5, True), ((2, 10, 3, 16), 4, False),
     ((2, 6, 16), 9, False), ((2, 3, 2, 16), 12, True)],
)
def test_linformer_matches_numpy(shape, p, share_kv, forms, rng):
    from keras_mvit2.layers import export_forms

    x = rng.normal(size=shape).astype("float32")
    layer = LinformerSelfAttention(num_heads=2, projected_tokens=p, share_kv=share_kv)
    layer.build(shape)
    randomize(layer)
    w = linformer_weights(layer)
    assert w[2].shape == (p, shape[1])
    if share_kv:
        np.testing.assert_array_equal(w[2], w[3])
    with export_forms.tracing(getattr(export_forms, forms)):
        got = to_np(layer(x))
    want = per_pixel(np_linformer, x, *w, 2)
    assert got.shape == shape
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)


def test_linformer_with_identity_projections_is_mha(rng):
    """E = F = I (p = N) turns Linformer into plain multi-head attention."""
    n, dim = 8, 16
    x = rng.normal(size=(2, n, dim)).astype("float32")
    lin = LinformerSelfAttention(num_heads=4, projected_tokens=n)
    lin.build(x.shape)
    randomize(lin)
    lin.e.assign(np.eye(n, dtype="float32"))
    lin.f.assign(np.eye(n, dtype="float32"))
    mha = MultiHeadSelfAttention(num_heads=4)
    mha.build(x.shape)
    for ours, theirs in ((mha.qkv, lin.qkv), (mha.proj, lin.proj)):
        ours.set_weights(theirs.get_weights())
    np.testing.assert_allclose(to_np(lin(x)), to_np(mha(x)), atol=1e-5, rtol=1e-5)


def test_linformer_weights_and_init():
    layer = LinformerSelfAttention(num_heads=4, projected_tokens=16)
    layer.build((None, 64, 32))
    assert sorted(w.path.split("/", 1)[1] for w in layer.weights) == [
        "E", "F", "proj/bias", "proj/kernel", "qkv/bias", "qkv/kernel"]
    e = to_np(layer.e)
    bound = np.sqrt(6.0 / (64 + 16)) / np.sqrt(2.0)  # fairseq: xavier_uniform, gain 1/sqrt(2)
    assert np.abs(e).max() <= bound and np.abs(e).max() > 0.9 * bound
    assert not np.allclose(e, to_np(layer.f))
    shared = LinformerSelfAttention(num_heads=4, projected_tokens=16, share_kv=True)
    shared.build((None, 64, 32))
    assert len(shared.weights) == 5 and shared.f is shared.e


@pytest.mark.parametrize("built,called", [((2, 16, 16), (2, 12, 16)),
                                          ((2, 16, 4, 16), (2, 20, 4, 16))])
def test_linformer_needs_a_fixed_token_count(built, called, rng):
    layer = LinformerSelfAttention(num_heads=2, projected_tokens=4)
    layer(rng.normal(size=built).astype("float32"))
    x = rng.normal(size=called).astype("float32")
    with pytest.raises(ValueError, match="needs a fixed token count k") as err:
        layer(x)
    message = str(err.value)
    assert f"has {called[1]} tokens" in message and "k=16" in message
    assert "Rebuild the layer" in message and "Received: num_tokens" in message


def test_linformer_rejects_an_unknown_token_count_at_build():
    with pytest.raises(ValueError, match=r"fixed number of tokens(.|\n)*Received: token shape"):
        LinformerSelfAttention()(keras.Input((None, 16)))


def test_linformer_invalid_args():
    with pytest.raises(ValueError, match="Received: projected_tokens=0"):
        LinformerSelfAttention(projected_tokens=0)
    with pytest.raises(ValueError, match="Received: projected_tokens=True"):
        LinformerSelfAttention(projected_tokens=True)
    with pytest.raises(ValueError, match="Received: num_heads=-1"):
        LinformerSelfAttention(num_heads=-1)
    with pytest.raises(ValueError, match=re.escape("Received: attn_dropout=1.5")):
        LinformerSelfAttention(attn_dropout=1.5)
    with pytest.raises(ValueError, match=re.escape("Received: dim=18, num_heads=4")):
        LinformerSelfAttention(num_heads=4).build((None, 8, 18))


def test_linformer_dropout_only_in_training(rng):
    x = rng.normal(size=(2, 12, 16)).astype("float32")
    layer = LinformerSelfAttention(num_heads=2, projected_tokens=4, attn_dropout=0.5)
    a, b = to_np(layer(x, training=False)), to_np(layer(x, training=False))
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - to_np(layer(x, training=True))).max() > 1e-3


def _graph_shapes(layer, shape):
    """Static shapes of every op output of the traced call graph."""
    fn = tf.function(lambda x: layer(x))
    graph = fn.get_concrete_function(tf.TensorSpec(shape, tf.float32)).graph
    return [tuple(t.shape.as_list()) for op in graph.get_operations() for t in op.outputs
            if t.shape.rank is not None]


@pytest.mark.parametrize("n,p,token_first", [(23, 6, False), (6, 9, True), (2, 12, True)])
def test_linformer_takes_the_association_with_fewer_products(n, p, token_first):
    """Few tokens (k (H p + D) < 2 p D multiply-adds) go through a (B, H, k, k) matrix,
    (q k^T) E^T and (A F) v; more through the projected (B, p, D) keys and values."""
    batch, heads, dim = 2, 2, 16
    assert (n * 2 * (dim + heads * p) < 4 * p * dim) == token_first
    lin = LinformerSelfAttention(num_heads=heads, projected_tokens=p)
    lin.build((batch, n, dim))
    shapes = _graph_shapes(lin, (batch, n, dim))
    assert ((batch, heads, n, n) in shapes) == token_first
    assert ((batch, p, dim) in shapes) != token_first


def test_linformer_graph_has_no_n_by_n_tensor():
    """Every op output of the call graph: no tensor has two axes of size N (p < N);
    the attention matrix is (B, H, N, p). The same scan finds (B, H, N, N) in MHA."""
    n, p, batch, heads, dim = 23, 6, 2, 4, 32
    lin = LinformerSelfAttention(num_heads=heads, projected_tokens=p)
    lin.build((batch, n, dim))
    shapes = _graph_shapes(lin, (batch, n, dim))
    assert (batch, heads, n, p) in shapes
    assert not [s for s in shapes if s.count(n) >= 2], "an N x N tensor in Linformer's graph"
    mha = MultiHeadSelfAttention(num_heads=heads)
    mha.build((batch, n, dim))
    assert (batch, heads, n, n) in _graph_shapes(mha, (batch, n, dim))


# ---------------------------------------------------------------- shared contracts


LAYERS = [
    (MultiHeadSelfAttention, {"num_heads": 2, "qkv_bias": False, "attn_dropout": 0.1,
                              "proj_dropout": 0.2}),
    (LinformerSelfAttention, {"num_heads": 2, "projected_tokens": 5, "qkv_bias": False,
                              "share_kv": True, "attn_dropout": 0.1}),
]


@pytest.mark.parametrize("cls,kwargs", LAYERS)
def test_config_round_trip(cls, kwargs, rng):
    x = rng.normal(size=(2, 12, 16)).astype("float32")
    layer = cls(**kwargs)
    y = to_np(layer(x))
    config = layer.get_config()
    for key, value in kwargs.items():
        assert config[key] == value
    clone = cls.from_config(config)
    clone.build(x.shape)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(to_np(clone(x)), y)
    assert keras.saving.get_registered_name(cls).startswith("keras_mvit2>")


@pytest.mark.parametrize("cls,kwargs", LAYERS)
def test_keras_file_round_trip(cls, kwargs, tmp_path, rng):
    x = rng.normal(size=(2, 12, 4, 16)).astype("float32")
    inputs = keras.Input(x.shape[1:])
    model = keras.Model(inputs, cls(**kwargs)(inputs))
    randomize(model)
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert type(loaded.layers[-1]) is cls
    np.testing.assert_array_equal(to_np(loaded(x)), to_np(model(x)))


def test_registry_names():
    for name in ("mha", "multi_head", "transformer", "Multi-Head"):
        assert type(attention_registry.get(name)) is MultiHeadSelfAttention
    layer = attention_registry.get({"name": "linformer", "projected_tokens": 8}, num_heads=2)
    assert type(layer) is LinformerSelfAttention
    assert (layer.projected_tokens, layer.num_heads) == (8, 2)
    assert {"mha", "linformer"} <= set(attention_registry.available())


@pytest.mark.parametrize("name", ["mha", "linformer"])
def test_inside_transformer_layer_matches_numpy(name, rng):
    shape = (2, 9, 4, 16)
    x = rng.normal(size=shape).astype("float32")
    config = {"name": name, "num_heads": 2}
    if name == "linformer":
        config["projected_tokens"] = 4
    layer = TransformerLayer(attention=config)
    layer.build(shape)
    randomize(layer, scale=0.2)
    got = to_np(layer(x))

    def gn(norm, t):
        return np_group_norm1(t, to_np(norm.gamma), to_np(norm.beta))

    def conv(c):
        w = to_np(c.kernel)
        return w.reshape(w.shape[-2], w.shape[-1]), to_np(c.bias)

    if name == "mha":
        assert type(layer.attn) is MultiHeadSelfAttention
        h = x + per_pixel(np_msa, gn(layer.norm1, x), *mha_weights(layer.attn), 2)
    else:
        assert type(layer.attn) is LinformerSelfAttention
        h = x + per_pixel(np_linformer, gn(layer.norm1, x), *linformer_weights(layer.attn), 2)
    (w1, b1), (w2, b2) = conv(layer.fc1), conv(layer.fc2)
    u = gn(layer.norm2, h) @ w1 + b1
    want = h + (u / (1.0 + np.exp(-u))) @ w2 + b2
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    assert TransformerLayer(attention=name, attn_dropout=0.1).get_config()["attention"] == name


@pytest.mark.parametrize(
    "attn,cls", [("mha", MultiHeadSelfAttention),
                 ({"name": "linformer", "projected_tokens": 8}, LinformerSelfAttention)])
def test_inside_mobilevitv2(attn, cls, rng):
    model = keras_mvit2.MobileViTV2(0.5, input_shape=(64, 64, 3), attention=attn)
    mixers = [layer for layer in model._flatten_layers() if isinstance(layer, cls)]
    assert len(mixers) == 2 + 4 + 3  # transformer layers of stages 3, 4, 5 of MobileViTv2-0.5
    if cls is LinformerSelfAttention:
        # k per block = patches of its 8x8 / 4x4 / 2x2 map; p = 8 >= k is allowed there
        assert sorted({m.num_tokens for m in mixers}) == [1, 4, 16]
    x = rng.uniform(size=(2, 64, 64, 3)).astype("float32")
    y = to_np(model(x, training=False))
    assert y.shape == (2, 1000) and np.isfinite(y).all()


@pytest.mark.parametrize("cls,kwargs", LAYERS)
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_close_to_float32(cls, kwargs, policy, rng):
    x = rng.normal(size=(2, 12, 4, 16)).astype("float32")
    ref = cls(**kwargs)
    want = to_np(ref(x))
    layer = cls(dtype=policy, **kwargs)
    layer.build(x.shape)
    layer.set_weights(ref.get_weights())
    got = layer(x)
    assert keras.backend.standardize_dtype(got.dtype) == policy.split("_")[1]
    assert all(w.dtype == "float32" for w in layer.weights)
    # bfloat16 keeps 8 significant bits: besides the absolute 2e-2, two units of its last
    # bit (2**-6 relative). Without oneDNN (a CPU without AVX-512) TensorFlow's bfloat16
    # kernels round differently: 0.024 off at an output of 1.34 in one element of 1,536.
    np.testing.assert_allclose(to_np(keras.ops.cast(got, "float32")), want, atol=2e-2,
                               rtol=2.0 ** -6 if policy == "mixed_bfloat16" else 0.0)


# ---------------------------------------------------------------- export


@pytest.mark.parametrize(
    "cls,kwargs,shape",
    [(MultiHeadSelfAttention, {}, (20, 32)),
     (MultiHeadSelfAttention, {}, (20, 4, 32)),
     (LinformerSelfAttention, {"projected_tokens": 6}, (20, 32)),
     (LinformerSelfAttention, {"projected_tokens": 6, "share_kv": True}, (20, 4, 32))],
)
def test_tflite_builtins_only(cls, kwargs, shape, tmp_path, rng):
    from ai_edge_litert.interpreter import Interpreter

    from keras_mvit2.export import run_tflite, to_tflite

    inputs = keras.Input(shape)
    model = keras.Model(inputs, cls(num_heads=4, **kwargs)(inputs))
    randomize(model, scale=0.2)
    path = tmp_path / "m.tflite"
    report = to_tflite(model, path)
    x = rng.normal(size=(2, *shape)).astype("float32")
    want = to_np(model(x))
    diff = np.abs(run_tflite(path, x) - want).max()
    print(f"{cls.__name__} {shape}: {report.op_histogram}, max|diff| = {diff:.2e} "
          f"(|y| <= {np.abs(want).max():.2f})")
    assert report.flex_ops == [] and report.custom_ops == []
    assert report.max_tensor_rank <= 4
    assert diff <= 1e-5 * max(1.0, np.abs(want).max())
    assert report.op_histogram.get("SOFTMAX") == 1
    n = shape[0]
    tensor_shapes = [tuple(t["shape"]) for t in Interpreter(model_path=str(path))
                     .get_tensor_details()]
    n_by_n = [s for s in tensor_shapes if list(s).count(n) >= 2]
    if cls is LinformerSelfAttention:
        assert not n_by_n, f"N x N tensors in the converted Linformer: {n_by_n}"
    else:
        assert n_by_n  # the quadratic attention matrix is there
