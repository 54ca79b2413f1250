"""Random Feature Attention (RFA, Peng et al., ICLR 2021), non-causal, causal and gated."""

import math
from typing import ClassVar

import keras
import numpy as np
from keras import ops

from keras_mvit2.api_export import serializable
from keras_mvit2.layers import attention_registry
from keras_mvit2.layers.functional import divide_positive, kernel_attention
from keras_mvit2.layers.multi_head_attention import (
    dense_on_tokens,
    head_dim_of,
    merge_heads,
    split_heads,
)
from keras_mvit2.layers.token_mixer import TokenMixer
from keras_mvit2.utils.arguments import validate_positive_ints, validate_rates

#: Feature maps of `RandomFeatureAttention`.
FEATURE_MAPS = ("gaussian", "arccos")

#: Added to the norm when queries and keys are l2-normalised (`x / (||x|| + 1e-3)`),
#: as the authors' `_normalize`.
NORM_EPSILON = 1e-3


def _static_or_dynamic(x, axis: int):
    return x.shape[axis] if x.shape[axis] is not None else ops.shape(x)[axis]


def _shift_tokens(x, shift, num_tokens, fill: float):
    """`x` moved `shift` places along axis 1; the `shift` first rows hold `fill`."""
    head = ops.zeros_like(x[:, :shift])
    if fill:
        head = head + fill
    return ops.concatenate([head, x[:, : num_tokens - shift]], axis=1)


def _gated_cumsum(gates, kv, k):
    """The gated prefix sums of eq. (7) for all tokens at once.

    `S_t = g_t S_{t-1} + (1 - g_t) kv_t` and `z_t = g_t z_{t-1} + (1 - g_t) k_t`
    with `S_0 = z_0 = 0`, as a Hillis-Steele scan over the token axis: ceil(log2 N)
    rounds of the associative combine `(a1, b1), (a2, b2) -> (a1 a2, a2 b1 + b2)`.
    No `exp(cumsum(log g))` factorisation (it under/overflows on long sequences),
    no N x N tensor, rank stays <= 4.

    Args:
        gates: `(batch*heads, tokens)`.
        kv: `(batch*heads, tokens, features, head_dim)`, the outer products `phi(k_t) v_t^T`.
        k: `(batch*heads, tokens, features)`, `phi(k_t)`.

    Returns:
        `(S, z)` of the shapes of `kv` and `k`.
    """
    a = gates                                                     # (BH, N)
    b_s = ops.expand_dims(ops.expand_dims(1.0 - gates, -1), -1) * kv  # (BH, N, F, dh)
    b_z = ops.expand_dims(1.0 - gates, -1) * k                    # (BH, N, F)

    def combine(shift, a, b_s, b_z, num_tokens):
        b_s = b_s + ops.expand_dims(ops.expand_dims(a, -1), -1) * _shift_tokens(
            b_s, shift, num_tokens, 0.0)
        b_z = b_z + ops.expand_dims(a, -1) * _shift_tokens(b_z, shift, num_tokens, 0.0)
        a = a * _shift_tokens(a, shift, num_tokens, 1.0)
        return a, b_s, b_z

    num_tokens = gates.shape[1]
    if num_tokens is not None:                                    # unrolled, static N
        shift = 1
        while shift < num_tokens:
            a, b_s, b_z = combine(shift, a, b_s, b_z, num_tokens)
            shift *= 2
        return b_s, b_z

    num_tokens = ops.shape(gates)[1]                              # dynamic N: a while loop

    def cond(shift, a, b_s, b_z):
        return shift < num_tokens

    def body(shift, a, b_s, b_z):
        a, b_s, b_z = combine(shift, a, b_s, b_z, num_tokens)
        return shift * 2, a, b_s, b_z

    _, _, b_s, b_z = ops.while_loop(cond, body, (ops.convert_to_tensor(1), a, b_s, b_z))
    return b_s, b_z


