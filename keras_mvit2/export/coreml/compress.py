"""Weight compression of a Core ML ML Program (`to_coreml`'s ``weight_compression``):
int8 linear quantization (per output channel), k-means palettization (per tensor, or per
grouped channel on iOS 18+) or magnitude pruning, with ``coremltools.optimize.coreml``.

Activation quantization (W8A8) is `keras_mvit2.export.coreml.activation_quantization`.
"""

from typing import Any

__all__ = [
    "DEPLOYMENT_IOS",
    "PALETTIZE_GRANULARITIES",
    "WEIGHT_COMPRESSIONS",
    "check_compression",
    "compress_weights",
]

WEIGHT_COMPRESSIONS = (None, "int8", "palettize", "prune")
#: ``per_tensor``: one look-up table per weight (iOS 16+); ``per_grouped_channel``: one per
#: group of `palettize_group_size` output channels (iOS 18+, ``constexpr_lut_to_dense``
#: of opset iOS18).
PALETTIZE_GRANULARITIES = ("per_tensor", "per_grouped_channel")
#: The iOS version each deployment target's opset matches (macOS 13/14/15 = iOS 16/17/18).
DEPLOYMENT_IOS = {"iOS16": 16, "iOS17": 17, "iOS18": 18, "macOS13": 16, "macOS14": 17,
                  "macOS15": 18}
_PALETTIZE_BITS = (1, 2, 3, 4, 6, 8)


def check_compression(method: str | None, *, bits: int, sparsity: float, granularity: str,
                      group_size: int, minimum_deployment_target: str) -> None:
    """A ValueError naming the problem and the fix for a compression `to_coreml` cannot
    make (checked before converting)."""
    if method not in WEIGHT_COMPRESSIONS:
        raise ValueError(
            f"weight_compression must be one of {WEIGHT_COMPRESSIONS}. "
            f"Received: weight_compression={method!r}"
        )
    if method == "palettize":
        if bits not in _PALETTIZE_BITS:
            raise ValueError(f"palettize_bits must be one of {_PALETTIZE_BITS}. Received: {bits}")
        if granularity not in PALETTIZE_GRANULARITIES:
            raise ValueError(
                f"palettize_granularity must be one of {PALETTIZE_GRANULARITIES}. "
                f"Received: {granularity!r}"
            )
        if granularity == "per_grouped_channel":
            if DEPLOYMENT_IOS.get(minimum_deployment_target, 0) < 18:
                raise ValueError(
                    "palettize_granularity='per_grouped_channel' needs the iOS 18 opset "
                    "(constexpr_lut_to_dense with grouped tables): pass "
                    "minimum_deployment_target='iOS18' (or 'macOS15'). Received: "
                    f"minimum_deployment_target={minimum_deployment_target!r}"
                )
            if group_size < 1:
                raise ValueError(f"palettize_group_size must be >= 1. Received: {group_size}")
    if method == "prune" and not 0.0 < sparsity < 1.0:
        raise ValueError(f"prune_sparsity must be in (0, 1). Received: {sparsity}")


def compress_weights(mlmodel: Any, method: str | None, bits: int, sparsity: float, *,
                     granularity: str = "per_tensor", group_size: int = 16) -> Any:
    """`mlmodel` with its weights compressed by `method` (one of `WEIGHT_COMPRESSIONS`):
    ``"int8"`` (linear symmetric, one scale per output channel), ``"palettize"``
    (k-means, `bits` bits, one table per tensor or per `group_size` output channels, see
    `PALETTIZE_GRANULARITIES`) or ``"prune"`` (to `sparsity`); unchanged for ``None``.
    Check the arguments with `check_compression` first."""
    if method is None:
        return mlmodel
    from coremltools.optimize import coreml as cto

    # A small threshold so the convolutions of small models are compressed too
    # (coremltools' default of 2048 elements skips most of them).
    if method == "int8":
        op = cto.OpLinearQuantizerConfig(
            mode="linear_symmetric", dtype="int8", granularity="per_channel",
            weight_threshold=512,
        )
        return cto.linear_quantize_weights(mlmodel, cto.OptimizationConfig(global_config=op))
    if method == "palettize":
        grouped = {"group_size": group_size} if granularity == "per_grouped_channel" else {}
        op = cto.OpPalettizerConfig(mode="kmeans", nbits=bits, granularity=granularity,
                                    weight_threshold=512, **grouped)
        return cto.palettize_weights(mlmodel, cto.OptimizationConfig(global_config=op))
    op = cto.OpMagnitudePrunerConfig(target_sparsity=sparsity, weight_threshold=512)
    return cto.prune_weights(mlmodel, cto.OptimizationConfig(global_config=op))
