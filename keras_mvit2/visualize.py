"""Context-score maps of separable self-attention (the paper's Fig. 5 and Fig. 8).

Each separable attention layer computes context scores c_s for the P pixels of
every patch across the N patches (M x N in the paper's notation). Folding them
back onto the feature-map grid gives one H x W map per layer, which is min-max
normalized and overlaid on the input image.
"""

import os
from dataclasses import dataclass

import keras
import numpy as np

from keras_mvit2.layers.patching import fold
from keras_mvit2.layers.separable_self_attention import SeparableSelfAttention
from keras_mvit2.models.mobilevitv2.mobilevitv2_block import MobileViTV2Block
from keras_mvit2.utils.files import atomic_output


@dataclass
class ContextScoreMap:
    """The context scores of one attention layer, folded to its feature-map grid."""

    block: str             # the MobileViTV2Block's layer name
    layer_index: int       # transformer layer inside the block
    output_stride: int     # input size / feature-map size
    scores: np.ndarray     # (H, W) raw context scores (each pixel-in-patch sums to 1)
    normalized: np.ndarray  # (H, W) min-max normalized to [0, 1]
    num_patches: int = 0   # N, the patches the scores are spread over

    @property
    def is_flat(self) -> bool:
        """True when the map carries no information: one patch (every score is 1) or equal
        scores everywhere; its normalized map is all zeros."""
        return self.num_patches == 1 or float(np.ptp(self.scores)) < 1e-12


def scores_to_map(scores: np.ndarray, grid_size: tuple[int, int], patch_size: int = 2):
    """Folds context scores `(batch, N, P)` to `(batch, rows * p, cols * p)`.

    Score `[b, i * cols + j, ph * p + pw]` lands on pixel `(p * i + ph, p * j + pw)`,
    the inverse of the unfold the attention saw.
    """
    scores = np.asarray(scores, dtype="float32")
    folded = fold(scores[..., None], grid_size, patch_size)
    return keras.ops.convert_to_numpy(folded)[..., 0]


def _min_max(x: np.ndarray) -> np.ndarray:
    low, high = float(x.min()), float(x.max())
    return np.zeros_like(x) if high - low < 1e-12 else (x - low) / (high - low)


def _block_inputs(model: keras.Model, blocks: list[MobileViTV2Block]) -> keras.Model:
    return keras.Model(model.inputs, [block.input for block in blocks])


