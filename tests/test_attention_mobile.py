"""MobileAttention (Yao et al., ICML 2024) against a numpy transcription of the authors' code.

The oracle below is written from attention-variants.md §2.3 / §2.10, i.e. from
`thuml/MobileAttention:Mobile_Attention.py` (commit a156599): flows between the
heads of one token, conservation, competition softmax over tokens times N,
sigmoid allocation, head-flow value normaliser. It computes the flows token by
token and the token mixing through the explicit N x N matrix `phi(Q) phi(K)^T`,
so it shares no code path (and not the linear factorisation) with the layer.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_mvit2
from keras_mvit2.layers import attention_registry
from keras_mvit2.layers.mobile_attention import MobileAttention
from keras_mvit2.layers.transformer_layer import TransformerLayer

# ---------------------------------------------------------------- numpy oracle


def np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_mobile_attention(x, w_qkv, b_qkv, w_out, b_out, heads, eps=1e-6, normalizer="head_flow"):
    """The official forward pass for tokens x `(B, N, D)`, in float64.

    Returns the output `(B, N, D)` and the flows, each `(B, M, N)`.
    """
    x = x.astype(np.float64)
    b_, n, dim = x.shape
    d = dim // heads
    qkv = x @ w_qkv.astype(np.float64) + (0.0 if b_qkv is None else b_qkv.astype(np.float64))
    q, k, v = qkv[..., :dim], qkv[..., dim : 2 * dim], qkv[..., 2 * dim :]
    # .view(B, N, M, d).transpose(1, 2): head h holds channels h*d .. (h+1)*d - 1
    q, k, v = (t.reshape(b_, n, heads, d).transpose(0, 2, 1, 3) for t in (q, k, v))
    q, k = np_sigmoid(q), np_sigmoid(k)

    inc, out, inc_c, out_c = (np.zeros((b_, heads, n)) for _ in range(4))
    for b in range(b_):
        for t in range(n):
            qt, kt = q[b, :, t, :], k[b, :, t, :]                  # (M, d): the heads of token t
            inc[b, :, t] = (qt + eps) @ (kt.sum(0) + eps)          # I_t^h
            out[b, :, t] = (kt + eps) @ (qt.sum(0) + eps)          # O_t^h
            inc_c[b, :, t] = (qt + eps) @ ((kt / out[b, :, t, None]).sum(0) + eps)  # Ī_t^h
            out_c[b, :, t] = (kt + eps) @ ((qt / inc[b, :, t, None]).sum(0) + eps)  # Ō_t^h
    clipped = np.clip(out_c, -1.0, 1.0)
    e = np.exp(clipped - clipped.max(-1, keepdims=True))
    competition = n * e / e.sum(-1, keepdims=True)                 # softmax over tokens, x N_k
    allocation = np_sigmoid(inc_c * (n / n))                       # N_q / N_k

    y = np.zeros((b_, heads, n, d))
    for b in range(b_):
        for h in range(heads):
            scores = q[b, h] @ k[b, h].T                           # (N, N): phi(Q_t) . phi(K_j)
            if normalizer == "head_flow":
                z = inc[b, h]                                      # the official code
            else:                                                  # Flowformer's token normaliser
                z = (q[b, h] + eps) @ (k[b, h].sum(0) + eps)
            y[b, h] = allocation[b, h, :, None] * (
                scores @ (competition[b, h, :, None] * v[b, h])
            ) / z[:, None]
    y = y.transpose(0, 2, 1, 3).reshape(b_, n, dim)
    flows = {
        "incoming": inc,
        "outgoing": out,
        "conserved_incoming": inc_c,
        "conserved_outgoing": out_c,
        "competition": competition,
        "allocation": allocation,
    }
    return y @ w_out.astype(np.float64) + b_out.astype(np.float64), flows


def np_mobile_attention_4d(x, *args, **kwargs):
    """MobileViT layout `(B, N, P, D)`: attention over the N patches for each pixel p."""
    return np.stack(
        [np_mobile_attention(x[:, :, p, :], *args, **kwargs)[0] for p in range(x.shape[2])],
        axis=2,
    )


# ---------------------------------------------------------------- helpers


def _randomize(layer, seed=1, scale=0.3):
    rng = np.random.default_rng(seed)
    for w in layer.weights:
        w.assign(rng.normal(0.0, scale, w.shape).astype("float32"))


def _weights(layer):
    w = lambda t: None if t is None else keras.ops.convert_to_numpy(t)  # noqa: E731
    return w(layer.qkv.kernel), w(layer.qkv.bias), w(layer.proj.kernel), w(layer.proj.bias)


def _np(x):
    return keras.ops.convert_to_numpy(x)


def _rel_err(got, want):
    return np.abs(got - want).max() / np.sqrt(np.mean(want**2))


# ---------------------------------------------------------------- oracle tests


@pytest.mark.parametrize("normalizer", ["head_flow", "tokens"])
@pytest.mark.parametrize("qkv_bias, eps", [(True, 1e-6), (False, 1e-6), (True, 0.05)])
def test_matches_numpy_oracle_tokens(normalizer, qkv_bias, eps, rng):
    """eps = 0.05 makes the eps placement visible (at 1e-6 it is below float32 noise)."""
    x = rng.normal(size=(2, 16, 32)).astype("float32")
    layer = MobileAttention(num_heads=4, normalizer=normalizer, qkv_bias=qkv_bias, eps=eps)
    layer.build(x.shape)
    _randomize(layer)
    want, _ = np_mobile_attention(x, *_weights(layer), heads=4, eps=eps, normalizer=normalizer)
    got = _np(layer(x))
    assert got.shape == x.shape
    assert _rel_err(got, want) < 2e-6, _rel_err(got, want)


@pytest.mark.parametrize("normalizer", ["head_flow", "tokens"])
def test_matches_numpy_oracle_mobilevit_layout(normalizer, rng):
    x = rng.normal(size=(2, 16, 4, 24)).astype("float32")        # (B, patches, pixels, D)
    layer = MobileAttention(num_heads=3, normalizer=normalizer)
    layer.build(x.shape)
    _randomize(layer, seed=2)
    want = np_mobile_attention_4d(x, *_weights(layer), heads=3, normalizer=normalizer)
    got = _np(layer(x))
    assert got.shape == x.shape
    assert _rel_err(got, want) < 2e-6, _rel_err(got, want)
    # the pixels are independent attention problems: changing pixel 0 leaves the others
    x2 = x.copy()
    x2[:, :, 0] += 1.0
    got2 = _np(layer(x2))
    np.testing.assert_array_equal(got2[:, :, 1:], got[:, :, 1:])
    assert np.abs(got2[:, :, 0] - got[:, :, 0]).max() > 1e-2


def test_head_flow_output_is_n_over_m_times_the_token_normalised_one():
    """Key finding 3: same weights, the code's head-flow normaliser gives an output
    ~N/M times the Flowformer token normaliser's (it divides an N-token sum by an
    M-head sum), so its scale depends on the resolution."""
    heads, dim = 4, 32
    head_flow = MobileAttention(num_heads=heads)
    tokens = MobileAttention(num_heads=heads, normalizer="tokens")
    for layer in (head_flow, tokens):
        layer.build((1, None, dim))
    _randomize(head_flow, seed=3, scale=0.2)
    head_flow.proj.bias.assign(np.zeros(dim, "float32"))
    tokens.set_weights(head_flow.get_weights())
    for n in (16, 64, 256):
        x = np.random.default_rng(n).normal(size=(2, n, dim)).astype("float32")
        ratio = np.sqrt(np.mean(_np(head_flow(x)) ** 2) / np.mean(_np(tokens(x)) ** 2))
        assert 0.8 < ratio / (n / heads) < 1.25, (n, ratio)


def test_dynamic_token_count(rng):
    layer = MobileAttention(num_heads=2)
    layer.build((None, None, 16))
    _randomize(layer, seed=4)
    fn = tf.function(layer.call, input_signature=[tf.TensorSpec((None, None, 16), tf.float32)])
    for n in (5, 11):
        x = rng.normal(size=(3, n, 16)).astype("float32")
        want, _ = np_mobile_attention(x, *_weights(layer), heads=2)
        got = fn(x).numpy()
        assert _rel_err(got, want) < 2e-6


# ---------------------------------------------------------------- head competition


def test_flows_match_oracle(rng):
    x = rng.normal(size=(2, 12, 32)).astype("float32")
    layer = MobileAttention(num_heads=4)
    layer.build(x.shape)
    _randomize(layer, seed=5)
    _, want = np_mobile_attention(x, *_weights(layer), heads=4)
    got = {key: _np(value) for key, value in layer.flows(x).items()}
    assert set(got) == set(want)
    for key in want:
        assert got[key].shape == (2, 4, 12), key
        np.testing.assert_allclose(got[key], want[key], rtol=2e-5, atol=1e-6, err_msg=key)


def test_flows_mobilevit_layout_fold_pixels_into_batch(rng):
    x = rng.normal(size=(2, 8, 4, 16)).astype("float32")
    layer = MobileAttention(num_heads=2)
    layer.build(x.shape)
    _randomize(layer, seed=6)
    got = _np(layer.flows(x)["conserved_incoming"])
    assert got.shape == (2 * 4, 2, 8)
    for b in range(2):
        for p in range(4):
            _, want = np_mobile_attention(x[b : b + 1, :, p], *_weights(layer), heads=2)
            np.testing.assert_allclose(got[b * 4 + p], want["conserved_incoming"][0], rtol=2e-5)


@pytest.mark.parametrize("heads", [2, 4, 8])
def test_head_competition_conserved_flows_sum_to_num_heads(heads, rng):
    """Σ_h Ī_t^h = M and Σ_h Ō_t^h = M (before the clip) at every token t.

    The heads of one token share a budget of M incoming and M outgoing flow.
    Exact without eps; eps = 1e-6 moves the sums by ~1e-5 (measured), so the
    default-eps check uses 1e-4 and the eps = 1e-12 one float32 precision.
    """
    n, dim = 20, 32
    x = rng.normal(size=(2, n, dim)).astype("float32")
    for eps, atol in ((1e-6, 1e-4), (1e-12, 3e-6)):
        layer = MobileAttention(num_heads=heads, eps=eps)
        layer.build(x.shape)
        _randomize(layer, seed=7)
        flows = {key: _np(value) for key, value in layer.flows(x).items()}
        inc_c, out_c = flows["conserved_incoming"], flows["conserved_outgoing"]
        # not trivially 1 each: the heads really compete (spread of the shares)
        assert inc_c.std(axis=1).mean() > 0.05 and out_c.std(axis=1).mean() > 0.05
        np.testing.assert_allclose(inc_c.sum(axis=1), heads, rtol=0, atol=atol)
        np.testing.assert_allclose(out_c.sum(axis=1), heads, rtol=0, atol=atol)
        # the raw flows do not have this property
        assert np.abs(flows["incoming"].sum(axis=1) - heads).max() > 1.0


def test_competition_sums_to_num_tokens_per_head(rng):
    n = 24
    x = rng.normal(size=(3, n, 32)).astype("float32")
    layer = MobileAttention(num_heads=4)
    layer.build(x.shape)
    _randomize(layer, seed=8)
    flows = {key: _np(value) for key, value in layer.flows(x).items()}
    competition = flows["competition"]
    np.testing.assert_allclose(competition.sum(axis=-1), n, rtol=1e-5)
    assert competition.std(axis=-1).min() > 1e-3                   # the tokens really compete
    clipped = np.minimum(flows["conserved_outgoing"], 1.0)
    e = np.exp(clipped)
    np.testing.assert_allclose(competition, n * e / e.sum(-1, keepdims=True), rtol=1e-5)
    assert (flows["conserved_outgoing"] > 1.0).any()              # the clip is exercised
    np.testing.assert_allclose(
        flows["allocation"], np_sigmoid(flows["conserved_incoming"]), rtol=1e-6
    )


@pytest.mark.parametrize("forms", ["KERAS", "INT8"])
@pytest.mark.parametrize("tokens,heads,token_first", [(5, 2, True), (16, 4, False)])
def test_token_mixing_associations_match_numpy_oracle(tokens, heads, token_first, forms, rng):
    """`(q k^T) (c v)` for fewer tokens than channels per head (N (d + d) < 2 d d
    multiply-adds), `q (k^T (c v))` otherwise, in Keras' and full int8's forms; the oracle
    takes the N x N matrix either way (int8's forms omit the flow epsilon, export_forms (7):
    the oracle's eps is 0 there)."""
    from keras_mvit2.layers import export_forms

    x = rng.normal(size=(2, tokens, 32)).astype("float32")
    layer = MobileAttention(num_heads=heads)
    layer.build(x.shape)
    _randomize(layer, seed=5)
    shapes = [s for _, s in _graph_outputs(layer, x.shape)]
    assert ((2, heads, tokens, tokens) in shapes) == token_first
    want, _ = np_mobile_attention(x, *_weights(layer), heads=heads,
                                  eps=layer.eps if forms == "KERAS" else 0.0)
    with export_forms.tracing(getattr(export_forms, forms)):
        got = _np(layer(x))
    assert _rel_err(got, want) < 2e-6, _rel_err(got, want)


# ---------------------------------------------------------------- linear cost, rank


def _graph_outputs(layer, shape):
    fn = tf.function(lambda t: layer(t, training=False))
    graph = fn.get_concrete_function(tf.TensorSpec(shape, tf.float32)).graph
    return [(op.type, tuple(t.shape.as_list())) for op in graph.get_operations() for t in op.outputs
            if t.shape.rank is not None]


def _has_two_axes_of(shape, n):
    return sum(1 for s in shape if s == n) >= 2


def test_no_n_by_n_tensor_and_rank_at_most_4_in_traced_graph():
    n = 64
    for shape in ((2, n, 32), (1, n, 4, 32)):
        layer = MobileAttention(num_heads=4)                      # d = 8: no other axis is 64
        outputs = _graph_outputs(layer, shape)
        assert len(outputs) > 20
        assert not [o for o in outputs if _has_two_axes_of(o[1], n)]
        assert max(len(s) for _, s in outputs) <= 4
        assert any(t == "BatchMatMulV2" for t, _ in outputs)       # the (d, d) state
    # the same check finds the N x N scores of quadratic attention
    mha = keras.layers.MultiHeadAttention(num_heads=4, key_dim=8)
    quad = tf.function(lambda t: mha(t, t)).get_concrete_function(
        tf.TensorSpec((2, n, 32), tf.float32)).graph
    shapes = [tuple(t.shape.as_list()) for op in quad.get_operations() for t in op.outputs
              if t.shape.rank is not None]
    assert any(_has_two_axes_of(s, n) for s in shapes)


def test_tflite_builtins_no_n_by_n_and_matches_keras(tmp_path, rng):
    from ai_edge_litert.interpreter import Interpreter

    from keras_mvit2.export import to_tflite

    n = 64
    inputs = keras.Input((n, 4, 32), batch_size=1)
    layer = MobileAttention(num_heads=4)
    model = keras.Model(inputs, layer(inputs))
    _randomize(layer, seed=9, scale=0.1)
    report = to_tflite(model, tmp_path / "mobiatt.tflite")
    assert report.flex_ops == [] and report.custom_ops == []
    assert report.max_tensor_rank <= 4
    assert report.op_histogram.get("BATCH_MATMUL") == 2
    interpreter = Interpreter(model_path=str(tmp_path / "mobiatt.tflite"))
    interpreter.allocate_tensors()
    shapes = [tuple(t["shape"]) for t in interpreter.get_tensor_details()]
    assert not [s for s in shapes if _has_two_axes_of(s, n)]
    x = rng.normal(size=(1, n, 4, 32)).astype("float32")
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    got = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    assert _rel_err(got, _np(model(x))) < 1e-5


# ---------------------------------------------------------------- dropout, dtype


def test_dropouts_only_in_training(rng):
    x = rng.normal(size=(2, 16, 32)).astype("float32")
    plain = MobileAttention(num_heads=4)
    plain.build(x.shape)
    _randomize(plain, seed=10)
    for kwargs in ({"attn_dropout": 0.3}, {"proj_dropout": 0.3}):
        layer = MobileAttention(num_heads=4, **kwargs)
        layer.build(x.shape)
        layer.set_weights(plain.get_weights())
        np.testing.assert_array_equal(_np(layer(x)), _np(plain(x)))
        np.testing.assert_array_equal(_np(layer(x, training=False)), _np(plain(x)))
        assert np.abs(_np(layer(x, training=True)) - _np(plain(x))).max() > 1e-3


def test_mixed_precision_flows_in_float32(rng):
    x = rng.normal(size=(2, 16, 32)).astype("float32")
    ref = MobileAttention(num_heads=4)
    ref.build(x.shape)
    _randomize(ref, seed=11, scale=0.1)
    layer = MobileAttention(num_heads=4, dtype="mixed_float16")
    layer.build(x.shape)
    layer.set_weights(ref.get_weights())
    out = layer(x)
    assert keras.backend.standardize_dtype(out.dtype) == "float16"
    assert all(keras.backend.standardize_dtype(v.dtype) == "float32"
               for v in layer.flows(x).values())
    assert _rel_err(_np(out).astype("float32"), _np(ref(x))) < 1e-2


# ---------------------------------------------------------------- config, registry, errors


def test_config_round_trip(rng):
    x = rng.normal(size=(2, 10, 24)).astype("float32")
    layer = MobileAttention(num_heads=3, normalizer="tokens", qkv_bias=False, eps=1e-5,
                            attn_dropout=0.1, proj_dropout=0.05, name="mobi")
    layer.build(x.shape)
    _randomize(layer, seed=12)
    config = layer.get_config()
    for key, value in dict(num_heads=3, normalizer="tokens", qkv_bias=False, eps=1e-5,
                           attn_dropout=0.1, proj_dropout=0.05).items():
        assert config[key] == value
    clone = MobileAttention.from_config(config)
    clone.build(x.shape)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(_np(clone(x)), _np(layer(x)))
    assert clone.get_config() == config
    assert len(layer.weights) == 3                                 # qkv kernel, proj kernel + bias


def test_keras_file_round_trip(tmp_path, rng):
    x = rng.normal(size=(2, 10, 4, 16)).astype("float32")
    inputs = keras.Input((10, 4, 16))
    model = keras.Model(inputs, MobileAttention(num_heads=2)(inputs))
    _randomize(model, seed=13)
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert isinstance(loaded.layers[-1], MobileAttention)
    np.testing.assert_array_equal(_np(loaded(x)), _np(model(x)))


def test_registry_and_serialization_name():
    for name in ("mobile_attention", "mobiatt", "mobile", "Mobile-Attention"):
        layer = attention_registry.get(name, num_heads=2)
        assert type(layer) is MobileAttention and layer.num_heads == 2
    assert attention_registry.canonical_name("mobiatt") == "mobile_attention"
    assert "mobile_attention" in attention_registry.available()
    layer = attention_registry.get({"name": "mobile", "normalizer": "tokens"})
    assert layer.normalizer == "tokens"
    name = keras.saving.get_registered_name(MobileAttention)
    assert name.startswith("keras_mvit2>") and name.endswith("MobileAttention")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_heads": 0}, "num_heads"),
        ({"num_heads": 2.0}, "num_heads"),
        ({"normalizer": "softmax"}, "normalizer"),
        ({"eps": 0.0}, "eps"),
        ({"attn_dropout": 1.0}, "attn_dropout"),
        ({"proj_dropout": -0.1}, "proj_dropout"),
    ],
)
def test_invalid_args(kwargs, match):
    with pytest.raises(ValueError, match=f"{match}.*Received|Received.*{match}"):
        MobileAttention(**kwargs)


