"""Downloading, checking and caching the published checkpoints (`weights="imagenet"`).

timm's files come through `huggingface_hub.hf_hub_download` (its cache, resumable
downloads, `HF_ENDPOINT`, `HF_HOME` / `HF_HUB_CACHE` and `HF_HUB_OFFLINE` work as for
any hub user); Apple's `.pt` files through `keras.utils.get_file` (cached under
`$KERAS_HOME/keras_mvit2`, `~/.keras` by default; `MVIT2_APPLE_URL` replaces Apple's
base URL, for mirrors).

No hash is published for these files, so none is pinned: a download is checked by
its format (an HTML page, an empty, truncated or corrupt file is rejected before a
model is built) and by the strict port (every tensor's name and shape) before
anything is assigned. A bad file is removed from the cache and the error names it and
says how to retry.

The ported Keras weights are cached beside the download, keyed by model, tag and the
SHA-256 of the downloaded file (`<repo cache>/keras_mvit2/<model>.<tag>.<sha256[:16]>
.<top|notop>.weights.h5`), so the next load reads one `.weights.h5`: no torch, no
safetensors parsing.
"""

from __future__ import annotations

import dataclasses
import os
import zipfile
from collections.abc import Callable
from typing import Any

from keras_mvit2.utils.files import sha256_file
from keras_mvit2.utils.model_files import file_format_problem
from keras_mvit2.weights.pretrained import APPLE_BASE_URL, PretrainedWeights

__all__ = ["ResolvedWeights", "WeightsDownloadError", "download_weights", "load_pretrained"]

#: Environment variable replacing Apple's base URL (a mirror, or a local stand-in).
APPLE_URL_ENV = "MVIT2_APPLE_URL"
_SUBDIR = "keras_mvit2"


class WeightsDownloadError(OSError):
    """A published checkpoint could not be downloaded, or the download is not a checkpoint."""


@dataclasses.dataclass(frozen=True)
class ResolvedWeights:
    """A downloaded, format-checked checkpoint.

    Attributes:
        entry: the table row (`keras_mvit2.list_weights()`).
        path: the downloaded file in the cache.
        sha256: SHA-256 of the file (hex).
        cache_dir: where the ported `.weights.h5` files of this checkpoint live.
    """

    entry: PretrainedWeights
    path: str
    sha256: str
    cache_dir: str

    def keras_weights_path(self, include_top: bool) -> str:
        """The cached ported weights for a model with or without the classifier."""
        variant = "top" if include_top else "notop"
        name = f"{self.entry.model}.{self.entry.tag}.{self.sha256[:16]}.{variant}.weights.h5"
        return os.path.join(self.cache_dir, name)


def _describe(entry: PretrainedWeights) -> str:
    if entry.source == "timm":
        return f"{entry.location}/{entry.filename}"
    return _apple_url(entry)


def _apple_url(entry: PretrainedWeights) -> str:
    base = os.environ.get(APPLE_URL_ENV)
    if not base:
        return entry.location
    return base.rstrip("/") + entry.location[len(APPLE_BASE_URL):]


# --------------------------------------------------------------------------------------
# Downloads
# --------------------------------------------------------------------------------------


def _retry_hint(entry: PretrainedWeights) -> str:
    if entry.source == "timm":
        return ("Run the same call again to download it again (check the network, a proxy, "
                "or HF_ENDPOINT if you set it).")
    return f"Run the same call again to download it again (check the network or ${APPLE_URL_ENV})."


def _download_timm(entry: PretrainedWeights) -> str:
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub import errors as hf_errors

    what = _describe(entry)
    endpoint = constants.ENDPOINT
    try:
        return hf_hub_download(entry.location, entry.filename, library_name="keras_mvit2")
    except hf_errors.LocalEntryNotFoundError as e:
        if constants.is_offline_mode():
            raise WeightsDownloadError(
                f"Cannot load weights={entry.tag!r} of {entry.model}: HF_HUB_OFFLINE is set and "
                f"{what} is not in the hub cache ({constants.HF_HUB_CACHE}). Run once with "
                "network access (HF_HUB_OFFLINE unset) to download it."
            ) from e
        cause = e.__cause__ or e.__context__
        detail = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
        raise WeightsDownloadError(
            f"Cannot download {what} from {endpoint}: the hub could not be reached{detail}. "
            "Check the network connection (and HF_ENDPOINT if you set it), then run the same "
            "call again; with the file already cached, HF_HUB_OFFLINE=1 skips the network."
        ) from e
    except hf_errors.HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        if isinstance(e, hf_errors.RepositoryNotFoundError | hf_errors.RemoteEntryNotFoundError):
            problem = "the hub has no such file (404)"
        else:
            problem = f"HTTP error {status}"
        raise WeightsDownloadError(
            f"Cannot download {what} from {endpoint}: {problem}. If HF_ENDPOINT points to a "
            f"mirror, check that it carries {entry.location}; otherwise see {entry.url}. "
            "Nothing was cached; run the same call again once the file is reachable."
        ) from e


