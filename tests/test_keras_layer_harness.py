"""Keras' own layer harness on every public layer: `keras.src.testing.TestCase.run_layer_test`.

The test Keras holds each of its own layers to (serialization round trip, build, symbolic
and eager calls, a compiled training step, mixed precision on TensorFlow / JAX, masking),
imported from the installed Keras and called with its own default tolerances. The layers:
every layer class of `keras_mvit2.layers` (the five registered attentions among them; the
abstract `TokenMixer` is covered through its subclasses) and `MobileViTV2Block`;
`test_every_public_layer_has_a_case` fails when a new public layer has none.

Runs on the default backend in the fast tier, and under `KERAS_BACKEND=jax` and
`KERAS_BACKEND=torch` as steps of `.ci/run`. It imports no TensorFlow itself: on PyTorch
the module runs TensorFlow-free (`test_no_tensorflow_on_torch`).
"""

import sys

import keras
import numpy as np
from absl.testing import parameterized
from keras.src.testing import TestCase

import keras_mvit2 as mv
from keras_mvit2 import layers
from keras_mvit2.layers import attention_registry
from keras_mvit2.layers.token_mixer import TokenMixer
from keras_mvit2.models import MobileViTV2Block

#: (batch, patches, patch area, dim): the unfolded MobileViT layout the attentions, GN1 and
#: the transformer layer take in the models (tokens on axis 1).
PATCHES = (2, 16, 4, 16)


def _images(shape: tuple[int, ...], seed: int = 0, high: float = 255.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.0, high, shape).astype("float32")


def _group_norm1(x: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """GN1 with gamma 1, beta 0 (a fresh layer), in float64: one mean and one variance per
    sample over every other axis."""
    x = x.astype("float64")
    axes = tuple(range(1, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return ((x - mean) / np.sqrt(var + eps)).astype("float32")


_GN_INPUT = np.random.default_rng(3).normal(0.5, 2.0, PATCHES).astype("float32")

#: name -> (class, the keyword arguments of `run_layer_test`). Weight counts are stated
#: where the layer's structure fixes them (Keras' own layer tests do the same).
CASES: dict[str, tuple[type, dict]] = {
    # The attentions of `keras_mvit2.attention`, on the MobileViT layout.
    "separable": (layers.SeparableSelfAttention, dict(
        init_kwargs={}, input_shape=PATCHES, expected_output_shape=PATCHES,
        # the qkv projection d -> 1 + 2d and the output projection, each kernel + bias
        expected_num_trainable_weights=4, expected_num_non_trainable_weights=0)),
    "mha": (layers.MultiHeadSelfAttention, dict(
        init_kwargs={"num_heads": 2}, input_shape=PATCHES, expected_output_shape=PATCHES,
        expected_num_non_trainable_weights=0)),
    "linformer": (layers.LinformerSelfAttention, dict(
        init_kwargs={"num_heads": 2, "projected_tokens": 8}, input_shape=PATCHES,
        expected_output_shape=PATCHES, expected_num_non_trainable_weights=0)),
    "rfa": (layers.RandomFeatureAttention, dict(
        init_kwargs={"num_heads": 2, "feature_dim": 8, "seed": 1}, input_shape=PATCHES,
        expected_output_shape=PATCHES)),
    "mobile_attention": (layers.MobileAttention, dict(
        init_kwargs={"num_heads": 2}, input_shape=PATCHES, expected_output_shape=PATCHES,
        expected_num_non_trainable_weights=0)),
    # The other layers of `keras_mvit2.layers`.
    "group_norm1": (layers.GroupNorm1, dict(
        init_kwargs={}, input_data=_GN_INPUT, expected_output=_group_norm1(_GN_INPUT),
        expected_num_trainable_weights=2, expected_num_non_trainable_weights=0,
        supports_masking=True)),
    "transformer_layer": (layers.TransformerLayer, dict(
        init_kwargs={"ffn_dim": 32, "drop_path": 0.1}, input_shape=PATCHES,
        expected_output_shape=PATCHES,
        # GN1 x 2 (gamma, beta), the separable attention (4), the FFN's two 1x1 convs
        # (kernel + bias each); one seed generator per stochastic-depth branch
        expected_num_trainable_weights=12, expected_num_non_trainable_weights=0,
        expected_num_seed_generators=2)),
    "inverted_residual": (layers.InvertedResidual, dict(
        init_kwargs={"filters": 16, "strides": 2}, input_shape=(2, 9, 9, 8),
        expected_output_shape=(2, 5, 5, 16),
        # three convs (no bias) + three BatchNorms (gamma, beta; moving mean, variance)
        expected_num_trainable_weights=9, expected_num_non_trainable_weights=6)),
    "stochastic_depth": (layers.StochasticDepth, dict(
        init_kwargs={"rate": 0.25, "seed": 7}, input_shape=(2, 4, 8),
        expected_output_shape=(2, 4, 8), expected_num_trainable_weights=0,
        expected_num_seed_generators=1, supports_masking=True)),
    "eval_resize_crop": (layers.EvalResizeCrop, dict(
        init_kwargs={"size": 8, "crop_pct": 0.888}, input_data=_images((2, 13, 11, 3)),
        expected_output_shape=(2, 8, 8, 3), expected_output_dtype="float32",
        expected_num_trainable_weights=0, expected_num_non_trainable_weights=0)),
    # The MobileViTv2 block (keras_mvit2.models), an odd-sized map: the block's resize runs.
    "mobilevitv2_block": (MobileViTV2Block, dict(
        init_kwargs={"attention_dim": 16, "num_layers": 2, "ffn_dim": 32},
        input_shape=(2, 7, 8, 24), expected_output_shape=(2, 8, 8, 24))),
}


def _public_layer_classes() -> set[type]:
    """The layer classes of `keras_mvit2.layers.__all__` (but the abstract `TokenMixer`), the
    registered attentions and `MobileViTV2Block`."""
    public = {getattr(layers, name) for name in layers.__all__}
    public = {obj for obj in public
              if isinstance(obj, type) and issubclass(obj, keras.layers.Layer)}
    public |= {attention_registry.get_class(name) for name in mv.attention.available()}
    return (public - {TokenMixer}) | {MobileViTV2Block}


class KerasLayerHarnessTest(TestCase):
    @parameterized.named_parameters(*((name, name) for name in CASES))
    def test_run_layer_test(self, name):
        cls, kwargs = CASES[name]
        # The harness compares the output's type with the expected one's: a backend tensor.
        tensors = {key: keras.ops.convert_to_tensor(kwargs[key])
                   for key in ("input_data", "expected_output") if key in kwargs}
        self.run_layer_test(cls, **{**kwargs, **tensors})

    def test_every_public_layer_has_a_case(self):
        self.assertEqual({cls for cls, _ in CASES.values()}, _public_layer_classes())

    def test_no_tensorflow_on_torch(self):
        """The PyTorch step runs this module in a process of its own: nothing here (the
        layers, Keras' harness) loads TensorFlow beside torch."""
        if keras.backend.backend() != "torch":
            self.skipTest("the TensorFlow-free check is for the PyTorch backend")
        if "keras_hub" in sys.modules:
            self.skipTest("keras_hub, imported by another module of this run, loads TensorFlow")
        self.assertNotIn("tensorflow", sys.modules)
