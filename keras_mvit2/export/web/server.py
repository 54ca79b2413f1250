"""A static file server on 127.0.0.1 for the page folder (`build_site`).

The standard library's threading HTTP server, quiet, with the types browsers insist on
(``application/wasm`` for streaming compilation, ``text/javascript`` for modules) and the
cross-origin isolation headers, which give ``performance.now()`` its fine resolution.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import threading
from collections.abc import Iterator
from typing import ClassVar

__all__ = ["serve", "start_server"]

_TYPES = {
    ".wasm": "application/wasm",
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".json": "application/json",
    ".tflite": "application/octet-stream",
}


class _Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map: ClassVar[dict[str, str]] = {
        **http.server.SimpleHTTPRequestHandler.extensions_map, **_TYPES}

    def end_headers(self) -> None:
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return None


def start_server(folder: str | os.PathLike, port: int = 0) -> http.server.ThreadingHTTPServer:
    """Serves `folder` on ``127.0.0.1:port`` (0: a free port) in a daemon thread; the
    caller stops it with ``shutdown()`` and ``server_close()``. The URL is
    ``f"http://127.0.0.1:{server.server_port}/"``.

    Raises:
        OSError: the port is taken (with the port in the message).
    """
    folder = os.fspath(folder)
    if not os.path.isfile(os.path.join(folder, "index.html")):
        raise FileNotFoundError(f"No page in {folder!r} (make one with build_site).")
    handler = functools.partial(_Handler, directory=folder)
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as err:
        raise OSError(f"Cannot serve on 127.0.0.1:{port}: {err.strerror}. Pick another "
                      "--port (or 0 for a free one).") from err
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True,
                     name="mvit2-web-server").start()
    return server


@contextlib.contextmanager
def serve(folder: str | os.PathLike, port: int = 0) -> Iterator[str]:
    """`start_server` as a context: yields the page's URL, stops the server on exit."""
    server = start_server(folder, port)
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()
