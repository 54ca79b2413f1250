"""Each layer against a plain numpy transcription of its formula, plus config round trips."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_mvit2 import layers
from keras_mvit2.models import MobileViTV2Block

# ---------------------------------------------------------------- numpy oracles


def np_group_norm1(x, gamma, beta, eps=1e-5):
    axes = tuple(range(1, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def np_unfold(x, p=2):
    b, h, w, c = x.shape
    nh, nw = h // p, w // p
    out = np.zeros((b, nh * nw, p * p, c), x.dtype)
    for i in range(nh):
        for j in range(nw):
            for ph in range(p):
                for pw in range(p):
                    out[:, i * nw + j, ph * p + pw, :] = x[:, p * i + ph, p * j + pw, :]
    return out


def np_separable_attention(x, w_qkv, b_qkv, w_out, b_out):
    """Eq. (3): c_s = softmax(x W_I) over tokens, c_v = sum(c_s * x W_K),
    y = (ReLU(x W_V) * c_v) W_O."""
    d = x.shape[-1]
    qkv = x @ w_qkv + b_qkv
    q, k, v = qkv[..., :1], qkv[..., 1 : 1 + d], qkv[..., 1 + d :]
    s = np.exp(q - q.max(axis=1, keepdims=True))
    s = s / s.sum(axis=1, keepdims=True)
    context = (k * s).sum(axis=1, keepdims=True)
    return (np.maximum(v, 0.0) * context) @ w_out + b_out


def np_silu(x):
    return x / (1.0 + np.exp(-x))


def _kernel(conv):
    w = keras.ops.convert_to_numpy(conv.kernel)
    return w.reshape(w.shape[-2], w.shape[-1]), keras.ops.convert_to_numpy(conv.bias)


def _randomize(layer, seed=1):
    rng = np.random.default_rng(seed)
    for w in layer.weights:
        w.assign(rng.normal(0.0, 0.3, w.shape).astype("float32"))


# ---------------------------------------------------------------- GroupNorm1


@pytest.mark.parametrize("shape", [(2, 16, 4, 8), (3, 10, 6)])
def test_group_norm1_matches_numpy(shape, rng):
    x = rng.normal(1.0, 2.0, shape).astype("float32")
    layer = layers.GroupNorm1()
    layer.build(shape)
    gamma = rng.uniform(0.5, 1.5, shape[-1]).astype("float32")
    beta = rng.normal(0, 0.5, shape[-1]).astype("float32")
    layer.set_weights([gamma, beta])
    got = keras.ops.convert_to_numpy(layer(x))
    np.testing.assert_allclose(got, np_group_norm1(x, gamma, beta), atol=1e-5)


def test_group_norm1_statistics_span_all_positions_and_channels(rng):
    """Not a per-token LayerNorm: one token's output depends on the others."""
    x = rng.normal(size=(1, 8, 4, 6)).astype("float32")
    layer = layers.GroupNorm1()
    y1 = keras.ops.convert_to_numpy(layer(x))
    x2 = x.copy()
    x2[0, 7] += 5.0
    y2 = keras.ops.convert_to_numpy(layer(x2))
    assert np.abs(y1[0, 0] - y2[0, 0]).max() > 1e-2


def test_group_norm1_rejects_unknown_channels():
    with pytest.raises(ValueError, match="Received"):
        layers.GroupNorm1().build((None, None))


# ---------------------------------------------------------------- unfold / fold


