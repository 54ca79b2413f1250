"""Mobile-Attention: head-competitive flow attention (Yao et al., ICML 2024)."""

import keras
from keras import ops

from keras_mvit2.api_export import serializable
from keras_mvit2.layers import attention_registry
from keras_mvit2.layers.functional import (
    divide_positive,
    flow_factor,
    kernel_numerator,
    mobile_attention_flows,
)
from keras_mvit2.layers.multi_head_attention import dense_on_tokens, head_dim_of
from keras_mvit2.layers.token_mixer import TokenMixer
from keras_mvit2.utils.arguments import validate_positive_ints, validate_rates

NORMALIZERS = ("head_flow", "tokens")


def _sizes(x):
    """`(batch, num_tokens, patch_area)` of `(B, N, D)` or `(B, N, P, D)` inputs.

    Static sizes where known (the fewest ops in TFLite), `-1` for the batch,
    shape tensors for a dynamic token count.
    """
    p = x.shape[2] if len(x.shape) == 4 else 1
    if x.shape[1] is not None:
        return -1, x.shape[1], p
    return ops.shape(x)[0], ops.shape(x)[1], p


@attention_registry.register("mobile_attention", "mobiatt", "mobile")
@serializable
class MobileAttention(TokenMixer):
    """Mobile-Attention (MobiAtt): flow attention with heads competing per token.

    Follows the authors' code (`thuml/MobileAttention`, `Mobile_Attention.py`,
    commit a156599), which is Flowformer's flow attention with the flows summed
    over the **heads** of one token instead of over the tokens. For tokens `x`
    (N of them, width D = M heads x d channels), with phi = sigmoid, eps added to
    both factors of every flow dot product as the code does, and `<.,.>` a sum
    over the d channels of one head:

    ```
    q, k, v = split(W_qkv x + b)                  # (M, N, d) each; q, k <- phi(q), phi(k)
    I_t^h  = <q_t^h + eps, sum_h' k_t^h' + eps>                 # incoming flow
    O_t^h  = <k_t^h + eps, sum_h' q_t^h' + eps>                 # outgoing flow
    Ī_t^h  = <q_t^h + eps, sum_h' k_t^h' / O_t^h' + eps>        # conserved incoming
    Ō_t^h  = <k_t^h + eps, sum_h' q_t^h' / I_t^h' + eps>        # conserved outgoing
    c^h    = N * softmax_over_tokens(clip(Ō^h, -1, 1))          # competition
    a_t^h  = sigmoid(Ī_t^h)                                     # allocation
    y_t^h  = a_t^h * q_t^h (sum_j k_j^hT (c_j^h v_j^h)) / Z_t^h   # Z: the normaliser
    y = W_o concat_h(y^h) + b_o
    ```

    The heads share a budget at each token: `sum_h Ī_t^h = M` and
    `sum_h Ō_t^h = M` (up to eps, before the clip); this is the head
    competition. The competition weights of each head sum to N over the tokens.

    The normaliser: `normalizer="head_flow"` (default) uses `Z_t^h = I_t^h`, the
    head flow, exactly as the official code ("for value normalization"). The
    numerator sums N tokens while `I` sums M heads, so the output grows like
    N / M with the number of tokens (fine at a fixed resolution, where training
    absorbs it). `normalizer="tokens"` uses Flowformer's per-head token
    normaliser `Z_t^h = <q_t^h + eps, sum_j k_j^h + eps>` (eps placed as in
    `thuml/Flowformer:Flow_Attention.py`): resolution-stable, but a deviation
    from the MobiAtt code.
    The allocation factor `N_q / N_k` of the code is 1 (self-attention only: the
    flows compare heads token by token) and is left out.

    The token mixing `q k^T (c v)` is `functional.kernel_numerator`: `q (k^T (c v))`
    through a `(d, d)` matrix per head (linear cost, no N x N tensor) for N >= d
    tokens, `(q k^T) (c v)` for fewer (it takes fewer multiply-adds: MobileViTV2's
    4 and 1 tokens of 24 and 32 channels at 64x64); two BATCH_MATMUL in TFLite
    either way, and every tensor has rank <= 4. Under
    mixed precision the flows and the token mixing run in float32 (eps = 1e-6 is
    subnormal in float16); the projections use the compute dtype.

    Args:
        num_heads: int. Number of heads M; `dim` must be divisible by it.
            Defaults to `4`.
        normalizer: str. `"head_flow"` (the official code) or `"tokens"`
            (Flowformer's per-head token normaliser). Defaults to `"head_flow"`.
        qkv_bias: bool. Bias in the query/key/value projection. Defaults to
            `True` (the official `nn.Linear` layers have one).
        eps: float. The flow epsilon. Defaults to `1e-6`, as the code.
        attn_dropout: float. Dropout on the competition weights `c` (the
            per-token source weights, the role attention scores play in other
            mechanisms; the official code has none). Defaults to `0.0`.
        proj_dropout: float. Dropout after the output projection. Defaults to
            `0.0`, as the authors' vision code (Flowformer_CV; the blocks own the
            dropout on the attention output); `0.05` matches the standalone
            `Mobile_Attention.py`.
        kernel_initializer: initializer of both projection kernels. Defaults to
            a truncated normal with stddev 0.02 (timm / Flowformer_CV).
        bias_initializer: initializer of both projection biases. Defaults to
            `"zeros"`.

    Call arguments:
        inputs: tokens, see below.
        training: bool, enables the dropouts.

    Input shape:
        `(batch, num_tokens, dim)` or the unfolded MobileViT layout
        `(batch, num_patches, patch_area, dim)` (attention over the patches,
        separately for each pixel position; handled natively with one transpose
        each way, the same result as `TokenMixer`'s fold). Tokens are always on
        axis 1.

    Output shape:
        Same as the input.

    Example:
    >>> x = keras.random.normal((2, 64, 32))
    >>> keras_mvit2.layers.MobileAttention(num_heads=4)(x).shape
    (2, 64, 32)

    Reference:
        Yao, Wang, Wu, Wang & Long, "Mobile Attention: Mobile-Friendly Linear
        Attention for Vision Transformers", ICML 2024; code
        https://github.com/thuml/MobileAttention (`Mobile_Attention.py`).
        Wu et al., "Flowformer: Linearizing Transformers with Conservation
        Flows", ICML 2022 (the token normaliser).
    """

    def __init__(
        self,
        num_heads: int = 4,
        normalizer: str = "head_flow",
        qkv_bias: bool = True,
        eps: float = 1e-6,
        attn_dropout: float = 0.0,
        proj_dropout: float = 0.0,
        kernel_initializer=None,
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        validate_positive_ints("MobileAttention", num_heads=num_heads)
        if normalizer not in NORMALIZERS:
            raise ValueError(
                f"normalizer must be one of {NORMALIZERS}. Received: normalizer={normalizer!r}"
            )
        if not eps > 0.0:
            raise ValueError(f"eps must be positive. Received: eps={eps}")
        validate_rates(attn_dropout=attn_dropout, proj_dropout=proj_dropout)
        self.num_heads = num_heads
        self.normalizer = normalizer
        self.qkv_bias = qkv_bias
        self.eps = eps
        self.attn_dropout = attn_dropout
        self.proj_dropout = proj_dropout
        self.kernel_initializer = keras.initializers.get(
            kernel_initializer
            if kernel_initializer is not None
            else keras.initializers.TruncatedNormal(stddev=0.02)
        )
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def build_tokens(self, token_shape):
        dim = int(token_shape[-1])
        self.dim = dim
        self.head_dim = head_dim_of("MobileAttention", dim, self.num_heads)
        inits = (self.kernel_initializer, self.bias_initializer)
        self.qkv = dense_on_tokens(3 * dim, self.qkv_bias, "qkv", self.dtype_policy, *inits)
        self.qkv.build(tuple(token_shape))
        self.proj = dense_on_tokens(dim, True, "proj", self.dtype_policy, *inits)
        self.proj.build(tuple(token_shape))
        # on the float32 competition weights, also under mixed precision
        self.competition_dropout = keras.layers.Dropout(self.attn_dropout, dtype="float32")
        self.output_dropout = keras.layers.Dropout(self.proj_dropout, dtype=self.dtype_policy)

    # ------------------------------------------------------------------ pieces

    def _heads(self, inputs):
        """phi(q), phi(k), v as `(batch * patch_area, heads, tokens, head_dim)`, float32.

        `inputs` is `(B, N, D)` (patch_area 1) or `(B, N, P, D)`. The projection
        runs on `(B, N * P, D)` (a free reshape); one transpose brings tokens
        next to the channels for every head, pixel and q/k/v at once.
        """
        batch, n, p = _sizes(inputs)
        m, d = self.num_heads, self.head_dim
        qkv = self.qkv(ops.reshape(inputs, (batch, n * p, self.dim)))  # (B, N*P, 3D)
        if self.compute_dtype != "float32":
            qkv = ops.cast(qkv, "float32")
        qkv = ops.reshape(qkv, (batch, n, p * 3 * m, d))            # (B, N, P*3M, d)
        qkv = ops.transpose(qkv, (0, 2, 1, 3))                      # (B, P*3M, N, d)
        qkv = ops.reshape(qkv, (-1, 3 * m, n, d))                   # (B*P, 3M, N, d)
        q, k, v = ops.split(qkv, 3, axis=1)                         # (B*P, M, N, d) each
        return ops.sigmoid(q), ops.sigmoid(k), v

    def _flows(self, q, k):
        """The flows of `q`, `k` (`(B, M, N, d)`, after phi), each `(B, M, N)`."""
        return mobile_attention_flows(q, k, self.eps)

    def _normaliser(self, q, k, incoming):
        if self.normalizer == "head_flow":
            return incoming                                         # (B, M, N)
        k_tokens = ops.sum(k, axis=2, keepdims=True)                # (B, M, 1, d) sum of tokens
        return ops.sum(flow_factor(q, self.eps) * flow_factor(k_tokens, self.eps),
                       axis=-1)                                     # (B, M, N)

    # ------------------------------------------------------------------ public

    def flows(self, tokens) -> dict:
        """The intermediate flows, for inspection and tests.

        Args:
            tokens: `(batch, num_tokens, dim)`, or the MobileViT layout
                `(batch, num_patches, patch_area, dim)`, whose pixel axis is
                folded into the batch (`batch * patch_area`, pixel-minor).

        Returns:
            A dict of float32 tensors of shape `(batch, num_heads, num_tokens)`:
            `incoming` (I), `outgoing` (O), `conserved_incoming` (Ī),
            `conserved_outgoing` (Ō, before the clip), `competition`
            (`N * softmax(clip(Ō))` over tokens, before the attention dropout)
            and `allocation` (`sigmoid(Ī)`).
        """
        if not self.built:
            self.build(tuple(tokens.shape))
        q, k, _ = self._heads(ops.convert_to_tensor(tokens, self.compute_dtype))
        return self._flows(q, k)

    def call(self, inputs, training=None):
        batch, n, p = _sizes(inputs)
        q, k, v = self._heads(inputs)                               # (B*P, M, N, d) each
        flows = self._flows(q, k)
        competition = self.competition_dropout(flows["competition"], training=training)
        v = v * ops.expand_dims(competition, -1)                    # (B*P, M, N, d)
        y = kernel_numerator(q, k, v)                               # (B*P, M, N, d)
        scale = divide_positive(flows["allocation"],
                                self._normaliser(q, k, flows["incoming"]))  # (B*P, M, N)
        y = y * ops.expand_dims(scale, -1)                          # (B*P, M, N, d)
        y = ops.reshape(y, (batch, p * self.num_heads, n, self.head_dim))  # (B, P*M, N, d)
        y = ops.transpose(y, (0, 2, 1, 3))                          # (B, N, P*M, d)
        y = ops.reshape(y, (batch, n * p, self.dim))                # (B, N*P, D)
        y = self.output_dropout(self.proj(ops.cast(y, self.compute_dtype)), training=training)
        return ops.reshape(y, (batch, n, p, self.dim)) if len(inputs.shape) == 4 else y

    def mix(self, tokens, training=None):
        return self.call(tokens, training=training)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "normalizer": self.normalizer,
                "qkv_bias": self.qkv_bias,
                "eps": self.eps,
                "attn_dropout": self.attn_dropout,
                "proj_dropout": self.proj_dropout,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
