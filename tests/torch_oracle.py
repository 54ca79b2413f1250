"""PyTorch reference outputs of timm's MobileViTv2, for the Keras port's parity tests.

Run as a separate process (never import it next to TensorFlow): on this stack a
torch convolution segfaults once TensorFlow has been imported in the same
process, so tests run this script with `subprocess` and compare in their own
(TensorFlow) process.

For each model it writes into `--out-dir`:

- `<model>.pth` (torch.save of the state dict) and `<model>.safetensors`;
- `<model>.npz` with
  - `x_<H>x<W>`: the input images, NHWC float32 in [0, 1] (numpy seed);
  - `logits_<H>x<W>`: eval-mode logits of timm for those images;
  - `features_<H>x<W>`: the last feature map before pooling (`forward_features`), NCHW;
  - with `stage_maps` set: `stage<i>_<H>x<W>`, the output of `stages[i]` for i = 1..4
    (the feature maps of strides 4, 8, 16, 32 that a segmentation backbone uses), NCHW;
  - `block_in_<h>x<w>` / `block_out_<h>x<w>`: input / output of `stages[2][1]`
    (the first MobileViTv2 block), NCHW;
  - `attn_in` / `attn_out`: input / output of `stages[2][1].transformer[0].attn`
    (LinearSelfAttention), torch layout `(B, d, P, N)`;
- `manifest.json`: the configuration and the versions used.

Every BatchNorm's running_mean / running_var / weight / bias, every
GroupNorm's weight / bias and every conv / linear bias is perturbed with a
fixed torch seed, so the port of norms and biases is really exercised.

Usage:
    python tests/torch_oracle.py --out-dir DIR [--models mobilevitv2_050,mobilevitv2_100]
        [--sizes 256x256,224x224,256x320] [--batch 2] [--seed 0]
        [--block-sizes 32x32,15x17] [--config config.json]

`--config` (a JSON file or a JSON string) sets the same fields: `models`,
`sizes` (lists of `[H, W]` or `"HxW"`), `batch`, `seed`, `block_sizes`,
`attn_tokens`, `stage_maps` (bool).
"""

import argparse
import importlib.abc
import importlib.machinery
import json
import os
import sys
import types


class _DummyMeta(type):
    """Any attribute of a dummy class is another dummy class."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _DummyMeta(name, (_Dummy,), {})


class _Dummy(metaclass=_DummyMeta):
    pass


class _TorchvisionStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves `torchvision` and `torchvision.*` as stub modules.

    timm imports torchvision, whose wheel cannot be installed beside CPU torch
    here; timm's MobileViTv2 forward never touches it.
    """

    def find_spec(self, fullname, path, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def __getattr__(name):  # noqa: N807 (module-level __getattr__ protocol)
            if name.startswith("__"):
                raise AttributeError(name)
            return _DummyMeta(name, (_Dummy,), {})

        module.__getattr__ = __getattr__
        return module

    def exec_module(self, module):
        pass


def install_torchvision_stub() -> None:
    """Makes `import torchvision...` succeed with stubs, unless the real one is importable."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.meta_path.insert(0, _TorchvisionStub())


DEFAULTS = {
    "models": ["mobilevitv2_050", "mobilevitv2_100"],
    "sizes": [[256, 256], [224, 224], [256, 320]],
    "batch": 2,
    "seed": 0,
    "block_sizes": [[32, 32], [15, 17]],
    "attn_tokens": 64,
    "stage_maps": False,
}


def _parse_size(size) -> list[int]:
    if isinstance(size, str):
        height, _, width = size.lower().partition("x")
        return [int(height), int(width or height)]
    return [int(size[0]), int(size[1])]


def parse_config(argv: list[str] | None = None) -> tuple[str, dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--config", help="JSON file or JSON string with the fields below")
    parser.add_argument("--models", help="comma-separated timm model names")
    parser.add_argument("--sizes", help="comma-separated HxW input sizes")
    parser.add_argument("--block-sizes", help="comma-separated hxw sizes of the block input")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--seed", type=int)
    args = parser.parse_args(argv)
    config = dict(DEFAULTS)
    if args.config:
        text = args.config
        if os.path.exists(text):
            with open(text) as f:
                text = f.read()
        config.update(json.loads(text))
    if args.models:
        config["models"] = args.models.split(",")
    if args.sizes:
        config["sizes"] = args.sizes.split(",")
    if args.block_sizes:
        config["block_sizes"] = args.block_sizes.split(",")
    if args.batch is not None:
        config["batch"] = args.batch
    if args.seed is not None:
        config["seed"] = args.seed
    config["sizes"] = [_parse_size(s) for s in config["sizes"]]
    config["block_sizes"] = [_parse_size(s) for s in config["block_sizes"]]
    return args.out_dir, config


def perturb_norms_and_biases(model, seed: int):
    """Moves every norm's statistics and affine parameters, and every bias, off their init.

    Returns the `torch.Generator` it drew from, for callers that perturb more tensors.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)

    def uniform(t, low, high):
        t.copy_(torch.rand(t.shape, generator=generator) * (high - low) + low)

    def normal(t, std):
        t.copy_(torch.randn(t.shape, generator=generator) * std)

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                normal(module.running_mean, 0.2)
                uniform(module.running_var, 0.5, 2.0)
                uniform(module.weight, 0.5, 1.5)
                normal(module.bias, 0.2)
            elif isinstance(module, torch.nn.GroupNorm | torch.nn.LayerNorm):
                uniform(module.weight, 0.5, 1.5)
                normal(module.bias, 0.2)
            elif isinstance(module, torch.nn.Conv2d | torch.nn.Linear):
                if module.bias is not None:
                    normal(module.bias, 0.05)
    return generator


