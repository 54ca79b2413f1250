"""RandomFeatureAttention (RFA) against numpy oracles written here, plus its properties.

The oracles are the quadratic "attention matrix" forms of the paper's equations
(A_ij = phi(q_i) . phi(k_j), masked / decayed for the causal forms): the layer
never builds A, so they share no code path with it.
"""

import itertools
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_mvit2.layers import attention_registry
from keras_mvit2.layers.random_feature_attention import RandomFeatureAttention
from keras_mvit2.layers.transformer_layer import TransformerLayer

# ---------------------------------------------------------------- numpy oracles


def np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_phi(x, w, feature_map):
    """Eq. (2) (Gaussian) or the arc-cosine map, on l2-normalised rows of `x`."""
    x = x / (np.linalg.norm(x, axis=-1, keepdims=True) + 1e-3)
    z = x @ w
    d = w.shape[-1]
    if feature_map == "gaussian":
        return np.concatenate([np.sin(z), np.cos(z)], axis=-1) / np.sqrt(d)
    return np.maximum(z, 0.0) / np.sqrt(d)


def np_weights(layer):
    """The layer's weights as float64 numpy arrays."""
    get = lambda v: keras.ops.convert_to_numpy(v).astype("float64")  # noqa: E731
    p = {
        "qkv_k": get(layer.qkv.kernel),
        "qkv_b": get(layer.qkv.bias) if layer.qkv_bias else 0.0,
        "proj_k": get(layer.proj.kernel),
        "proj_b": get(layer.proj.bias),
        "sigma": get(layer.sigma),
        "pool": get(layer.random_pool),
    }
    if layer.gate:
        p["gate_k"] = get(layer.gate_proj.kernel)
        p["gate_b"] = get(layer.gate_proj.bias)
    return p


def np_rfa(x, p, *, heads, tau, feature_map, causal, gate, eps, pool_index=None):
    """RFA, eq. (5)-(8), through the explicit N x N matrix of kernel estimates.

    non-causal: y_i = sum_j A_ij v_j / max(|sum_j A_ij|, eps)
    causal:     A_ij kept for j <= i,              denominator max(., eps)
    gated:      A_ij (1 - g_j) prod_{l=j+1..i} g_l  (the unrolled recurrence of eq. 7)
    """
    x = x.astype("float64")
    batch, n, c = x.shape
    dh = c // heads
    pool_index = list(range(heads)) if pool_index is None else pool_index
    qkv = x @ p["qkv_k"] + p["qkv_b"]
    q, k, v = qkv[..., :c], qkv[..., c : 2 * c], qkv[..., 2 * c :]
    g = np_sigmoid(x @ p["gate_k"] + p["gate_b"]) if gate else None   # (B, N, H)
    out = np.zeros((batch, n, c))
    for b in range(batch):
        for h in range(heads):
            cols = slice(h * dh, (h + 1) * dh)
            w = p["sigma"][h][:, None] * p["pool"][pool_index[h]] / tau   # (dh, D)
            a = np_phi(q[b, :, cols], w, feature_map) @ np_phi(k[b, :, cols], w, feature_map).T
            if causal:
                weight = np.zeros((n, n))
                for i in range(n):
                    for j in range(i + 1):
                        if gate:
                            weight[i, j] = (1.0 - g[b, j, h]) * np.prod(g[b, j + 1 : i + 1, h])
                        else:
                            weight[i, j] = 1.0
                a = a * weight
                den = np.maximum(a.sum(axis=1), eps)
            else:
                den = np.maximum(np.abs(a.sum(axis=1)), eps)
            out[b, :, cols] = (a @ v[b, :, cols]) / den[:, None]
    return out @ p["proj_k"] + p["proj_b"]