def test_dim_not_divisible_by_heads():
    with pytest.raises(ValueError, match="Received: dim=30, num_heads=4"):
        MobileAttention(num_heads=4)(np.zeros((1, 5, 30), "float32"))
    with pytest.raises(ValueError, match="Received"):
        MobileAttention()(np.zeros((5, 30), "float32"))


# ---------------------------------------------------------------- inside the models


def test_inside_transformer_layer(rng):
    x = rng.normal(size=(2, 16, 4, 32)).astype("float32")
    block = TransformerLayer(attention={"name": "mobiatt", "num_heads": 4}, attn_dropout=0.1)
    y = _np(block(x))
    assert y.shape == x.shape and np.isfinite(y).all()
    assert type(block.attn) is MobileAttention and block.attn.attn_dropout == 0.1
    _randomize(block.attn, seed=14, scale=0.2)
    # the attention branch is the oracle on the GN1-normalised input
    normed = _np(block.norm1(x))
    branch = _np(block.attn(normed))
    want = np_mobile_attention_4d(normed, *_weights(block.attn), heads=4)
    assert _rel_err(branch, want) < 2e-6
    mid = x + branch
    hidden = keras.ops.silu(block.fc1(block.norm2(mid)))
    np.testing.assert_allclose(_np(block(x)), mid + _np(block.fc2(hidden)), atol=1e-5)


def test_inside_mobilevitv2(rng):
    model = keras_mvit2.MobileViTV2(0.5, attention="mobile_attention", input_shape=(128, 128, 3))
    mixers = [layer for layer in model._flatten_layers() if isinstance(layer, MobileAttention)]
    assert len(mixers) == 9                                        # 2 + 4 + 3 transformer layers
    y = _np(model(rng.random((1, 128, 128, 3)).astype("float32")))
    assert y.shape == (1, 1000) and np.isfinite(y).all()
