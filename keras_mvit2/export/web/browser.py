"""Headless Chromium, driven through Playwright, over the page of `build_site`.

The system's Chromium (Debian's ``chromium``; or ``$MVIT2_CHROMIUM``) is used as it is:
Playwright's own browser download is never needed. One `Browser` serves many pages;
`WebPage` sends images to the page in batches (``window.mvit2.runBatch``: base64 RGB, exact
pixels, no image codec in between) and reads back MediaPipe's results.
"""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
from typing import Any

import numpy as np

__all__ = ["CHROMIUM_FLAGS", "Browser", "WebPage", "browser_unavailable", "find_chromium"]

#: Flags of a Chromium that never reaches past the machine (no background connections,
#: no updates, no sync) and runs as root in a container.
CHROMIUM_FLAGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
#: Images sent to the page per call (keeps each message a few MB at most).
BATCH = 64


def find_chromium() -> str | None:
    """The Chromium executable: ``$MVIT2_CHROMIUM``, else ``chromium`` /
    ``chromium-browser`` / ``google-chrome`` on the PATH, else None."""
    if os.environ.get("MVIT2_CHROMIUM"):
        return os.environ["MVIT2_CHROMIUM"]
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def browser_unavailable() -> str | None:
    """Why the browser cannot run here (a sentence with the fix), or None when it can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the Python package playwright is not installed (pip install 'keras_mvit2[web]')"
    if find_chromium() is None:
        return ("Chromium is not installed (apt-get install chromium, or point MVIT2_CHROMIUM "
                "at a Chromium or Chrome executable)")
    from keras_mvit2.export.web.runtime import RuntimeMissingError, runtime_dir

    try:
        runtime_dir()
    except RuntimeMissingError as err:
        return str(err)
    return None


def _rgb_uint8(images: np.ndarray) -> np.ndarray:
    images = np.asarray(images)
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"images must be (N, H, W, 3) RGB. Received shape {images.shape}")
    if images.dtype == np.uint8:
        return images
    if not np.issubdtype(images.dtype, np.floating):
        raise ValueError(f"images must be uint8 or float in [0, 1]. Received {images.dtype}")
    return np.clip(np.round(images * 255.0), 0, 255).astype(np.uint8)


#: The process's one Playwright driver (its sync API allows one per thread) and the number
#: of open `Browser`s using it.
_DRIVER: dict[str, Any] = {"playwright": None, "users": 0}


def _start_driver() -> Any:
    from playwright.sync_api import sync_playwright

    if _DRIVER["playwright"] is None:
        _DRIVER["playwright"] = sync_playwright().start()
    _DRIVER["users"] += 1
    return _DRIVER["playwright"]


def _stop_driver() -> None:
    _DRIVER["users"] -= 1
    if _DRIVER["users"] == 0:
        _DRIVER["playwright"].stop()
        _DRIVER["playwright"] = None


class Browser:
    """One headless Chromium (a fresh profile); `open` gives a `WebPage` per page URL.

    Use as a context manager, or call `close`. Several may be open at once in one thread
    (they share the process's Playwright driver).
    """

    def __init__(self, executable: str | None = None) -> None:
        reason = browser_unavailable() if executable is None else None
        if reason:
            raise RuntimeError(f"Cannot start the browser: {reason}.")
        self._profile = tempfile.mkdtemp(prefix="mvit2-chromium-")
        playwright = _start_driver()
        try:
            self._context = playwright.chromium.launch_persistent_context(
                self._profile, executable_path=executable or find_chromium(), headless=True,
                args=list(CHROMIUM_FLAGS), viewport={"width": 900, "height": 520})
        except Exception:
            _stop_driver()
            shutil.rmtree(self._profile, ignore_errors=True)
            raise
        self.version = self._context.browser.version if self._context.browser else "?"

    def open(self, url: str, *, timeout_s: float = 60.0) -> WebPage:
        """Loads the page at `url` and waits until its model is ready."""
        return WebPage(self._context.new_page(), url, timeout_s=timeout_s)

    def close(self) -> None:
        self._context.close()
        _stop_driver()
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WebPage:
    """One loaded page (`build_site`'s folder, served): its model in MediaPipe Tasks web.

    Attributes:
        config: the page's ``config.json`` (task, input size, class names, ...).
        user_agent: the browser's user agent string.
    """

    def __init__(self, page: Any, url: str, *, timeout_s: float = 60.0) -> None:
        self._page = page
        self._errors: list[str] = []
        page.on("pageerror", lambda err: self._errors.append(str(err)))
        page.set_default_timeout(timeout_s * 1000)
        page.goto(url)
        try:
            self.config = page.evaluate("window.mvit2Ready")
        except Exception as err:
            raise RuntimeError(f"The page at {url} could not load its model: {err} "
                               f"{self._errors}") from err
        self.user_agent = page.evaluate("window.mvit2.userAgent")

    def run_batch(self, images: np.ndarray) -> list[dict[str, Any]]:
        """One result per image of uint8 (or [0, 1] float) RGB `images` (N, H, W, 3), as
        the page's ``infer`` gives it: ``categories`` [{index, score, name}] by score
        (classifier), ``detections`` [{box (x1, y1, x2, y2) in pixels, index, score,
        name}] (detector), ``mask`` (H, W) and ``confidence`` (H, W, C) arrays
        (segmenter); ``ms`` the call's milliseconds."""
        images = _rgb_uint8(images)
        n, h, w, _ = images.shape
        results: list[dict[str, Any]] = []
        for start in range(0, n, BATCH):
            chunk = images[start:start + BATCH]
            payload = base64.b64encode(np.ascontiguousarray(chunk).tobytes()).decode()
            results += self._page.evaluate(
                "([b64, n, h, w]) => window.mvit2.runBatch(b64, n, h, w)",
                [payload, len(chunk), h, w])
        for out in results:
            if "mask" in out:
                mh, mw = out["height"], out["width"]
                out["mask"] = np.frombuffer(base64.b64decode(out["mask"]), np.uint8).reshape(
                    mh, mw)
                out["confidence"] = np.stack([np.frombuffer(base64.b64decode(c), np.float32)
                                              .reshape(mh, mw) for c in out["confidence"]], -1)
        return results

    def classify(self, images: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """Scores (N, C) float32 in class-id order and the top-1 class names (N,)."""
        results = self.run_batch(images)
        classes = len(results[0]["categories"])
        scores = np.zeros((len(results), classes), np.float32)
        for row, out in zip(scores, results, strict=True):
            for c in out["categories"]:
                row[c["index"]] = c["score"]
        return scores, [out["categories"][0]["name"] for out in results]

    def bench(self, image: np.ndarray, *, runs: int = 100, warmup: int = 10) -> list[float]:
        """Milliseconds of `runs` inferences of one (H, W, 3) image, after `warmup`."""
        rgb = _rgb_uint8(np.asarray(image)[None])[0]
        payload = base64.b64encode(np.ascontiguousarray(rgb).tobytes()).decode()
        return self._page.evaluate(
            "([b64, h, w, runs, warmup]) => window.mvit2.bench(b64, h, w, runs, warmup)",
            [payload, rgb.shape[0], rgb.shape[1], runs, warmup])

    def screenshot(self, path: str | os.PathLike, image: np.ndarray) -> str:
        """Shows one (H, W, 3) image with its result on the page and saves a PNG of the
        page at `path`; returns the labels the page shows."""
        from keras_mvit2.utils.files import atomic_output

        rgb = _rgb_uint8(np.asarray(image)[None])[0]
        payload = base64.b64encode(np.ascontiguousarray(rgb).tobytes()).decode()
        shown = self._page.evaluate("([b64, h, w]) => window.mvit2.show(b64, h, w)",
                                    [payload, rgb.shape[0], rgb.shape[1]])
        with atomic_output(path) as tmp:
            self._page.screenshot(path=tmp, full_page=True)
        return shown

    def close(self) -> None:
        self._page.close()