def np_gaussian_kernel(x, y, sigma, tau):
    """exp(-||sigma * (x - y)||^2 / (2 tau^2)) on the l2-normalised (+1e-3) rows."""
    x = x / (np.linalg.norm(x, axis=-1, keepdims=True) + 1e-3)
    y = y / (np.linalg.norm(y, axis=-1, keepdims=True) + 1e-3)
    return np.exp(-np.sum((sigma * (x - y)) ** 2, axis=-1) / (2.0 * tau**2))


def np_arccos_kernel(x, y):
    """(1/2pi) |x| |y| (sin t + (pi - t) cos t), the order-1 arc-cosine kernel / 2."""
    x = x / (np.linalg.norm(x, axis=-1, keepdims=True) + 1e-3)
    y = y / (np.linalg.norm(y, axis=-1, keepdims=True) + 1e-3)
    nx, ny = np.linalg.norm(x, axis=-1), np.linalg.norm(y, axis=-1)
    cos = np.clip(np.sum(x * y, axis=-1) / (nx * ny), -1.0, 1.0)
    t = np.arccos(cos)
    return nx * ny * (np.sin(t) + (np.pi - t) * cos) / (2.0 * np.pi)


# ---------------------------------------------------------------- helpers


def make_layer(dim=16, tokens=7, seed=3, weight_seed=1, **kwargs):
    kwargs.setdefault("num_heads", 2)
    kwargs.setdefault("feature_dim", 32)
    layer = RandomFeatureAttention(seed=seed, **kwargs)
    layer.build((None, tokens, dim))
    rng = np.random.default_rng(weight_seed)
    for w in layer.trainable_weights:
        if w.path.endswith("sigma"):
            w.assign(rng.uniform(0.6, 1.4, w.shape).astype("float32"))
        else:
            w.assign(rng.normal(0.0, 0.3, w.shape).astype("float32"))
    return layer


def oracle_kwargs(layer):
    return dict(heads=layer.num_heads, tau=layer.tau, feature_map=layer.feature_map,
                causal=layer.causal, gate=layer.gate, eps=layer.epsilon)


def to_np(x):
    return keras.ops.convert_to_numpy(x)


def graph_of(fn, spec):
    return tf.function(fn).get_concrete_function(spec).graph


# ---------------------------------------------------------------- oracles


@pytest.mark.parametrize("feature_map", ["gaussian", "arccos"])
@pytest.mark.parametrize("causal,gate", [(False, False), (True, False), (True, True)])
def test_matches_numpy_oracle(feature_map, causal, gate, rng):
    layer = make_layer(feature_map=feature_map, causal=causal, gate=gate, tau=0.8)
    x = rng.normal(size=(2, 7, 16)).astype("float32")
    expected = np_rfa(x, np_weights(layer), **oracle_kwargs(layer))
    np.testing.assert_allclose(to_np(layer(x)), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("forms", ["KERAS", "INT8"])
@pytest.mark.parametrize("tokens,token_first", [(7, True), (37, False)])
def test_noncausal_associations_match_numpy_oracle(tokens, token_first, forms, rng):
    """(phi_q phi_k^T) v for few tokens (N (F + d) < 2 F d multiply-adds), phi_q (phi_k^T v)
    for more, in Keras' and full int8's forms: the same function."""
    from keras_mvit2.layers import export_forms

    layer = make_layer(tokens=tokens, tau=0.8)
    features, channels = layer.num_features, layer.head_dim
    assert (tokens * (features + channels) < 2 * features * channels) == token_first
    x = rng.normal(size=(2, tokens, 16)).astype("float32")
    graph = graph_of(lambda t: layer(t, training=False), tf.TensorSpec(x.shape, tf.float32))
    shapes = [out.shape.as_list() for op in graph.get_operations() for out in op.outputs
              if out.shape.rank is not None]
    assert ([2, layer.num_heads, tokens, tokens] in shapes) == token_first
    expected = np_rfa(x, np_weights(layer), **oracle_kwargs(layer))
    with export_forms.tracing(getattr(export_forms, forms)):
        got = to_np(layer(x))
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)


