"""The web export target: the `.tflite` export in a real browser, MediaPipe Tasks for the web.

One module per concern:

* `runtime`: the pinned ``@mediapipe/tasks-vision`` files (`install_runtime`, `runtime_dir`);
* `site`: `build_site`, the static page folder (page, runtime, model, ``config.json``);
* `server`: `serve`, a static server on 127.0.0.1;
* `browser`: `Browser` / `WebPage`, headless Chromium through Playwright;
* `target`: `WebTarget` (``.web`` folders), registered as ``"web"``;
* ``static/``: the page itself (``index.html``, ``app.js``, ``style.css``).
"""

from keras_mvit2.export.web.browser import Browser, WebPage, browser_unavailable, find_chromium
from keras_mvit2.export.web.runtime import (
    TASKS_VISION_VERSION,
    RuntimeMissingError,
    install_runtime,
    runtime_dir,
)
from keras_mvit2.export.web.server import serve, start_server
from keras_mvit2.export.web.site import build_site, model_info
from keras_mvit2.export.web.target import WEB, WebReport, WebTarget, open_page

__all__ = [
    "TASKS_VISION_VERSION",
    "WEB",
    "Browser",
    "RuntimeMissingError",
    "WebPage",
    "WebReport",
    "WebTarget",
    "browser_unavailable",
    "build_site",
    "find_chromium",
    "install_runtime",
    "model_info",
    "open_page",
    "runtime_dir",
    "serve",
    "start_server",
]
