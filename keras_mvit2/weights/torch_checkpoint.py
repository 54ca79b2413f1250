"""Reading PyTorch checkpoints (`.pt` / `.pth` / `.bin` / `.safetensors`) into numpy arrays.

torch is imported lazily and only for pickled checkpoints; `.safetensors` files
are read with `safetensors.numpy` and need no torch.
"""

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

#: Extensions read with `torch.load(..., weights_only=True)`.
TORCH_EXTENSIONS = (".pt", ".pth", ".bin")
#: Extensions read with `safetensors.numpy.load_file`.
SAFETENSORS_EXTENSIONS = (".safetensors",)

#: Keys under which training checkpoints nest the model's state dict, most preferred first
#: (timm: `state_dict`, `state_dict_ema`; ml-cvnets: `model_state_dict`,
#: `model_ema_state_dict`; others: `model`, `model_state`, `module`, `net`).
NESTING_KEYS = (
    "state_dict",
    "model_state_dict",
    "model_state",
    "model",
    "module",
    "net",
    "state_dict_ema",
    "model_ema_state_dict",
    "model_ema",
)

#: Key prefixes added by wrappers: DataParallel / DDP (`module.`), `torch.compile` (`_orig_mod.`).
WRAPPER_PREFIXES = ("module.", "_orig_mod.")

_INSTALL_HINT = "Install the torch extra: pip install keras_mvit2[torch]"


def read_torch_state_dict(
    path_or_state_dict: str | os.PathLike | Mapping[str, Any],
) -> dict[str, np.ndarray]:
    """Reads a PyTorch checkpoint into a flat `{name: numpy array}` dict.

    Args:
        path_or_state_dict: the path of a `.pt`, `.pth` or `.bin` file (read with
            `torch.load(path, map_location="cpu", weights_only=True)`) or of a
            `.safetensors` file (read with `safetensors.numpy`, no torch needed),
            or an already-loaded dict of torch tensors or numpy arrays.

    Returns:
        The state dict with numpy values. Training checkpoints are unwrapped
        (`state_dict`, `model`, `model_state`, `state_dict_ema`, ...), a
        `module.` (or `_orig_mod.`) prefix is stripped and the BatchNorm
        `num_batches_tracked` counters are dropped. bfloat16 tensors become
        float32; other dtypes are kept.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: unknown extension, unreadable or corrupt file, or no tensors.
        ImportError: torch (or safetensors) is needed and not installed.

    Example:
        ```python
        state = read_torch_state_dict("mobilevitv2-1.0.pt")  # Apple ml-cvnets checkpoint
        state["conv_1.block.conv.weight"].shape  # (32, 3, 3, 3)
        ```
    """
    if isinstance(path_or_state_dict, Mapping):
        return _normalize(path_or_state_dict, source="the given dict")
    if not isinstance(path_or_state_dict, str | os.PathLike):
        raise TypeError(
            "path_or_state_dict must be a file path or a dict of tensors. "
            f"Received: {type(path_or_state_dict).__name__}"
        )
    path = os.fspath(path_or_state_dict)
    if not os.path.exists(path):
        raise FileNotFoundError(f"Checkpoint file not found: {path!r}")
    if os.path.isdir(path):
        raise ValueError(f"Expected a checkpoint file, got a directory: {path!r}")
    lower = path.lower()
    if lower.endswith(SAFETENSORS_EXTENSIONS):
        raw = _load_safetensors(path)
    elif lower.endswith(TORCH_EXTENSIONS):
        raw = _load_torch(path)
    else:
        hint = (
            " Keras `.weights.h5` files load with `model.load_weights(path)` or "
            "`MobileViTV2(weights=path)`."
            if lower.endswith(".h5") or lower.endswith(".keras")
            else ""
        )
        raise ValueError(
            f"Unknown checkpoint extension for {path!r}: expected one of "
            f"{', '.join(TORCH_EXTENSIONS + SAFETENSORS_EXTENSIONS)}.{hint}"
        )
    if not isinstance(raw, Mapping):
        raise ValueError(
            f"{path!r} is not a valid PyTorch checkpoint: it holds a "
            f"{type(raw).__name__}, not a state dict."
        )
    return _normalize(raw, source=repr(path))