def test_oracle_case_is_not_degenerate(rng):
    """The oracle test exercises unclamped, non-trivial attention: heads differ,
    denominators are above the floor, and causal differs from non-causal."""
    x = rng.normal(size=(2, 7, 16)).astype("float32")
    y_full = to_np(make_layer()(x))
    y_causal = to_np(make_layer(causal=True)(x))
    assert np.abs(y_full - y_causal).max() > 1e-2
    layer = make_layer()
    p = np_weights(layer)
    q = (x.astype("float64") @ p["qkv_k"] + p["qkv_b"])[0, :, :8]
    k = (x.astype("float64") @ p["qkv_k"] + p["qkv_b"])[0, :, 16:24]
    w = p["sigma"][0][:, None] * p["pool"][0]
    den = (np_phi(q, w, "gaussian") @ np_phi(k, w, "gaussian").T).sum(axis=1)
    assert den.min() > 10 * layer.epsilon


@pytest.mark.parametrize("causal", [False, True])
def test_denominator_clamp_as_the_reference(causal, rng):
    """A large sigma makes the kernel estimates noise around 0, so some denominators
    are negative or below the floor: max(|den|, eps) (non-causal, `cross_attention.py`)
    and max(den, eps) (causal, `causal_attention.py`) must both be reproduced."""
    layer = make_layer(causal=causal, feature_dim=4, tokens=12)
    layer.sigma.assign(np.full((2, 8), 5.0, "float32"))
    x = rng.normal(size=(2, 12, 16)).astype("float32")
    p = np_weights(layer)
    qkv = x.astype("float64") @ p["qkv_k"] + p["qkv_b"]
    w = p["sigma"][0][:, None] * p["pool"][0]
    a = np_phi(qkv[..., :8], w, "gaussian") @ np.swapaxes(np_phi(qkv[..., 16:24], w, "gaussian"),
                                                           1, 2)
    den = np.tril(a).sum(-1) if causal else a.sum(-1)
    assert (den < 0).any() and (np.abs(den) > layer.epsilon).any()   # the clamp is exercised
    expected = np_rfa(x, p, **oracle_kwargs(layer))
    got = to_np(layer(x))
    assert np.isfinite(got).all()
    # near-zero denominators amplify float32 rounding (measured 9e-6 of the max)
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4 * np.abs(expected).max())