@pytest.mark.parametrize("hw", [(8, 8), (4, 6)])
def test_unfold_index_mapping_and_fold_inverse(hw, rng):
    x = rng.normal(size=(2, *hw, 3)).astype("float32")
    unfolded = keras.ops.convert_to_numpy(layers.unfold(x))
    np.testing.assert_array_equal(unfolded, np_unfold(x))
    back = keras.ops.convert_to_numpy(layers.fold(unfolded, (hw[0] // 2, hw[1] // 2)))
    np.testing.assert_array_equal(back, x)


def test_unfold_rejects_indivisible_size(rng):
    with pytest.raises(ValueError, match="divisible by patch_size"):
        layers.unfold(rng.normal(size=(1, 5, 4, 3)).astype("float32"))


# ---------------------------------------------------------------- separable self-attention


@pytest.mark.parametrize("shape", [(2, 16, 4, 8), (2, 12, 8)])
def test_separable_attention_matches_eq3(shape, rng):
    x = rng.normal(size=shape).astype("float32")
    layer = layers.SeparableSelfAttention()
    layer.build(shape)
    _randomize(layer)
    got = keras.ops.convert_to_numpy(layer(x))
    w_qkv, b_qkv = _kernel(layer.qkv_proj)
    w_out, b_out = _kernel(layer.out_proj)
    x4 = x if x.ndim == 4 else x[:, :, None, :]
    want = np_separable_attention(x4, w_qkv, b_qkv, w_out, b_out)
    want = want if x.ndim == 4 else want[:, :, 0, :]
    assert got.shape == shape
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_context_scores_are_a_distribution_over_tokens(rng):
    x = rng.normal(size=(2, 16, 4, 8)).astype("float32")
    layer = layers.SeparableSelfAttention()
    scores = keras.ops.convert_to_numpy(layer.context_scores(x))
    assert scores.shape == (2, 16, 4)
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, atol=1e-6)
    assert (scores > 0).all()


def test_separable_attention_is_token_permutation_equivariant(rng):
    """Global mixing through one context vector: permuting tokens permutes outputs."""
    x = rng.normal(size=(1, 10, 4, 8)).astype("float32")
    layer = layers.SeparableSelfAttention()
    perm = rng.permutation(10)
    y = keras.ops.convert_to_numpy(layer(x))
    y_perm = keras.ops.convert_to_numpy(layer(x[:, perm]))
    np.testing.assert_allclose(y_perm, y[:, perm], atol=1e-5)


def test_separable_attention_dropout_only_in_training(rng):
    x = rng.normal(size=(2, 16, 4, 8)).astype("float32")
    layer = layers.SeparableSelfAttention(attn_dropout=0.5)
    a = keras.ops.convert_to_numpy(layer(x, training=False))
    b = keras.ops.convert_to_numpy(layer(x, training=False))
    c = keras.ops.convert_to_numpy(layer(x, training=True))
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 1e-4


def test_separable_attention_with_dropped_scores_matches_naive_form(rng):
    """The key projection applied after weighting stays exact when dropout breaks sum(c_s) = 1."""
    shape = (2, 10, 4, 8)
    x = rng.normal(size=shape).astype("float32")
    layer = layers.SeparableSelfAttention(attn_dropout=0.3)
    layer.build(shape)
    _randomize(layer)
    mask = (rng.uniform(size=(2, 10, 4, 1)) > 0.3).astype("float32") / 0.7

    # A fixed dropout mask in place of the random one (the layer's state is locked once built).
    layer.score_dropout.call = lambda scores, training=None: scores * mask if training else scores
    got = keras.ops.convert_to_numpy(layer(x, training=True))
    w_qkv, b_qkv = _kernel(layer.qkv_proj)
    w_out, b_out = _kernel(layer.out_proj)
    qkv = x @ w_qkv + b_qkv
    q, k, v = qkv[..., :1], qkv[..., 1:9], qkv[..., 9:]
    s = np.exp(q - q.max(axis=1, keepdims=True))
    s = s / s.sum(axis=1, keepdims=True) * mask
    want = (np.maximum(v, 0.0) * (k * s).sum(axis=1, keepdims=True)) @ w_out + b_out
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_separable_attention_invalid_args():
    with pytest.raises(ValueError, match="Received: attn_dropout"):
        layers.SeparableSelfAttention(attn_dropout=1.5)
    with pytest.raises(ValueError, match="Received: input_shape"):
        layers.SeparableSelfAttention().build((2, 8))


# ---------------------------------------------------------------- transformer layer


def test_transformer_layer_matches_numpy(rng):
    shape = (2, 16, 4, 16)
    x = rng.normal(size=shape).astype("float32")
    layer = layers.TransformerLayer()
    layer.build(shape)
    _randomize(layer)
    got = keras.ops.convert_to_numpy(layer(x))

    def gn(norm, t):
        g, b = (keras.ops.convert_to_numpy(w) for w in (norm.gamma, norm.beta))
        return np_group_norm1(t, g, b)

    w_qkv, b_qkv = _kernel(layer.attn.qkv_proj)
    w_out, b_out = _kernel(layer.attn.out_proj)
    w1, b1 = _kernel(layer.fc1)
    w2, b2 = _kernel(layer.fc2)
    assert w1.shape == (16, 32)  # FFN width 2d, floored to a multiple of 16
    h = x + np_separable_attention(gn(layer.norm1, x), w_qkv, b_qkv, w_out, b_out)
    want = h + np_silu(gn(layer.norm2, h) @ w1 + b1) @ w2 + b2
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dim,ffn", [(64, 128), (72, 144), (40, 80), (36, 64)])
def test_default_ffn_dim_floors_to_16(dim, ffn):
    from keras_mvit2.layers.transformer_layer import default_ffn_dim

    assert default_ffn_dim(dim) == ffn


# ---------------------------------------------------------------- inverted residual / block


@pytest.mark.parametrize("size,strides,out", [(9, 2, 5), (8, 2, 4), (7, 1, 7)])
def test_inverted_residual_shapes(size, strides, out, rng):
    x = rng.normal(size=(1, size, size, 8)).astype("float32")
    layer = layers.InvertedResidual(16, strides=strides)
    assert tuple(layer(x).shape) == (1, out, out, 16)
    assert layer.compute_output_shape((1, size, size, 8)) == (1, out, out, 16)


def test_inverted_residual_residual_only_when_shapes_match(rng):
    x = rng.normal(size=(1, 8, 8, 16)).astype("float32")
    with_res = layers.InvertedResidual(16)
    with_res(x)
    assert with_res.use_residual
    # Zero the projection BN scale/shift: the block then reduces to its residual.
    with_res.project_bn.gamma.assign(np.zeros(16, "float32"))
    with_res.project_bn.beta.assign(np.zeros(16, "float32"))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(with_res(x)), x, atol=1e-6)
    no_res = layers.InvertedResidual(24)
    no_res(x)
    assert not no_res.use_residual


def test_inverted_residual_stride2_pads_symmetrically(rng):
    """PyTorch padding=1: output pixel (0, 0) sees input rows/cols -1..1, not 0..2."""
    layer = layers.InvertedResidual(4, strides=2)
    x = np.zeros((1, 6, 6, 4), "float32")
    layer.build(x.shape)
    # Identity-like expand/project and a depthwise kernel that only reads its top-left tap.
    for conv in (layer.expand_conv, layer.project_conv):
        conv.kernel.assign(np.eye(conv.kernel.shape[-2], conv.kernel.shape[-1],
                                  dtype="float32")[None, None])
    k = np.zeros(layer.depthwise_conv.kernel.shape, "float32")
    k[0, 0] = 1.0
    layer.depthwise_conv.kernel.assign(k)
    x[0, 0, 0, :] = 3.0  # only the top-left input pixel is non-zero
    y = keras.ops.convert_to_numpy(layer(x))
    # With symmetric padding, output (1, 1) reads input (1, 1) through tap (0, 0) -> zero,
    # and output (0, 0) reads the padded row -1 -> zero: the single pixel is never read.
    # Keras "same" (pad bottom/right only) would read it at output (0, 0).
    base = keras.ops.convert_to_numpy(layer(np.zeros_like(x)))
    np.testing.assert_allclose(y, base, atol=1e-6)


@pytest.mark.parametrize("hw,out_hw", [((8, 8), (8, 8)), ((7, 7), (8, 8)), ((7, 10), (8, 10))])
def test_mobilevitv2_block_shapes_and_resize(hw, out_hw, rng):
    x = rng.normal(size=(2, *hw, 16)).astype("float32")
    block = MobileViTV2Block(8, num_layers=2)
    y = block(x)
    assert tuple(y.shape) == (2, *out_hw, 16)
    assert block.compute_output_shape((2, *hw, 16)) == (2, *out_hw, 16)


def test_block_resize_is_bilinear_align_corners(rng):
    """Resize of a 3x3 map to 4x4 with align_corners: corners kept, linear in between."""
    block = MobileViTV2Block(8, num_layers=1)
    x = rng.normal(size=(1, 3, 3, 2)).astype("float32")
    y = keras.ops.convert_to_numpy(block.resize_input(x))
    assert y.shape == (1, 4, 4, 2)
    rows, cols = [0, 0, -1, -1], [0, -1, 0, -1]
    np.testing.assert_allclose(y[0, rows, cols], x[0, rows, cols], atol=1e-6)
    # src coordinate of output row 1 is 1 * (3 - 1) / (4 - 1) = 2/3
    want = x[0, 0, 0] * (1 / 3) + x[0, 1, 0] * (2 / 3)
    np.testing.assert_allclose(y[0, 1, 0], want, atol=1e-5)


@pytest.mark.parametrize("hw", [(8, 8), (7, 7), (7, 10), (10, 7)])
def test_block_with_dynamic_size_equals_static_call(hw, rng):
    """Built for (None, None): the grid and the resize follow each call's size, the same
    numbers as the block called on the static shape (the resize only for odd sides)."""
    block = MobileViTV2Block(8, num_layers=2)
    block.build((None, None, None, 16))
    assert block.compute_output_shape((None, None, None, 16)) == (None, None, None, 16)
    x = rng.normal(size=(2, *hw, 16)).astype("float32")
    static = keras.ops.convert_to_numpy(block(x))
    traced = tf.function(block, input_signature=[tf.TensorSpec((None, None, None, 16))])
    dynamic = traced(x).numpy()
    assert dynamic.shape == static.shape == (2, -(-hw[0] // 2) * 2, -(-hw[1] // 2) * 2, 16)
    np.testing.assert_allclose(dynamic, static, atol=1e-5)


# ---------------------------------------------------------------- serialization


LAYER_CASES = [
    (layers.GroupNorm1, {"epsilon": 1e-6}, (2, 8, 4, 8)),
    (layers.SeparableSelfAttention, {"attn_dropout": 0.1}, (2, 8, 4, 8)),
    (layers.TransformerLayer, {"ffn_dim": 32, "dropout": 0.1}, (2, 8, 4, 16)),
    (layers.InvertedResidual, {"filters": 16, "strides": 2}, (2, 8, 8, 8)),
    (MobileViTV2Block, {"attention_dim": 8, "num_layers": 2}, (2, 8, 8, 16)),
]


@pytest.mark.parametrize("cls,kwargs,shape", LAYER_CASES, ids=lambda v: getattr(v, "__name__", ""))
def test_layer_config_round_trip(cls, kwargs, shape, rng):
    x = rng.normal(size=shape).astype("float32")
    layer = cls(**kwargs)
    y = keras.ops.convert_to_numpy(layer(x))
    config = layer.get_config()
    clone = cls.from_config(config)
    clone(x)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(clone(x)), y)
    assert clone.get_config() == config
    assert keras.saving.get_registered_name(cls) == f"keras_mvit2>{cls.__name__}"
    assert "Input shape" in cls.__doc__ and "Output shape" in cls.__doc__
