"""Weight compression of a Core ML ML Program (`to_coreml`'s ``weight_compression``):
int8 linear quantization, k-means palettization or magnitude pruning, with
``coremltools.optimize.coreml``."""

from typing import Any

__all__ = ["WEIGHT_COMPRESSIONS", "compress_weights"]

WEIGHT_COMPRESSIONS = (None, "int8", "palettize", "prune")


def compress_weights(mlmodel: Any, method: str | None, bits: int, sparsity: float) -> Any:
    """`mlmodel` with its weights compressed by `method` (one of `WEIGHT_COMPRESSIONS`):
    ``"int8"``, ``"palettize"`` (`bits` bits) or ``"prune"`` (to `sparsity`); unchanged
    for ``None``."""
    if method is None:
        return mlmodel
    from coremltools.optimize import coreml as cto

    # A small threshold so the convolutions of small models are compressed too
    # (coremltools' default of 2048 elements skips most of them).
    if method == "int8":
        op = cto.OpLinearQuantizerConfig(
            mode="linear_symmetric", dtype="int8", weight_threshold=512
        )
        return cto.linear_quantize_weights(mlmodel, cto.OptimizationConfig(global_config=op))
    if method == "palettize":
        if bits not in (1, 2, 3, 4, 6, 8):
            raise ValueError(f"palettize_bits must be 1, 2, 3, 4, 6 or 8. Received: {bits}")
        op = cto.OpPalettizerConfig(mode="kmeans", nbits=bits, weight_threshold=512)
        return cto.palettize_weights(mlmodel, cto.OptimizationConfig(global_config=op))
    if not 0.0 < sparsity < 1.0:
        raise ValueError(f"prune_sparsity must be in (0, 1). Received: {sparsity}")
    op = cto.OpMagnitudePrunerConfig(target_sparsity=sparsity, weight_threshold=512)
    return cto.prune_weights(mlmodel, cto.OptimizationConfig(global_config=op))