def test_4d_layout_is_attention_per_pixel_position(rng):
    layer = make_layer(causal=True, gate=True, tokens=6)
    x = rng.normal(size=(2, 6, 3, 16)).astype("float32")
    got = to_np(layer(x))
    p = np_weights(layer)
    for pix in range(3):
        expected = np_rfa(x[:, :, pix], p, **oracle_kwargs(layer))
        np.testing.assert_allclose(got[:, :, pix], expected, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- causal forms


@pytest.mark.parametrize("feature_map", ["gaussian", "arccos"])
@pytest.mark.parametrize("gate", [False, True])
def test_causal_parallel_equals_recurrent_step(feature_map, gate, rng):
    layer = make_layer(causal=True, gate=gate, feature_map=feature_map, tokens=9)
    x = rng.normal(size=(3, 9, 16)).astype("float32")
    parallel = to_np(layer(x))
    state = layer.initial_state(3)
    assert tuple(state[0].shape) == (3, 2, layer.num_features, 8)
    assert tuple(state[1].shape) == (3, 2, layer.num_features)
    for t in range(9):
        y_t, state = layer.step(x[:, t], state)
        np.testing.assert_allclose(to_np(y_t), parallel[:, t], atol=1e-5, rtol=0)


@pytest.mark.parametrize("gate", [False, True])
def test_causal_output_ignores_future_tokens(gate, rng):
    layer = make_layer(causal=True, gate=gate, tokens=8)
    x = rng.normal(size=(1, 8, 16)).astype("float32")
    x2 = x.copy()
    x2[:, 5:] += rng.normal(size=(1, 3, 16)).astype("float32")
    y1, y2 = to_np(layer(x)), to_np(layer(x2))
    np.testing.assert_allclose(y1[:, :5], y2[:, :5], atol=1e-6)
    assert np.abs(y1[:, 5:] - y2[:, 5:]).max() > 1e-3


def test_gated_scan_with_dynamic_token_count(rng):
    layer = make_layer(causal=True, gate=True, tokens=11)
    x = rng.normal(size=(2, 11, 16)).astype("float32")
    fn = tf.function(lambda t: layer(t), input_signature=[tf.TensorSpec((None, None, 16))])
    np.testing.assert_allclose(to_np(fn(x)), to_np(layer(x)), atol=1e-6)
    np.testing.assert_allclose(
        to_np(fn(x[:, :5])), np_rfa(x[:, :5], np_weights(layer), **oracle_kwargs(layer)),
        atol=1e-5, rtol=1e-5)


def test_gate_near_zero_keeps_only_the_current_token(rng):
    """g -> 0: S_t = phi(k_t) v_t^T, z_t = phi(k_t); with q = k the Gaussian
    phi(q_t) . phi(k_t) = 1 (sin^2 + cos^2), so y_t = out_proj(v_t)."""
    layer = make_layer(causal=True, gate=True, tokens=6)
    kernel = to_np(layer.qkv.kernel).copy()
    bias = to_np(layer.qkv.bias).copy()
    kernel[:, 16:32], bias[16:32] = kernel[:, :16], bias[:16]          # k = q
    layer.qkv.kernel.assign(kernel)
    layer.qkv.bias.assign(bias)
    layer.gate_proj.kernel.assign(np.zeros((16, 2), "float32"))
    layer.gate_proj.bias.assign(np.full((2,), -40.0, "float32"))       # g = sigmoid(-40)
    x = rng.normal(size=(2, 6, 16)).astype("float32")
    v = x @ kernel[:, 32:] + bias[32:]
    expected = v @ to_np(layer.proj.kernel) + to_np(layer.proj.bias)
    np.testing.assert_allclose(to_np(layer(x)), expected, atol=1e-5)


def test_gate_near_one_never_updates_the_state(rng):
    """g -> 1: S and z stay ~0, the clamped denominator gives y = 0, output = b_o."""
    layer = make_layer(causal=True, gate=True, tokens=6)
    layer.gate_proj.kernel.assign(np.zeros((16, 2), "float32"))
    layer.gate_proj.bias.assign(np.full((2,), 40.0, "float32"))
    x = rng.normal(size=(2, 6, 16)).astype("float32")
    expected = np.broadcast_to(to_np(layer.proj.bias), (2, 6, 16))
    np.testing.assert_allclose(to_np(layer(x)), expected, atol=1e-6)


def test_gate_on_and_off_differ(rng):
    x = rng.normal(size=(2, 7, 16)).astype("float32")
    plain = make_layer(causal=True)
    gated = make_layer(causal=True, gate=True)
    assert len(gated.trainable_weights) == len(plain.trainable_weights) + 2
    assert np.abs(to_np(plain(x)) - to_np(gated(x))).max() > 1e-2


# ---------------------------------------------------------------- kernel estimate


def _unit_pairs(rng, n, d):
    q = rng.normal(size=(n, d))
    k = q + rng.normal(size=(n, d)) * rng.uniform(0.2, 2.0, size=(n, 1))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    return q.astype("float32"), k.astype("float32")


def _estimates(feature_dim, q, k, feature_map="gaussian", tau=1.0, sigma=None):
    layer = RandomFeatureAttention(num_heads=1, feature_dim=feature_dim, feature_map=feature_map,
                                   tau=tau, pool_size=1, seed=0)
    layer.build((None, None, q.shape[-1]))
    if sigma is not None:
        layer.sigma.assign(sigma[None].astype("float32"))
    phi_q = to_np(layer.random_features(q[None, None]))[0, 0]          # (pairs, F)
    phi_k = to_np(layer.random_features(k[None, None]))[0, 0]
    return np.sum(phi_q * phi_k, axis=-1)


@pytest.mark.parametrize("tau", [1.0, 0.7])
def test_gaussian_kernel_estimate_converges_to_softmax_kernel(tau):
    """phi(q) . phi(k) -> exp(q.k / s^2) * exp(-1 / s^2) for unit q, k (eq. 3-4), s = tau.

    Statistical test with a fixed seed: 400 pairs, mean absolute error falls with D
    (about as 1/sqrt(D); measured 0.053 / 0.016 / 0.003 for tau = 1) and is below
    0.01 at D = 4096."""
    rng = np.random.default_rng(42)
    q, k = _unit_pairs(rng, 400, 8)
    qk = np.sum(q.astype("float64") * k, axis=-1)
    softmax_kernel = np.exp(qk / tau**2) * math.exp(-1.0 / tau**2)
    exact = np_gaussian_kernel(q.astype("float64"), k, 1.0, tau)     # with the 1e-3 of the norm
    np.testing.assert_allclose(exact, softmax_kernel, atol=5e-3)    # the two targets agree
    assert exact.min() < 0.3 and exact.max() > 0.8                   # a spread of similarities
    maes = [np.mean(np.abs(_estimates(d, q, k, tau=tau) - exact)) for d in (16, 256, 4096)]
    assert maes[0] > maes[1] > maes[2], maes
    assert maes[1] < 0.5 * maes[0] and maes[2] < 0.5 * maes[1], maes
    assert maes[2] < 0.01, maes


def test_learned_sigma_scales_each_dimension():
    """Eq. (8): w = sigma o w_hat / tau gives exp(-||sigma o (x - y)||^2 / (2 tau^2))."""
    rng = np.random.default_rng(7)
    q, k = _unit_pairs(rng, 300, 8)
    sigma = rng.uniform(0.5, 2.0, size=8)
    exact = np_gaussian_kernel(q.astype("float64"), k, sigma, 1.0)
    isotropic = np_gaussian_kernel(q.astype("float64"), k, 1.0, 1.0)
    mae = np.mean(np.abs(_estimates(4096, q, k, sigma=sigma) - exact))
    assert mae < 0.015
    assert np.mean(np.abs(exact - isotropic)) > 5 * mae               # sigma really matters


def test_arccos_kernel_estimate_converges():
    """sqrt(1/D) ReLU(W x) features: phi(x) . phi(y) -> the arc-cosine kernel above."""
    rng = np.random.default_rng(3)
    q, k = _unit_pairs(rng, 300, 8)
    exact = np_arccos_kernel(q.astype("float64"), k)
    maes = [np.mean(np.abs(_estimates(d, q, k, feature_map="arccos") - exact))
            for d in (16, 256, 4096)]
    assert maes[0] > maes[1] > maes[2], maes
    assert maes[1] < 0.5 * maes[0] and maes[2] < 0.5 * maes[1], maes
    assert maes[2] < 0.02, maes                  # kernel values 0.07..0.5; measured 0.0095


def test_gaussian_features_have_unit_norm(rng):
    layer = RandomFeatureAttention(num_heads=2, feature_dim=16, seed=0)
    layer.build((None, None, 8))
    x = rng.normal(size=(2, 2, 5, 4)).astype("float32")
    phi = to_np(layer.random_features(x))
    assert phi.shape == (2, 2, 5, 32)
    np.testing.assert_allclose(np.sum(phi**2, axis=-1), 1.0, atol=1e-5)


# ---------------------------------------------------------------- random-matrix pool


def test_training_draws_distinct_pool_entries_per_head(rng):
    """Each training call uses num_heads distinct pool entries (found by matching the
    oracle against every assignment); inference always uses entries 0..M-1."""
    layer = make_layer(pool_size=4, tokens=5, seed=11)
    x = rng.normal(size=(1, 5, 16)).astype("float32")
    p = np_weights(layer)
    candidates = {
        idx: np_rfa(x, p, pool_index=list(idx), **oracle_kwargs(layer))
        for idx in itertools.permutations(range(4), 2)
    }
    seen = set()
    for _ in range(8):
        got = to_np(layer(x, training=True))
        matches = [idx for idx, y in candidates.items() if np.abs(got - y).max() < 1e-5]
        assert len(matches) == 1, matches
        seen.add(matches[0])
    assert len(seen) >= 3, seen
    for _ in range(2):
        np.testing.assert_allclose(to_np(layer(x)), candidates[(0, 1)], atol=1e-5)
        np.testing.assert_allclose(to_np(layer(x, training=False)), candidates[(0, 1)],
                                   atol=1e-5)


def test_pool_is_fixed_by_seed_and_not_trainable():
    a, b, c = (RandomFeatureAttention(num_heads=2, feature_dim=8, seed=s) for s in (5, 5, 6))
    for layer in (a, b, c):
        layer.build((None, None, 16))
    assert tuple(a.random_pool.shape) == (8, 8, 8)
    assert not a.random_pool.trainable and a.sigma.trainable
    np.testing.assert_array_equal(to_np(a.random_pool), to_np(b.random_pool))
    assert np.abs(to_np(a.random_pool) - to_np(c.random_pool)).max() > 0.1
    pool = to_np(a.random_pool)
    assert abs(pool.mean()) < 0.15 and abs(pool.std() - 1.0) < 0.15   # W0 ~ N(0, I)
    np.testing.assert_array_equal(to_np(a.sigma), 1.0)


@pytest.mark.parametrize("causal,gate", [(False, False), (True, True)])
def test_inference_graph_has_no_random_op(causal, gate):
    layer = make_layer(causal=causal, gate=gate, attn_dropout=0.1)
    spec = tf.TensorSpec((2, 7, 16), tf.float32)
    infer = {op.type for op in graph_of(lambda t: layer(t, training=False), spec)
             .get_operations()}
    train = {op.type for op in graph_of(lambda t: layer(t, training=True), spec)
             .get_operations()}
    assert not [t for t in infer if "Random" in t], sorted(infer)
    assert [t for t in train if "Random" in t], sorted(train)        # the check can fail


def test_attention_dropout_only_in_training(rng):
    """With one pool entry the training draw is fixed, so differences come from dropout."""
    x = rng.normal(size=(2, 7, 16)).astype("float32")
    plain = make_layer(num_heads=1, pool_size=1)
    dropped = make_layer(num_heads=1, pool_size=1, attn_dropout=0.5)
    np.testing.assert_allclose(to_np(dropped(x)), to_np(plain(x)), atol=1e-6)
    np.testing.assert_allclose(to_np(plain(x, training=True)), to_np(plain(x)), atol=1e-6)
    assert np.abs(to_np(dropped(x, training=True)) - to_np(plain(x))).max() > 1e-3


def test_attention_dropout_drops_key_tokens_from_the_numerator(rng):
    """y_i = sum_j (A_ij / den_i) m_j v_j with m_j in {0, 1/(1-p)} per key token (shared
    by the channels), den_i over all keys: solved for m by least squares."""
    layer = make_layer(dim=8, tokens=6, num_heads=1, pool_size=1, attn_dropout=0.5)
    layer.proj.kernel.assign(np.eye(8, dtype="float32"))           # the head output itself
    layer.proj.bias.assign(np.zeros(8, "float32"))
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    p = np_weights(layer)
    qkv = x.astype("float64") @ p["qkv_k"] + p["qkv_b"]
    w = p["sigma"][0][:, None] * p["pool"][0]
    masks = []
    for _ in range(3):
        got = to_np(layer(x, training=True)).astype("float64")
        for b in range(2):
            a = np_phi(qkv[b, :, :8], w, "gaussian") @ np_phi(qkv[b, :, 8:16], w, "gaussian").T
            a_norm = a / np.maximum(np.abs(a.sum(1, keepdims=True)), layer.epsilon)
            v = qkv[b, :, 16:]
            system = (a_norm[:, None, :] * v.T[None, :, :]).reshape(-1, 6)   # (i c, j)
            m, *_ = np.linalg.lstsq(system, got[b].reshape(-1), rcond=None)
            np.testing.assert_allclose(system @ m, got[b].reshape(-1), atol=1e-5)
            np.testing.assert_allclose(np.minimum(np.abs(m), np.abs(m - 2.0)), 0.0, atol=1e-4)
            masks.append(np.round(m))
    masks = np.concatenate(masks)
    assert (masks == 0).any() and (masks == 2).any()


# ---------------------------------------------------------------- cost and rank


@pytest.mark.parametrize("causal,gate", [(False, False), (True, False), (True, True)])
def test_graph_is_linear_in_tokens_and_rank_at_most_4(causal, gate):
    """No tensor with two axes of size N (N = 37, no other size is 37), no rank > 4."""
    layer = make_layer(causal=causal, gate=gate, tokens=37)
    graph = graph_of(lambda t: layer(t, training=False), tf.TensorSpec((1, 37, 16), tf.float32))
    for op in graph.get_operations():
        for out in op.outputs:
            if out.shape.rank is None:
                continue
            dims = out.shape.as_list()
            assert len(dims) <= 4, (op.type, dims)
            assert dims.count(37) <= 1, (op.type, dims)


# ---------------------------------------------------------------- mixed precision


@pytest.mark.parametrize("causal,gate", [(False, False), (True, True)])
def test_mixed_bfloat16_keeps_feature_products_in_float32(causal, gate, rng):
    x = rng.normal(size=(2, 7, 16)).astype("float32")
    ref = make_layer(causal=causal, gate=gate)
    layer = RandomFeatureAttention.from_config({**ref.get_config(), "dtype": "mixed_bfloat16"})
    layer.build((None, 7, 16))
    layer.set_weights(ref.get_weights())
    y = layer(x)
    assert keras.backend.standardize_dtype(y.dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(layer.sigma.dtype) == "float32"
    y = to_np(keras.ops.cast(y, "float32"))
    assert np.isfinite(y).all()
    y_ref = to_np(ref(x))
    assert np.abs(y - y_ref).max() < 0.03 * np.abs(y_ref).max() + 0.01
    graph = graph_of(lambda t: layer(t, training=False), tf.TensorSpec((2, 7, 16), tf.float32))
    kinds = {"Sin", "Cos", "Maximum", "RealDiv", "Sqrt", "Cumsum", "Sigmoid"}
    found = {}
    for op in graph.get_operations():
        if op.type in kinds:
            found.setdefault(op.type, set()).add(op.outputs[0].dtype.name)
    assert {"Sin", "Cos", "Maximum", "RealDiv"} <= set(found), found
    assert all(dtypes == {"float32"} for dtypes in found.values()), found
    state = layer.initial_state(2) if causal else None
    if causal:
        y0, state = layer.step(x[:, 0], state)
        assert keras.backend.standardize_dtype(state[0].dtype) == "float32"
        assert np.isfinite(to_np(keras.ops.cast(y0, "float32"))).all()


# ---------------------------------------------------------------- interface


def test_registry_and_serialization_name():
    assert attention_registry.canonical_name("rfa") == "rfa"
    assert attention_registry.canonical_name("random_feature") == "rfa"
    layer = attention_registry.get("rfa", num_heads=2, causal=True)
    assert isinstance(layer, RandomFeatureAttention) and layer.causal
    layer = attention_registry.get({"name": "random_feature", "feature_map": "arccos"})
    assert layer.feature_map == "arccos"
    assert keras.saving.get_registered_name(RandomFeatureAttention).startswith("keras_mvit2>")


@pytest.mark.parametrize("kwargs", [
    dict(num_heads=2, feature_dim=8, seed=1),
    dict(num_heads=4, feature_dim=4, feature_map="arccos", causal=True, gate=True, tau=0.5,
         pool_size=6, qkv_bias=False, seed=2, epsilon=1e-3, attn_dropout=0.1),
])
def test_config_round_trip(kwargs, rng):
    layer = RandomFeatureAttention(**kwargs)
    x = rng.normal(size=(2, 5, 3, 16)).astype("float32")
    y = to_np(layer(x))
    config = layer.get_config()
    for key, value in kwargs.items():
        assert config[key] == value
    clone = RandomFeatureAttention.from_config(config)
    clone.build(x.shape)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(to_np(clone(x)), y)
    copy = attention_registry.get(layer)                  # the registry's copy: same config
    assert copy.get_config() == config


def test_keras_file_round_trip(tmp_path, rng):
    inputs = keras.Input((6, 16))
    layer = make_layer(causal=True, gate=True, tokens=6)
    model = keras.Model(inputs, layer(inputs))
    x = rng.normal(size=(2, 6, 16)).astype("float32")
    path = str(tmp_path / "rfa.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded.layers[-1], RandomFeatureAttention)
    np.testing.assert_array_equal(to_np(loaded(x)), to_np(model(x)))


def test_inside_transformer_layer(rng):
    block = TransformerLayer(attention={"name": "rfa", "num_heads": 2, "seed": 0},
                             attn_dropout=0.1)
    x = rng.normal(size=(2, 9, 4, 16)).astype("float32")
    y = to_np(block(x))
    assert y.shape == x.shape and np.isfinite(y).all()
    assert isinstance(block.attn, RandomFeatureAttention)
    assert block.attn.attn_dropout == 0.1
    assert np.isfinite(to_np(block(x, training=True))).all()


@pytest.mark.parametrize("kwargs,match", [
    (dict(feature_map="laplace"), "feature_map"),
    (dict(num_heads=0), "num_heads"),
    (dict(num_heads=2.0), "num_heads"),
    (dict(feature_dim=0), "feature_dim"),
    (dict(gate=True), "causal"),
    (dict(pool_size=2, num_heads=4), "pool_size"),
    (dict(tau=0.0), "tau"),
    (dict(epsilon=-1.0), "epsilon"),
    (dict(attn_dropout=1.0), "attn_dropout"),
    (dict(seed="a"), "seed"),
])
def test_invalid_args(kwargs, match):
    with pytest.raises(ValueError, match=rf"{match}.*Received|Received.*{match}"):
        RandomFeatureAttention(**kwargs)


def test_invalid_shapes_and_streaming_misuse():
    with pytest.raises(ValueError, match=r"divisible by num_heads.*Received"):
        RandomFeatureAttention(num_heads=3)(np.zeros((1, 4, 16), "float32"))
    layer = RandomFeatureAttention(num_heads=2)
    layer.build((None, None, 16))
    with pytest.raises(ValueError, match=r"causal.*Received"):
        layer.initial_state(1)
    with pytest.raises(ValueError, match=r"causal.*Received"):
        layer.step(np.zeros((1, 16), "float32"), None)
    causal = RandomFeatureAttention(num_heads=2, causal=True)
    with pytest.raises(ValueError, match=r"build the layer.*Received"):
        causal.initial_state(1)
    causal.build((None, None, 16))
    with pytest.raises(ValueError, match=r"one token.*Received"):
        causal.step(np.zeros((1, 3, 16), "float32"), causal.initial_state(1))