def run_model(name: str, config: dict, out_dir: str) -> dict:
    import numpy as np
    import timm
    import torch
    from safetensors.torch import save_file

    seed = int(config["seed"])
    batch = int(config["batch"])
    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False).eval()
    perturb_norms_and_biases(model, seed + 1)

    state = model.state_dict()
    torch.save(state, os.path.join(out_dir, f"{name}.pth"))
    save_file({k: v.contiguous() for k, v in state.items()},
              os.path.join(out_dir, f"{name}.safetensors"))

    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    logit_stats = {}
    with torch.no_grad():
        for height, width in config["sizes"]:
            tag = f"{height}x{width}"
            x = rng.random((batch, height, width, 3), dtype=np.float32)
            features = model.forward_features(torch.from_numpy(x.transpose(0, 3, 1, 2).copy()))
            logits = model.forward_head(features).numpy()
            arrays[f"x_{tag}"] = x
            arrays[f"features_{tag}"] = features.numpy()
            arrays[f"logits_{tag}"] = logits
            if config.get("stage_maps"):
                maps = model.stem(torch.from_numpy(x.transpose(0, 3, 1, 2).copy()))
                for i, stage in enumerate(model.stages):
                    maps = stage(maps)
                    if i >= 1:
                        arrays[f"stage{i}_{tag}"] = maps.numpy()
            logit_stats[tag] = float(np.abs(logits).max())

        block = model.stages[2][1]
        channels = block.conv_kxk.conv.in_channels
        for height, width in config["block_sizes"]:
            tag = f"{height}x{width}"
            x = rng.standard_normal((batch, channels, height, width), dtype=np.float32)
            arrays[f"block_in_{tag}"] = x
            arrays[f"block_out_{tag}"] = block(torch.from_numpy(x)).numpy()

        attn = block.transformer[0].attn
        dim = attn.embed_dim
        x = rng.standard_normal((batch, dim, 4, int(config["attn_tokens"])), dtype=np.float32)
        arrays["attn_in"] = x
        arrays["attn_out"] = attn(torch.from_numpy(x)).numpy()

    np.savez(os.path.join(out_dir, f"{name}.npz"), **arrays)
    return {"max_abs_logit": logit_stats, "num_tensors": len(state)}


def main(argv: list[str] | None = None) -> None:
    out_dir, config = parse_config(argv)
    os.makedirs(out_dir, exist_ok=True)
    install_torchvision_stub()
    import numpy as np
    import timm
    import torch

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    summary = {}
    for name in config["models"]:
        summary[name] = run_model(name, config, out_dir)
    manifest = {
        "config": config,
        "versions": {"torch": torch.__version__, "timm": timm.__version__,
                     "numpy": np.__version__},
        "models": summary,
    }
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    print(json.dumps(manifest["models"]))


if __name__ == "__main__":
    main()
