"""Apple's own Core ML export path for timm's MobileViTv2: the reference op histograms.

Run as a separate process (never import it next to TensorFlow: on this stack a torch
convolution segfaults once TensorFlow is imported in the same process). For each timm
model (random weights, norms and biases perturbed as in `torch_oracle.py`) it runs
`torch.jit.trace` and coremltools' PyTorch frontend with the settings of
`keras_mvit2.export.to_coreml` (ML Program, fp16, iOS 16, RGB image input scaled by
1/255) and prints one JSON object `{model: {"ops": {op type: count}}}` as its last line
of output (with `"size_bytes"` of the saved package when `--out-dir` is given).

Usage:
    python tests/timm_coreml_reference.py --models mobilevitv2_050,mobilevitv2_100 \
        --size 64 [--out-dir DIR]
"""

import argparse
import json
import os
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torch_oracle import install_torchvision_stub, perturb_norms_and_biases


def _size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(path) for name in names)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True, help="comma-separated timm model names")
    parser.add_argument("--size", type=int, default=256, help="square input size")
    parser.add_argument("--out-dir", help="where to save the .mlpackage files (for their size)")
    args = parser.parse_args(argv)

    install_torchvision_stub()
    import coremltools as ct
    import timm
    import torch

    torch.manual_seed(0)
    result = {}
    for name in args.models.split(","):
        model = timm.create_model(name, pretrained=False).eval()
        # Norms and biases off their init (1, 0), as in trained weights: coremltools
        # removes a multiply by 1 or an add of 0, which would flatter the count.
        perturb_norms_and_biases(model, seed=0)
        example = torch.rand(1, 3, args.size, args.size)
        with torch.no_grad():
            traced = torch.jit.trace(model, example)
        mlmodel = ct.convert(
            traced,
            inputs=[ct.ImageType(name="image", shape=(1, 3, args.size, args.size),
                                 scale=1.0 / 255.0, color_layout=ct.colorlayout.RGB)],
            convert_to="mlprogram",
            compute_precision=ct.precision.FLOAT16,
            minimum_deployment_target=ct.target.iOS16,
        )
        spec = mlmodel.get_spec()
        ops = Counter(
            op.type
            for function in spec.mlProgram.functions.values()
            for block in function.block_specializations.values()
            for op in block.operations
        )
        result[name] = {"ops": dict(sorted(ops.items()))}
        if args.out_dir:
            path = os.path.join(args.out_dir, f"{name}.mlpackage")
            mlmodel.save(path)
            result[name]["size_bytes"] = _size(path)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
