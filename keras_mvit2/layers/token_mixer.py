"""Base class of the attention layers: one interface for every token mixer."""

from typing import ClassVar

import keras
from keras import ops


class TokenMixer(keras.layers.Layer):
    """Base of the attention layers: tokens in, tokens of the same shape out.

    Every attention layer of keras_mvit2 accepts

    - `(batch, num_tokens, dim)`: a plain token sequence (ViT / DeiT), or
    - `(batch, num_patches, patch_area, dim)`: the unfolded MobileViT layout,
      where attention runs over the patches separately for each pixel position.

    Tokens are always on axis 1. A subclass implements `build_tokens(shape)` and
    `mix(tokens, training)` for `(batch', num_tokens, dim)`; this base folds the
    pixel axis of the MobileViT layout into the batch (one transpose and reshape
    each way, rank stays 4) so the subclass never sees it. Layers that handle
    the 4-D layout natively (the separable attention) override `call`.

    `int8_float_ops` declares the TFLite ops a full-int8 conversion may leave in
    float (the export contract, `keras_mvit2.attention.int8_float_ops`); empty: none.
    """

    int8_float_ops: ClassVar[frozenset[str]] = frozenset()

    def build(self, input_shape):
        if len(input_shape) not in (3, 4) or input_shape[-1] is None:
            raise ValueError(
                f"{type(self).__name__} expects (batch, tokens, dim) or "
                "(batch, patches, patch_area, dim) with a known dim. "
                f"Received: input_shape={input_shape}"
            )
        if len(input_shape) == 4:
            batch = None if input_shape[0] is None or input_shape[2] is None else (
                input_shape[0] * input_shape[2])
            token_shape = (batch, input_shape[1], input_shape[3])
        else:
            token_shape = tuple(input_shape)
        self.build_tokens(token_shape)

    def build_tokens(self, token_shape):
        """Creates the weights for tokens of shape `(batch, num_tokens, dim)`."""
        raise NotImplementedError

    def mix(self, tokens, training=None):
        """`(batch, num_tokens, dim)` -> `(batch, num_tokens, dim)`."""
        raise NotImplementedError

    def call(self, inputs, training=None):
        if len(inputs.shape) == 3:
            return self.mix(inputs, training=training)
        num_patches, patch_area, dim = inputs.shape[1], inputs.shape[2], inputs.shape[3]
        if num_patches is None:  # a dynamic-size model: the patch count of this call
            num_patches = ops.shape(inputs)[1]
        x = ops.transpose(inputs, (0, 2, 1, 3))                   # (B, P, N, d)
        x = ops.reshape(x, (-1, num_patches, dim))                # (B*P, N, d)
        y = self.mix(x, training=training)
        y = ops.reshape(y, (-1, patch_area, num_patches, dim))    # (B, P, N, d)
        return ops.transpose(y, (0, 2, 1, 3))                     # (B, N, P, d)

    def compute_output_shape(self, input_shape):
        return input_shape