@attention_registry.register("rfa", "random_feature", "random_feature_attention")
@serializable
class RandomFeatureAttention(TokenMixer):
    """Random Feature Attention (RFA): softmax attention through random features.

    With `M = num_heads` heads of width `d = dim / M`, `D = feature_dim` random
    projections per head and `W0_h ~ N(0, I)` of shape `(d, D)`:

    ```
    [q | k | v] = x W_qkv + b_qkv                    # per head (N, d) each
    q_hat = q / (||q|| + 1e-3), k_hat likewise        # unit-norm queries and keys
    W_h = sigma_h[:, None] * W0_h / tau               # eq. (8); sigma_h in R^d, learned
    gaussian: phi(x) = sqrt(1/D) [sin(x W_h), cos(x W_h)]   in R^{2D}   (eq. 2)
    arccos:   phi(x) = sqrt(1/D) ReLU(x W_h)                in R^{D}    (Appendix)
    non-causal (eq. 5):  y_t = phi(q_t)^T S / max(|phi(q_t) . z|, eps),
                         S = sum_j phi(k_j) v_j^T,  z = sum_j phi(k_j)
    causal (eq. 6):      S_t = S_{t-1} + phi(k_t) v_t^T,  z_t = z_{t-1} + phi(k_t)
                         y_t = phi(q_t)^T S_t / max(phi(q_t) . z_t, eps)
    gated (eq. 7):       g_t = sigmoid(w_g . x_t + b_g)  (a scalar per head)
                         S_t = g_t S_{t-1} + (1 - g_t) phi(k_t) v_t^T, z_t likewise
    out = concat_h(y) W_o + b_o
    ```

    For the Gaussian map `E[phi(x) . phi(y)] = exp(-||sigma * (x - y)||^2 / (2 tau^2))`,
    which for unit vectors and `sigma = 1` is `exp(x . y / tau^2 - 1 / tau^2)`: the
    softmax kernel `exp(q . k / tau^2)` up to a constant that cancels in the
    normalisation. So `tau` (and `1 / sigma`, learned per dimension) play the role
    of the paper's `sigma` in eq. (3)-(5). The projection is `sigma * W0 / tau` with
    standard-normal `W0`, as the authors' code (`build_random_matrices`), not the
    literal `w ~ N(0, sigma^2 I)` of the paper text.

    Random matrices: a non-trainable pool of `pool_size` matrices `W0`, shape
    `(pool_size, d, D)`, is drawn at build from `seed` (numpy, so a seed gives the
    same pool on every backend). With `training=True` each call draws `num_heads`
    of them without replacement, one per head (the authors' `sample_random_matrices`;
    they use 200-500, a smaller default keeps the saved weights small). Otherwise
    head `h` uses pool entry `h`, so the inference / exported graph holds no
    random op and is deterministic.

    Stability and precision, as the authors' code: the denominators are clamped,
    `max(|.|, eps)` for the non-causal form (`cross_attention.py`) and `max(., eps)`
    for the causal forms (`causal_attention.py`), with `eps` relative to the
    `sqrt(1/D)` scaling used here (the authors scale by 0.1 with `EPS = 1`).
    Everything from the normalisation of `q`, `k`, `v` to the division is computed
    in float32, also under a mixed-precision policy (`sigma` and the pool are never
    autocast); only the projections run in the compute dtype.

    Cost: O(N M D d) time and O(M D d) extra memory for the non-causal form (no
    N x N tensor). The causal parallel form keeps the prefix states,
    O(N M D d) memory (heads folded into the batch, rank <= 4); the gated one adds
    ceil(log2 N) scan rounds. For streaming use `initial_state` and `step`.

    Args:
        num_heads: int. Number of heads M; the token width must be divisible by
            it. Defaults to `4`.
        feature_dim: int. Number D of random projections per head; the feature
            vector has `2 D` entries (Gaussian) or `D` (arc-cosine). Defaults to `64`.
        feature_map: `"gaussian"` (random Fourier features, sin and cos) or
            `"arccos"` (ReLU random features, the order-1 arc-cosine kernel).
            Defaults to `"gaussian"`.
        causal: bool. Causal attention (token t attends to tokens <= t). Defaults
            to `False`.
        gate: bool. The learned recency gate of RFA-Gate (eq. 7); needs
            `causal=True`. Defaults to `False`.
        tau: float. Temperature dividing the random matrices (the kernel width).
            Defaults to `1.0`.
        pool_size: int. Number of pre-drawn random matrices, at least
            `num_heads`. Defaults to `8`.
        qkv_bias: bool. Bias in the qkv projection. Defaults to `True`.
        seed: int or None. Seed of the random-matrix pool and of the draws from
            it during training. `None` draws the pool from NumPy's global state
            (reproducible after `keras.utils.set_random_seed`; saved with the
            weights). Defaults to `None`.
        epsilon: float. The floor of the denominators. Defaults to `1e-2`.
        attn_dropout: float. Dropout on the attention weights: a dropped key
            token `j` (per batch, head) leaves the numerator of every query but
            not the normaliser, as dropout applied to the normalised attention
            weights with a mask shared across queries (per-pair masks would need
            the N x N matrix). Defaults to `0.0`.

    Call arguments:
        inputs: tokens, see below.
        training: bool. Draws the random matrices from the pool and enables the
            dropout.

    Input shape:
        `(batch, num_tokens, dim)` or the unfolded MobileViT layout
        `(batch, num_patches, patch_area, dim)` (attention over the patches,
        separately for each pixel position; see `TokenMixer`).

    Output shape:
        Same as the input.

    Example:
    >>> x = keras.random.normal((2, 16, 32))
    >>> layer = keras_mvit2.layers.RandomFeatureAttention(num_heads=4, causal=True, seed=0)
    >>> layer(x).shape
    (2, 16, 32)
    >>> state = layer.initial_state(2)
    >>> y0, state = layer.step(x[:, 0], state)   # streaming, one token
    >>> y0.shape
    (2, 32)

    Reference:
        Peng, Pappas, Yogatama, Schwartz, Smith, Kong, "Random Feature
        Attention", ICLR 2021, eq. (2)-(8) and the arc-cosine map of §3.3;
        the authors' code `Noahs-ARK/RFA` (`random_feature_attention/utils.py`,
        `causal_attention.py`, `cross_attention.py`).
    """

    #: The Gaussian feature map's SIN / COS and the CONCATENATION of [sin, cos] stay a float
    #: island in full int8 (entered and left by QUANTIZE / DEQUANTIZE): LiteRT has no int8
    #: SIN / COS, and their int8 form, 256-entry tables looked up by GATHER
    #: (`keras_mvit2.export.tflite.lookup_tables`, ``islands=True``), measured 2.3x slower
    #: than the island, which XNNPACK runs in float (MobileViTV2-0.5 with RFA at 256x256:
    #: 31.9 against 13.7 ms, 1 thread; `benchmarks/int8_speed.py`).
    int8_float_ops: ClassVar[frozenset[str]] = frozenset(
        {"CONCATENATION", "COS", "DEQUANTIZE", "QUANTIZE", "SIN"})

    def __init__(
        self,
        num_heads: int = 4,
        feature_dim: int = 64,
        feature_map: str = "gaussian",
        causal: bool = False,
        gate: bool = False,
        tau: float = 1.0,
        pool_size: int = 8,
        qkv_bias: bool = True,
        seed: int | None = None,
        epsilon: float = 1e-2,
        attn_dropout: float = 0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        validate_positive_ints("RandomFeatureAttention", num_heads=num_heads,
                               feature_dim=feature_dim, pool_size=pool_size)
        if feature_map not in FEATURE_MAPS:
            raise ValueError(
                f"RandomFeatureAttention: feature_map must be one of {FEATURE_MAPS}. "
                f"Received: feature_map={feature_map!r}"
            )
        if gate and not causal:
            raise ValueError(
                "RandomFeatureAttention: gate=True is the causal RFA-Gate (eq. 7); it "
                f"needs causal=True. Received: gate={gate}, causal={causal}"
            )
        if pool_size < num_heads:
            raise ValueError(
                "RandomFeatureAttention: pool_size must be at least num_heads (one "
                "distinct matrix per head). "
                f"Received: pool_size={pool_size}, num_heads={num_heads}"
            )
        if not tau > 0:
            raise ValueError(f"RandomFeatureAttention: tau must be > 0. Received: tau={tau}")
        if not epsilon > 0:
            raise ValueError(
                f"RandomFeatureAttention: epsilon must be > 0. Received: epsilon={epsilon}"
            )
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise ValueError(
                f"RandomFeatureAttention: seed must be an int or None. Received: seed={seed!r}"
            )
        validate_rates(attn_dropout=attn_dropout)
        self.num_heads = num_heads
        self.feature_dim = feature_dim
        self.feature_map = feature_map
        self.causal = causal
        self.gate = gate
        self.tau = tau
        self.pool_size = pool_size
        self.qkv_bias = qkv_bias
        self.seed = seed
        self.epsilon = epsilon
        self.attn_dropout = attn_dropout
        self._pool_seed_generator = keras.random.SeedGenerator(seed)

    @property
    def num_features(self) -> int:
        """Size of phi(x): `2 * feature_dim` (Gaussian) or `feature_dim` (arc-cosine)."""
        return 2 * self.feature_dim if self.feature_map == "gaussian" else self.feature_dim

    # ------------------------------------------------------------------ build

    def build_tokens(self, token_shape):
        dim = int(token_shape[-1])
        self.dim = dim
        self.head_dim = head_dim_of("RandomFeatureAttention", dim, self.num_heads)
        policy = self.dtype_policy
        token_shape = tuple(token_shape)
        self.qkv = dense_on_tokens(3 * dim, self.qkv_bias, "qkv", policy)
        self.qkv.build(token_shape)
        if self.gate:
            self.gate_proj = dense_on_tokens(self.num_heads, True, "gate", policy)
            self.gate_proj.build(token_shape)
        self.proj = dense_on_tokens(dim, True, "proj", policy)
        self.proj.build(token_shape)
        self.sigma = self.add_weight(
            name="sigma",
            shape=(self.num_heads, self.head_dim),
            initializer="ones",
            dtype="float32",
            autocast=False,
        )
        # Without a seed the pool follows NumPy's global state, which
        # `keras.utils.set_random_seed` seeds, as Keras' own initializers follow it.
        rng = np.random.default_rng(
            self.seed if self.seed is not None else np.random.randint(2**31 - 1))

        def standard_normal(shape, dtype=None):
            return ops.convert_to_tensor(rng.standard_normal(shape).astype("float32"))

        self.random_pool = self.add_weight(
            name="random_pool",
            shape=(self.pool_size, self.head_dim, self.feature_dim),
            initializer=standard_normal,
            dtype="float32",
            trainable=False,
            autocast=False,
        )
        # Dropped key tokens: mask shared over the head channels.
        self.attn_drop = keras.layers.Dropout(
            self.attn_dropout,
            noise_shape=(None, None, None, 1),
            seed=None if self.seed is None else self.seed + 1,
            dtype="float32",
        )

    # ------------------------------------------------------------------ pieces

    def projection_matrices(self, training: bool | None = None):
        """`W_h = sigma_h * W0_h / tau` for every head, `(num_heads, head_dim, feature_dim)`.

        `training=True` draws `num_heads` distinct pool entries at random (one
        random op); otherwise head `h` uses pool entry `h` (no random op).
        """
        pool = ops.convert_to_tensor(self.random_pool)             # (P, d, D)
        if training:
            order = keras.random.shuffle(
                ops.arange(self.pool_size), seed=self._pool_seed_generator)
            w0 = ops.take(pool, order[: self.num_heads], axis=0)    # (M, d, D)
        else:
            w0 = pool[: self.num_heads]                             # (M, d, D)
        sigma = ops.convert_to_tensor(self.sigma)                   # (M, d)
        return ops.expand_dims(sigma, -1) * w0 / self.tau

    def random_features(self, x, matrices=None):
        """phi(x) for per-head vectors `x` of shape `(batch, heads, tokens, head_dim)`.

        `x` is l2-normalised first. `matrices` defaults to the inference
        matrices. Returns float32 `(batch, heads, tokens, num_features)`.
        """
        if matrices is None:
            matrices = self.projection_matrices(training=False)
        x = ops.cast(x, "float32")
        # x * x, not SQUARE (which has no int8 kernel); the division as products by rsqrt
        norm = ops.sqrt(ops.sum(x * x, axis=-1, keepdims=True))
        x = divide_positive(x, norm + NORM_EPSILON)                 # (B, M, N, d)
        z = ops.matmul(x, matrices)                                 # (B, M, N, D)
        scale = 1.0 / math.sqrt(self.feature_dim)
        if self.feature_map == "gaussian":
            return ops.concatenate([ops.sin(z), ops.cos(z)], axis=-1) * scale  # (B, M, N, 2D)
        return ops.relu(z) * scale                                  # (B, M, N, D)

    def _project(self, tokens):
        """float32 `q, k, v` `(B, M, N, d)` and the gates `(B, M, N)` (or None)."""
        qkv = ops.cast(self.qkv(tokens), "float32")                 # (B, N, 3C)
        query, key, value = (split_heads(t, self.num_heads, self.head_dim)
                             for t in ops.split(qkv, 3, axis=-1))   # 3 x (B, M, N, d)
        gates = None
        if self.gate:
            logits = ops.cast(self.gate_proj(tokens), "float32")    # (B, N, M)
            gates = ops.transpose(ops.sigmoid(logits), (0, 2, 1))   # (B, M, N)
        return query, key, value, gates

    def _merge_heads(self, y):
        """`(B, M, N, d)` -> the output projection `(B, N, C)`, in the compute dtype."""
        return self.proj(ops.cast(merge_heads(y), self.compute_dtype))

    def _noncausal(self, phi_q, phi_k, value):
        num, den = kernel_attention(phi_q, phi_k, value)            # (B, M, N, d), (.., 1)
        return divide_positive(num, ops.maximum(ops.abs(den), self.epsilon))

    def _causal(self, phi_q, phi_k, value, gates, num_tokens):
        feats, head_dim = self.num_features, self.head_dim
        pq = ops.reshape(phi_q, (-1, num_tokens, feats))            # (BM, N, F)
        pk = ops.reshape(phi_k, (-1, num_tokens, feats))            # (BM, N, F)
        v = ops.reshape(value, (-1, num_tokens, head_dim))          # (BM, N, d)
        kv = ops.expand_dims(pk, -1) * ops.expand_dims(v, 2)        # (BM, N, F, d)
        if gates is None:
            s = ops.cumsum(kv, axis=1)                              # (BM, N, F, d)
            z = ops.cumsum(pk, axis=1)                              # (BM, N, F)
        else:
            g = ops.reshape(gates, (-1, num_tokens))                # (BM, N)
            s, z = _gated_cumsum(g, kv, pk)
        num = ops.squeeze(ops.matmul(ops.expand_dims(pq, 2), s), 2)  # (BM, N, d)
        den = ops.sum(pq * z, axis=-1, keepdims=True)               # (BM, N, 1)
        y = divide_positive(num, ops.maximum(den, self.epsilon))    # (BM, N, d)
        return ops.reshape(y, (-1, self.num_heads, num_tokens, head_dim))  # (B, M, N, d)

    # ------------------------------------------------------------------ call

    def mix(self, tokens, training=None):
        num_tokens = _static_or_dynamic(tokens, 1)
        query, key, value, gates = self._project(tokens)            # (B, M, N, d) float32
        matrices = self.projection_matrices(training=training)      # (M, d, D)
        phi_q = self.random_features(query, matrices)               # (B, M, N, F)
        phi_k = self.random_features(key, matrices)                 # (B, M, N, F)
        value = self.attn_drop(value, training=training)
        if self.causal:
            y = self._causal(phi_q, phi_k, value, gates, num_tokens)
        else:
            y = self._noncausal(phi_q, phi_k, value)                # (B, M, N, d)
        return self._merge_heads(y)

    # ------------------------------------------------------------------ streaming

    def initial_state(self, batch_size: int):
        """The empty recurrent state `(S_0, z_0)` of the causal form (float32 zeros).

        `S` is `(batch, heads, num_features, head_dim)`, `z` is
        `(batch, heads, num_features)`. The layer must be built.
        """
        self._check_streaming()
        return (
            ops.zeros((batch_size, self.num_heads, self.num_features, self.head_dim), "float32"),
            ops.zeros((batch_size, self.num_heads, self.num_features), "float32"),
        )

    def step(self, inputs, state):
        """One token of the causal (gated) RFA as a recurrence, eq. (6)-(7).

        Uses the inference random matrices (no dropout, no draw), so feeding a
        sequence token by token gives the output of `layer(x, training=False)`.

        Args:
            inputs: the token `x_t`, `(batch, dim)`.
            state: `(S_{t-1}, z_{t-1})`, from `initial_state` or the last step.

        Returns:
            `(y_t, (S_t, z_t))` with `y_t` of shape `(batch, dim)`.
        """
        if not self.causal:
            raise ValueError(
                "RandomFeatureAttention.step is the causal recurrence; the layer was "
                f"created with causal=False. Received: causal={self.causal}"
            )
        if len(inputs.shape) != 2:
            raise ValueError(
                "RandomFeatureAttention.step takes one token per sequence, "
                f"(batch, dim). Received: inputs.shape={inputs.shape}"
            )
        if not self.built:
            self.build((None, None, inputs.shape[-1]))
        prev_s, prev_z = state
        query, key, value, gates = self._project(ops.expand_dims(inputs, 1))  # (B, M, 1, d)
        matrices = self.projection_matrices(training=False)
        phi_q = ops.squeeze(self.random_features(query, matrices), 2)  # (B, M, F)
        phi_k = ops.squeeze(self.random_features(key, matrices), 2)    # (B, M, F)
        value = ops.squeeze(value, 2)                                  # (B, M, d)
        kv = ops.expand_dims(phi_k, -1) * ops.expand_dims(value, 2)    # (B, M, F, d)
        if gates is None:
            s = prev_s + kv
            z = prev_z + phi_k
        else:
            g = gates                                                  # (B, M, 1)
            s = ops.expand_dims(g, -1) * prev_s + ops.expand_dims(1.0 - g, -1) * kv
            z = g * prev_z + (1.0 - g) * phi_k
        num = ops.squeeze(ops.matmul(ops.expand_dims(phi_q, 2), s), 2)  # (B, M, d)
        den = ops.sum(phi_q * z, axis=-1, keepdims=True)                # (B, M, 1)
        y = divide_positive(num, ops.maximum(den, self.epsilon))        # (B, M, d)
        y = self._merge_heads(ops.expand_dims(y, 2))                    # (B, 1, C)
        return ops.squeeze(y, 1), (s, z)

    def _check_streaming(self):
        if not self.causal:
            raise ValueError(
                "RandomFeatureAttention: the recurrent state exists for the causal form "
                f"only. Received: causal={self.causal}"
            )
        if not self.built:
            raise ValueError(
                "RandomFeatureAttention: build the layer (or call it once) before "
                f"initial_state. Received: built={self.built}"
            )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "feature_dim": self.feature_dim,
                "feature_map": self.feature_map,
                "causal": self.causal,
                "gate": self.gate,
                "tau": self.tau,
                "pool_size": self.pool_size,
                "qkv_bias": self.qkv_bias,
                "seed": self.seed,
                "epsilon": self.epsilon,
                "attn_dropout": self.attn_dropout,
            }
        )
        return config
