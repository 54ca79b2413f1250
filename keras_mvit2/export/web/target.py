"""The web export target: a static page folder (``model.web/``) that runs the `.tflite`
export in the browser with MediaPipe Tasks for the web.

``mvit2 export -o model.web`` (with the TFLite options: ``--quantization``,
``--calibration-data``, ...) writes the TFLite file and the page around it (`build_site`);
`run` drives headless Chromium over it (`keras_mvit2.latency.host.bench_file` times it
there), `inspect` reports the TFLite file and the page.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from keras_mvit2.export.target import (
    ConvertArguments,
    ExportTarget,
    get_target,
    register_target,
)
from keras_mvit2.export.tflite.inspect import TFLiteReport, inspect_tflite
from keras_mvit2.export.tflite.quantization import CALIBRATED, QUANTIZATIONS
from keras_mvit2.export.web.browser import Browser, WebPage, browser_unavailable
from keras_mvit2.export.web.runtime import TASKS_VISION_VERSION
from keras_mvit2.export.web.server import serve
from keras_mvit2.export.web.site import MODEL_FILE, build_site
from keras_mvit2.utils.files import disk_size

__all__ = ["WEB", "WebReport", "WebTarget", "open_page"]


@dataclass
class WebReport:
    """A page folder: its `.tflite` (`tflite`, a `TFLiteReport`) and its files.

    Attributes:
        path: the folder. size_bytes: all its files. files: their names (sorted).
        op_histogram, num_ops, metadata: those of the `.tflite`.
    """

    path: str
    size_bytes: int
    files: list[str]
    tflite: TFLiteReport

    @property
    def op_histogram(self) -> dict[str, int]:
        return self.tflite.op_histogram

    @property
    def num_ops(self) -> int:
        return self.tflite.num_ops

    @property
    def metadata(self) -> dict[str, Any] | None:
        return self.tflite.metadata

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size_bytes": self.size_bytes, "files": self.files,
                "tflite": self.tflite.to_dict()}


def _model_file(path: str | os.PathLike) -> str:
    model = os.path.join(os.fspath(path), MODEL_FILE)
    if not os.path.isfile(model):
        raise FileNotFoundError(f"{os.fspath(path)!r} is not a page folder of `mvit2 export -o "
                                f"NAME.web` (no {MODEL_FILE} in it).")
    return model


@contextlib.contextmanager
def open_page(path: str | os.PathLike, browser: Browser | None = None) -> Iterator[WebPage]:
    """The page folder `path` served on 127.0.0.1 and loaded in headless Chromium
    (`browser`, or one started and closed here)."""
    _model_file(path)
    with serve(path) as url, (
            contextlib.nullcontext(browser) if browser else Browser()) as chromium:
        page = chromium.open(url)
        page.browser_version = chromium.version
        try:
            yield page
        finally:
            page.close()


class WebTarget(ExportTarget):
    """``.web`` page folders: the `.tflite` export in MediaPipe Tasks for the web.

    `convert` takes the TFLite target's options (`to_tflite`'s), `quantization` among
    TFLite's formats.
    """

    name = "web"
    display_name = "Web page"
    suffixes = (".web",)
    formats = QUANTIZATIONS
    calibrated_formats = CALIBRATED
    runtime = "MediaPipe Tasks web"

    def _convert(self, model: Any, path: str | os.PathLike, shared: ConvertArguments,
                 options: dict[str, Any]) -> WebReport:
        """The TFLite export (`to_tflite`) inside a page folder (`build_site`); the option
        `images`: a folder of example images the page lists."""
        from keras_mvit2.export.web.runtime import runtime_dir

        images = options.pop("images", None)

        runtime_dir()  # a missing runtime fails before the conversion, not after
        with tempfile.TemporaryDirectory() as work:
            stem = os.path.basename(os.fspath(path).rstrip("/" + os.sep)).removesuffix(".web")
            tflite = os.path.join(work, f"{stem or 'model'}.tflite")  # the page shows the name
            get_target("tflite").convert(model, tflite, **vars(shared), **options)
            build_site(tflite, path, images=images)
        return self.inspect(path)

    def cli_arguments(self, args: Any) -> dict[str, Any]:
        return get_target("tflite").cli_arguments(args)

    def inspect(self, path: str | os.PathLike) -> WebReport:
        folder = os.fspath(path)
        tflite = inspect_tflite(_model_file(folder))
        files = sorted(os.path.relpath(os.path.join(root, n), folder)
                       for root, _, names in os.walk(folder) for n in names)
        return WebReport(folder, disk_size(folder), files, tflite)

    def can_run(self) -> bool:
        return browser_unavailable() is None

    def host_note(self) -> str | None:
        reason = browser_unavailable()
        return f"Not run in a browser here: {reason}." if reason else None

    def run(self, path: str | os.PathLike, images: np.ndarray, *,
            num_threads: int = 1) -> np.ndarray:
        """Classifier scores (N, C) or segmenter confidence masks (N, H, W, C) that
        MediaPipe Tasks gives in headless Chromium for `images` (N, H, W, 3) in [0, 1]
        (sent as uint8 pixels, as a browser has them). One thread: MediaPipe's WebAssembly
        build has no others."""
        with open_page(path) as page:
            task = page.config["task"]
            if task == "classifier":
                return page.classify(images)[0]
            if task == "segmenter":
                return np.stack([out["confidence"] for out in page.run_batch(images)])
        raise ValueError(f"run() gives classifier scores or segmenter masks; {path} is a "
                         "detector: use open_page(path) and WebPage.run_batch for its boxes.")

    def metadata(self, path: str | os.PathLike) -> dict[str, Any]:
        return get_target("tflite").metadata(_model_file(path))

    def report_rows(self, report: WebReport) -> list[tuple[str, str]]:
        rows = get_target("tflite").report_rows(report.tflite)
        page = [f for f in report.files if f != MODEL_FILE]
        return [("page", f"{report.path} ({len(page)} files besides {MODEL_FILE}, "
                         f"{report.size_bytes / 1e6:.1f} MB in all)"),
                ("runtime", f"@mediapipe/tasks-vision {TASKS_VISION_VERSION} (served with the "
                            "page, no CDN)"),
                *rows]


WEB = register_target(WebTarget())