def _load_torch(path: str) -> Any:
    try:
        import torch
    except ImportError as e:
        raise ImportError(
            f"Reading the PyTorch checkpoint {path!r} needs torch. {_INSTALL_HINT}"
        ) from e
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types: UnpicklingError, RuntimeError, EOFError...
        detail, hint = _first_line(e), ""
        marker = "WeightsUnpickler error:"
        if marker in str(e):
            # The first line is torch's generic "Weights only load failed..." notice.
            rest = str(e).split(marker, 1)[1].strip()
            detail = rest.splitlines()[0] if rest else detail
            if "global" in detail.lower():
                hint = (
                    " The file holds Python objects besides tensors. If it comes from a "
                    "trusted source, load it with torch.load(path, weights_only=False) yourself "
                    "and pass the state dict (a dict of tensors) instead of the path."
                )
        raise ValueError(
            f"{path!r} is not a valid PyTorch checkpoint (torch.load with weights_only=True "
            f"failed: {type(e).__name__}: {detail}).{hint}"
        ) from e


def _load_safetensors(path: str) -> Any:
    try:
        from safetensors.numpy import load_file
    except ImportError as e:
        raise ImportError(
            f"Reading the safetensors checkpoint {path!r} needs safetensors. {_INSTALL_HINT}"
        ) from e
    try:
        return load_file(path)
    except Exception as e:  # SafetensorError, OSError, TypeError for dtypes numpy lacks...
        raise ValueError(
            f"{path!r} is not a valid safetensors checkpoint "
            f"({type(e).__name__}: {_first_line(e)})"
        ) from e


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "no message"


def _is_tensor(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return True
    # torch.Tensor without importing torch.
    cls = type(value)
    return cls.__module__.startswith("torch") and hasattr(value, "detach") and hasattr(
        value, "shape"
    )


def _to_numpy(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    tensor = value.detach().cpu()
    if str(tensor.dtype) == "torch.bfloat16":
        tensor = tensor.float()
    return tensor.numpy()


def _unwrap(state: Mapping[str, Any], source: str, depth: int = 0) -> Mapping[str, Any]:
    if any(_is_tensor(v) for v in state.values()):
        return state
    if depth < 3:
        for key in NESTING_KEYS:
            nested = state.get(key)
            if isinstance(nested, Mapping) and nested:
                return _unwrap(nested, source, depth + 1)
    keys = sorted(map(str, state.keys()))
    shown = ", ".join(repr(k) for k in keys[:10]) + (", ..." if len(keys) > 10 else "")
    raise ValueError(
        f"{source} holds no tensors: expected a state dict (name -> tensor), or a training "
        f"checkpoint that nests one under one of {list(NESTING_KEYS)}. "
        f"Top-level keys: [{shown}]"
    )


def _normalize(state: Mapping[str, Any], source: str) -> dict[str, np.ndarray]:
    state = _unwrap(state, source)
    out: dict[str, np.ndarray] = {}
    for key, value in state.items():
        if not _is_tensor(value):
            continue
        name = str(key)
        while name.startswith(WRAPPER_PREFIXES):
            name = name.removeprefix(next(p for p in WRAPPER_PREFIXES if name.startswith(p)))
        if name.endswith("num_batches_tracked"):
            continue
        if name in out:
            raise ValueError(
                f"{source} holds the tensor {name!r} twice (once with a wrapper prefix "
                f"such as {WRAPPER_PREFIXES[0]!r}); cannot tell which one to use."
            )
        out[name] = _to_numpy(value)
    if not out:
        raise ValueError(f"{source} holds no tensors besides BatchNorm counters.")
    return out
