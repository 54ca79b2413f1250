"""`tiny_mvit2`: a two-stage network of the package's own layers (stem, InvertedResidual,
MobileViTV2Block with stochastic depth and any registered attention, classifier head),
registered as a model name on import, so that training tests trace cheaply on 2 shared
cores.

Imports no TensorFlow: the backend workers (`backend_worker.py`) train it on JAX and
PyTorch too.
"""

import keras

from keras_mvit2.layers import InvertedResidual
from keras_mvit2.layers.inverted_residual import batch_norm
from keras_mvit2.models import MobileViTV2Block, list_models
from keras_mvit2.models.builder_utils import classifier_head, load_weights, model_input
from keras_mvit2.models.registry import register_model


def tiny_mvit2(
    include_top=True,
    weights=None,
    input_tensor=None,
    input_shape=None,
    pooling=None,
    classes=10,
    classifier_activation="softmax",
    dropout=0.0,
    name="tiny_mvit2",
    *,
    drop_path_rate=0.0,
    attention="separable",
):
    inputs, x = model_input(input_tensor, input_shape or (32, 32, 3))
    x = keras.layers.ZeroPadding2D(1, name="stem_pad")(x)
    x = keras.layers.Conv2D(16, 3, strides=2, use_bias=False, name="stem_conv")(x)
    x = batch_norm("stem_bn")(x)
    x = keras.layers.Activation("silu", name="stem_act")(x)
    x = InvertedResidual(24, strides=2, name="stage1_block0")(x)
    x = MobileViTV2Block(16, 2, attention=attention, drop_path=[0.0, drop_path_rate],
                         name="stage2_block1")(x)
    outputs = classifier_head(x, include_top=include_top, pooling=pooling, classes=classes,
                              classifier_activation=classifier_activation, dropout=dropout)
    model = keras.Model(inputs, outputs, name=name)
    load_weights(model, weights)
    return model


if "tiny_mvit2" not in list_models():
    register_model(tiny_mvit2)
