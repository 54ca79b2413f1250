"""The browser runtime: MediaPipe Tasks for the web (`@mediapipe/tasks-vision`), pinned.

The page never fetches code from a CDN: it loads the runtime's three files (the ES module
and the SIMD WebAssembly build with its loader, about 13.5 MB) from the same folder as the
model. They come from the npm registry once, by `install_runtime` (`mvit2 web
--install-runtime`, which runs `npm pack`, checks the tarball against the pinned sha512 and
extracts them). By default they go into the package folder (a wheel built from the checkout
ships them as package data); with a folder argument they go there, and
``MVIT2_WEB_RUNTIME`` tells `runtime_dir` to look there.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile

from keras_mvit2.utils.files import atomic_output

__all__ = [
    "RUNTIME_FILES",
    "TASKS_VISION_INTEGRITY",
    "TASKS_VISION_VERSION",
    "RuntimeMissingError",
    "install_runtime",
    "runtime_dir",
]

#: The pinned release of ``@mediapipe/tasks-vision`` and npm's integrity of its tarball.
TASKS_VISION_VERSION = "1.1.0"
TASKS_VISION_INTEGRITY = (
    "sha512-ZJqh0wMKOINorfSffvDAxzyO1//c+FiG3IkzOdNDnLqvBB3DbMfj0bB/tys2SNf9S914sgoIbIpF4HTOi336cg=="
)
#: The files the page loads, as they lie in the npm tarball (under ``package/``). Only
#: the SIMD build: every browser since 2023 runs WebAssembly SIMD.
RUNTIME_FILES = (
    "vision_bundle.mjs",
    "wasm/vision_wasm_internal.js",
    "wasm/vision_wasm_internal.wasm",
)
#: Where a checkout (and a wheel built from it) keeps the runtime: package data.
PACKAGE_RUNTIME_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runtime")
_FOLDER = f"tasks-vision-{TASKS_VISION_VERSION}"


class RuntimeMissingError(FileNotFoundError):
    """The browser runtime is not installed (the message says how to install it)."""


def _candidates() -> list[str]:
    folders = []
    if os.environ.get("MVIT2_WEB_RUNTIME"):
        folders.append(os.path.join(os.environ["MVIT2_WEB_RUNTIME"], _FOLDER))
    folders.append(os.path.join(PACKAGE_RUNTIME_DIR, _FOLDER))
    return folders


def _complete(folder: str) -> bool:
    return all(os.path.isfile(os.path.join(folder, os.path.basename(f))) for f in RUNTIME_FILES)


def runtime_dir() -> str:
    """The folder holding the runtime's files (flat: ``vision_bundle.mjs``,
    ``vision_wasm_internal.js``, ``vision_wasm_internal.wasm``).

    Looks under ``$MVIT2_WEB_RUNTIME``, then in the package. Raises `RuntimeMissingError`
    naming the install command when neither has it.
    """
    for folder in _candidates():
        if _complete(folder):
            return folder
    raise RuntimeMissingError(
        f"The browser runtime @mediapipe/tasks-vision@{TASKS_VISION_VERSION} is not installed "
        f"(looked in {', '.join(_candidates())}). Install it once with `mvit2 web "
        "--install-runtime` (needs npm; add a folder to install elsewhere and point "
        "MVIT2_WEB_RUNTIME at it)."
    )


def _integrity(path: str) -> str:
    digest = hashlib.sha512()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return "sha512-" + base64.b64encode(digest.digest()).decode()


def _npm_pack(work: str) -> str:
    npm = shutil.which("npm")
    if npm is None:
        raise FileNotFoundError(
            "npm is not installed: install Node.js (with npm) to fetch "
            f"@mediapipe/tasks-vision@{TASKS_VISION_VERSION} once, or pass the tarball "
            "(`npm pack` on another machine) as tarball=."
        )
    done = subprocess.run(
        [npm, "pack", f"@mediapipe/tasks-vision@{TASKS_VISION_VERSION}",
         "--pack-destination", work], capture_output=True, text=True, cwd=work)
    if done.returncode != 0:
        raise OSError(f"npm pack @mediapipe/tasks-vision@{TASKS_VISION_VERSION} failed: "
                      f"{done.stderr.strip()[-2000:]}")
    return os.path.join(work, f"mediapipe-tasks-vision-{TASKS_VISION_VERSION}.tgz")


def install_runtime(dest: str | os.PathLike | None = None, *,
                    tarball: str | os.PathLike | None = None) -> str:
    """Installs the pinned runtime and returns its folder (see `runtime_dir`).

    Args:
        dest: the folder to install under (default: the package's own ``runtime/``);
            the files go into ``dest/tasks-vision-<version>/``, written atomically.
        tarball: the npm tarball ``mediapipe-tasks-vision-<version>.tgz``; by default
            ``npm pack`` fetches it from the npm registry.

    Raises:
        ValueError: the tarball is not the pinned release (its sha512 differs).
    """
    folder = os.path.join(os.fspath(dest) if dest else PACKAGE_RUNTIME_DIR, _FOLDER)
    with tempfile.TemporaryDirectory() as work:
        path = os.fspath(tarball) if tarball else _npm_pack(work)
        found = _integrity(path)
        if found != TASKS_VISION_INTEGRITY:
            raise ValueError(
                f"{path} is not @mediapipe/tasks-vision@{TASKS_VISION_VERSION}: its integrity "
                f"is {found}, the pinned one {TASKS_VISION_INTEGRITY}."
            )
        with atomic_output(folder) as tmp:
            os.makedirs(tmp)
            with tarfile.open(path, "r:gz") as archive:
                for name in RUNTIME_FILES:
                    member = archive.extractfile(f"package/{name}")
                    with open(os.path.join(tmp, os.path.basename(name)), "wb") as out:
                        shutil.copyfileobj(member, out)
    return folder