def context_scores(model: keras.Model, image: np.ndarray) -> list[ContextScoreMap]:
    """Context-score maps of every separable attention layer of `model` for one image.

    Args:
        model: a MobileViTv2 built by keras_mvit2 (any width and input size) whose
            blocks use separable self-attention.
        image: `(H, W, 3)` RGB, uint8 in [0, 255] or float in [0, 1], already at the
            model's input size.

    Returns:
        One `ContextScoreMap` per attention layer, in network order.
    """
    blocks = [layer for layer in model.layers if isinstance(layer, MobileViTV2Block)]
    if not blocks:
        raise ValueError(
            f"Model {model.name!r} has no MobileViTV2Block: context scores exist only for "
            "MobileViTv2 models."
        )
    expected = tuple(model.input_shape[1:])
    image = np.asarray(image)
    if image.shape != expected:
        raise ValueError(
            f"image must have the model's input shape {expected}; resize it first. "
            f"Received: image.shape={image.shape}"
        )
    x = image.astype("float32")
    if np.issubdtype(image.dtype, np.integer):
        x = x / 255.0
    inputs = _block_inputs(model, blocks)(x[None], training=False)
    inputs = inputs if isinstance(inputs, list | tuple) else [inputs]
    maps = []
    for block, block_input in zip(blocks, inputs, strict=True):
        tokens = block.patch_tokens(block_input, training=False)
        height, width = block.compute_output_shape(tuple(block_input.shape))[1:3]
        grid = (height // block.patch_size, width // block.patch_size)
        stride = expected[0] // block_input.shape[1]  # nominal, before any upsizing
        for index, layer in enumerate(block.transformer):
            if not isinstance(layer.attn, SeparableSelfAttention):
                raise ValueError(
                    f"{block.name} uses {type(layer.attn).__name__}; context scores are "
                    "defined for separable self-attention."
                )
            scores = keras.ops.convert_to_numpy(layer.attn.context_scores(layer.norm1(tokens)))
            folded = scores_to_map(scores, grid, block.patch_size)[0]
            maps.append(ContextScoreMap(block.name, index, stride, folded, _min_max(folded),
                                        num_patches=grid[0] * grid[1]))
            tokens = layer(tokens, training=False)
    return maps


def context_score_figure(
    image: np.ndarray,
    maps: list[ContextScoreMap],
    *,
    alpha: float = 0.6,
    cmap: str = "jet",
):
    """A matplotlib figure: the input and one overlaid panel per attention layer.

    Colours are each layer's context scores, min-max normalized (colour bar). A layer whose
    map is flat (`ContextScoreMap.is_flat`: its feature map is a single patch at this input
    size, so every score is 1) shows the input with a note instead of a uniform colour.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    image = np.asarray(image)
    shown = image if np.issubdtype(image.dtype, np.integer) else np.clip(image * 255, 0, 255)
    shown = shown.astype("uint8")
    strides = sorted({m.output_stride for m in maps})
    columns = 1 + max(sum(1 for m in maps if m.output_stride == s) for s in strides)
    fig, axes = plt.subplots(len(strides), columns, figsize=(2.2 * columns, 2.3 * len(strides)),
                             squeeze=False)
    for row, stride in enumerate(strides):
        axes[row][0].imshow(shown)
        axes[row][0].set_title(f"input (OS={stride})", fontsize=8)
        row_maps = [m for m in maps if m.output_stride == stride]
        for column in range(1, columns):
            ax = axes[row][column]
            if column - 1 < len(row_maps):
                m = row_maps[column - 1]
                ax.imshow(shown)
                ax.set_title(f"OS={stride} layer {m.layer_index}", fontsize=8)
                if m.is_flat:
                    reason = ("1 patch at this input size:\nevery score is 1, no map"
                              if m.num_patches == 1 else "all scores equal: no map")
                    ax.text(0.5, 0.5, reason, transform=ax.transAxes, ha="center",
                            va="center", fontsize=7, color="black",
                            bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none"})
                    continue
                overlay = np.asarray(
                    keras.ops.image.resize(m.normalized[..., None], shown.shape[:2],
                                           interpolation="bilinear")
                )[..., 0]
                ax.imshow(overlay, cmap=cmap, alpha=alpha, vmin=0.0, vmax=1.0)
        for ax in axes[row]:
            ax.axis("off")
    fig.tight_layout(rect=(0.0, 0.0, 0.9, 1.0))
    bar_axes = fig.add_axes((0.92, 0.15, 0.02, 0.7))
    bar = fig.colorbar(
        matplotlib.cm.ScalarMappable(norm=matplotlib.colors.Normalize(0.0, 1.0), cmap=cmap),
        cax=bar_axes)
    bar.set_label("context score (min-max per layer)", fontsize=8)
    bar.set_ticks([0.0, 0.5, 1.0], labels=["min", "", "max"])
    bar.ax.tick_params(labelsize=7)
    return fig


def plot_context_scores(
    image: np.ndarray,
    maps: list[ContextScoreMap],
    path: str | os.PathLike,
    *,
    alpha: float = 0.6,
    cmap: str = "jet",
) -> str:
    """Saves `context_score_figure` as a PNG (atomically); returns the path."""
    import matplotlib.pyplot as plt

    fig = context_score_figure(image, maps, alpha=alpha, cmap=cmap)
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return os.fspath(path)
