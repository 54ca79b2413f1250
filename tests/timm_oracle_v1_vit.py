"""PyTorch reference outputs of timm's MobileViT v1 and DeiT, for the Keras ports' parity tests.

Run as a separate process (never import it next to TensorFlow): on this stack a
torch convolution segfaults once TensorFlow has been imported in the same
process, so tests run this script with `subprocess` and compare in their own
(TensorFlow) process, which reads the `.safetensors` files without torch.

For each model (timm name, `pretrained=False`, random init with every norm,
bias, class token and position embedding perturbed by a fixed torch seed, so
that their port is really exercised) it writes into `--out-dir`:

- `<model>.safetensors`: the state dict;
- `<model>.npz` with, for each size `HxW`, `x_<H>x<W>` (the input images,
  NHWC float32, numpy seed) and `logits_<H>x<W>` (eval-mode logits of timm);
- `manifest.json`: the configuration, the versions and the max |logit| per input.

Usage:
    python tests/timm_oracle_v1_vit.py --out-dir DIR
        [--models mobilevit_xxs:256x256+224x224,deit_tiny_patch16_224:224x224]
        [--batch 2] [--seed 0]

224x224 for MobileViT exercises the bilinear resize of the last MobileViT
block (7x7 feature map, patch 2).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torch_oracle import (  # tests/ is on the path now
    install_torchvision_stub,
    perturb_norms_and_biases,
)

DEFAULT_MODELS = "mobilevit_xxs:256x256+224x224,deit_tiny_patch16_224:224x224"


def parse_models(text: str) -> dict[str, list[tuple[int, int]]]:
    """`name:HxW+HxW,name2:HxW` -> `{name: [(H, W), ...]}`."""
    models = {}
    for item in text.split(","):
        name, _, sizes = item.partition(":")
        parsed = []
        for size in sizes.split("+"):
            height, _, width = size.lower().partition("x")
            parsed.append((int(height), int(width or height)))
        models[name] = parsed
    return models


def perturb(model, seed: int) -> None:
    """Moves norms, biases, the class token and the position embedding off their init."""
    import torch

    generator = perturb_norms_and_biases(model, seed)
    with torch.no_grad():
        for name in ("cls_token", "pos_embed"):
            tensor = getattr(model, name, None)
            if tensor is not None:
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.5)
        head = getattr(model, "head", None)
        fc = getattr(head, "fc", head)
        if isinstance(fc, torch.nn.Linear):
            # timm's head init is tiny (DeiT: std 0.02, zero-init for some models):
            # scale it so that the logits are O(1) and an absolute tolerance means something.
            fc.weight.copy_(
                torch.randn(fc.weight.shape, generator=generator) / fc.in_features**0.5)


def run_model(name: str, sizes, batch: int, seed: int, out_dir: str) -> dict:
    import numpy as np
    import timm
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False).eval()
    perturb(model, seed + 1)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(out_dir, f"{name}.safetensors"))

    rng = np.random.default_rng(seed)
    arrays = {}
    stats = {}
    with torch.no_grad():
        for height, width in sizes:
            tag = f"{height}x{width}"
            x = rng.random((batch, height, width, 3), dtype=np.float32)
            logits = model(torch.from_numpy(x.transpose(0, 3, 1, 2).copy())).numpy()
            arrays[f"x_{tag}"] = x
            arrays[f"logits_{tag}"] = logits
            stats[tag] = float(np.abs(logits).max())
    np.savez(os.path.join(out_dir, f"{name}.npz"), **arrays)
    return {"max_abs_logit": stats, "num_tensors": len(state)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    install_torchvision_stub()
    import numpy as np
    import timm
    import torch

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    models = parse_models(args.models)
    summary = {
        name: run_model(name, sizes, args.batch, args.seed, args.out_dir)
        for name, sizes in models.items()
    }
    manifest = {
        "config": {"models": {k: [list(s) for s in v] for k, v in models.items()},
                   "batch": args.batch, "seed": args.seed},
        "versions": {"torch": torch.__version__, "timm": timm.__version__,
                     "numpy": np.__version__},
        "models": summary,
    }
    with open(os.path.join(args.out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