def _download_apple(entry: PretrainedWeights) -> str:
    import keras

    url = _apple_url(entry)
    cache_dir = os.environ.get("KERAS_HOME") or None  # None: Keras' default (~/.keras)
    if cache_dir is not None:  # get_file falls back to /tmp/.keras unless it exists
        os.makedirs(cache_dir, exist_ok=True)
    try:
        return keras.utils.get_file(entry.filename, url, cache_subdir=_SUBDIR,
                                    cache_dir=cache_dir)
    except Exception as e:  # get_file raises a bare Exception("URL fetch failure on ...")
        raise WeightsDownloadError(
            f"Cannot download {url}: {e}. Nothing was cached; check the network (or "
            f"${APPLE_URL_ENV} if you set it) and run the same call again."
        ) from e


def _remove_download(path: str) -> None:
    """Removes a cached download: the hub's snapshot link and the blob it points to."""
    target = os.path.realpath(path)
    for p in {path, target}:
        if os.path.lexists(p):
            os.remove(p)


def _format_problem(entry: PretrainedWeights, path: str) -> str | None:
    """Why the file at `path` is not a checkpoint of `entry`'s format (None if it looks fine)."""
    problem = file_format_problem(path, name=entry.filename)
    if problem is not None or entry.filename.endswith(".safetensors"):
        return problem
    if not zipfile.is_zipfile(path):  # torch.save files are zip archives
        return (f"the file ({os.path.getsize(path):,} bytes) is not a PyTorch checkpoint "
                "(not a zip archive)")
    return None


def _bad_download(entry: PretrainedWeights, path: str, problem: str) -> WeightsDownloadError:
    _remove_download(path)
    return WeightsDownloadError(
        f"The download of {_describe(entry)} for weights={entry.tag!r} is not usable: "
        f"{problem}. The file {path} was removed from the cache. {_retry_hint(entry)}"
    )


def download_weights(entry: PretrainedWeights) -> ResolvedWeights:
    """Downloads (or finds in the cache) the checkpoint of `entry` and checks its format.

    Returns:
        A `ResolvedWeights` with the cached file and its SHA-256.

    Raises:
        WeightsDownloadError: the download failed (no network, 404, ...) or the file is
            not a checkpoint (HTML page, empty, truncated, corrupt); a bad file is removed
            from the cache first.
    """
    path = _download_timm(entry) if entry.source == "timm" else _download_apple(entry)
    if entry.source == "timm":
        # <cache>/models--timm--<name>/snapshots/<commit>/model.safetensors -> repo folder
        repo_folder = os.path.dirname(os.path.dirname(os.path.dirname(path)))
        cache_dir = os.path.join(repo_folder, _SUBDIR)
    else:
        cache_dir = os.path.dirname(path)
    sha256 = sha256_file(path)
    resolved = ResolvedWeights(entry, path, sha256, cache_dir)
    if not (os.path.exists(resolved.keras_weights_path(True))
            or os.path.exists(resolved.keras_weights_path(False))):
        problem = _format_problem(entry, path)
        if problem is not None:
            raise _bad_download(entry, path, problem)
    return resolved


# --------------------------------------------------------------------------------------
# Loading into a model
# --------------------------------------------------------------------------------------


def load_pretrained(
    model, resolved: ResolvedWeights, include_top: bool, *, port: Callable[[Any, dict], None]
) -> str:
    """Loads `resolved` into `model`; returns where the weights came from.

    Reads the cached `.weights.h5` when there is one; otherwise ports the download with
    `port(model, state_dict)` (the family's strict port, e.g.
    `keras_mvit2.models.mobilevitv2.mobilevitv2_port.load_torch_weights`: every name and
    shape) and writes the `.weights.h5` atomically for the next time.
    """
    from keras_mvit2.utils.files import atomic_output
    from keras_mvit2.weights.torch_checkpoint import read_torch_state_dict

    h5 = resolved.keras_weights_path(include_top)
    if os.path.exists(h5):
        try:
            model.load_weights(h5)
            return h5
        except Exception:  # an unreadable or mismatched cache entry: port again below
            os.remove(h5)
    entry = resolved.entry
    try:
        state = read_torch_state_dict(resolved.path)
        port(model, state)
    except ValueError as e:
        raise _bad_download(entry, resolved.path, str(e)) from e
    os.makedirs(resolved.cache_dir, exist_ok=True)
    try:
        with atomic_output(h5) as tmp:
            model.save_weights(tmp)
    except OSError:  # a read-only cache still gives a working model
        pass
    return resolved.path
