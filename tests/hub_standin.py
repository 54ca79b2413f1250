"""A loopback stand-in for the Hugging Face hub (and for Apple's download folder).

An HTTP server bound to 127.0.0.1 on a free port that answers HEAD / GET of
`/{repo_id}/resolve/{revision}/{filename}` as the hub does for a file: `ETag` (the
SHA-256 of the bytes, as for LFS files), `X-Repo-Commit`, `Content-Length`; a file it
does not have is a 404 with `X-Error-Code: EntryNotFound` (`RepoNotFound` for an
unknown repo). Plain files (Apple's `.pt`) are served under `/apple/<path>`. Point
`HF_ENDPOINT` at `server.url` (and `MVIT2_APPLE_URL` at `server.url + "/apple"`).

Faults, per file (`serve(..., fault=...)`): `"truncated"` (the first half of the
bytes, with consistent headers, as a cut upload), `"html"` (a 200 answer with an HTML
error page, as a captive portal or proxy gives).

Used by tests/test_pretrained.py and notebooks/conftest.py; no network beyond 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import http.server
import socket
import threading

HTML_PAGE = (b"<!DOCTYPE html>\n<html><head><title>Network login</title></head>"
             b"<body><h1>Please sign in to continue</h1></body></html>\n")
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def free_port() -> int:
    """A port with nothing listening on 127.0.0.1 (for a refused connection)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HubStandIn:
    """The server; `serve` / `serve_plain` add files, `stop` shuts it down."""

    def __init__(self) -> None:
        self.files: dict[tuple[str, str], bytes] = {}
        self.plain: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []
        handler = self._handler()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def serve(self, repo_id: str, filename: str, data: bytes, fault: str | None = None) -> None:
        """Serves `data` as `{repo_id}/resolve/<any revision>/{filename}`."""
        self.files[(repo_id, filename)] = _apply_fault(data, fault)

    def serve_plain(self, path: str, data: bytes, fault: str | None = None) -> None:
        """Serves `data` at `/apple/{path}`."""
        self.plain[path.lstrip("/")] = _apply_fault(data, fault)

    def remove(self, repo_id: str, filename: str) -> None:
        self.files.pop((repo_id, filename), None)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> HubStandIn:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _lookup(self, path: str) -> tuple[int, dict[str, str], bytes]:
        path = path.split("?", 1)[0].lstrip("/")
        if path.startswith("apple/"):
            data = self.plain.get(path[len("apple/"):])
            if data is None:
                return 404, {}, b"Not Found"
            return 200, {"ETag": f'"{hashlib.sha256(data).hexdigest()}"'}, data
        if "/resolve/" not in path:
            return 404, {"X-Error-Code": "RepoNotFound"}, b"Repository not found"
        repo_id, _, rest = path.partition("/resolve/")
        _revision, _, filename = rest.partition("/")
        if not any(repo == repo_id for repo, _ in self.files):
            return 404, {"X-Error-Code": "RepoNotFound",
                         "X-Error-Message": "Repository not found"}, b"Repository not found"
        data = self.files.get((repo_id, filename))
        headers = {"X-Repo-Commit": COMMIT}
        if data is None:
            headers.update({"X-Error-Code": "EntryNotFound",
                            "X-Error-Message": "Entry not found"})
            return 404, headers, b"Entry not found"
        headers["ETag"] = f'"{hashlib.sha256(data).hexdigest()}"'
        headers["Accept-Ranges"] = "bytes"
        return 200, headers, data

    def _handler(self):
        standin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _answer(self, with_body: bool) -> None:
                standin.requests.append((self.command, self.path))
                status, headers, data = standin._lookup(self.path)
                start = 0
                range_header = self.headers.get("Range")
                if status == 200 and range_header and range_header.startswith("bytes="):
                    start = int(range_header[6:].split("-", 1)[0] or 0)
                    if start:
                        status = 206
                        headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                body = data[start:]
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if with_body:
                    self.wfile.write(body)

            def do_HEAD(self) -> None:
                self._answer(with_body=False)

            def do_GET(self) -> None:
                self._answer(with_body=True)

        return Handler


def _apply_fault(data: bytes, fault: str | None) -> bytes:
    if fault is None:
        return data
    if fault == "truncated":
        return data[: len(data) // 2]
    if fault == "html":
        return HTML_PAGE
    raise ValueError(f"Unknown fault {fault!r}: None, 'truncated' or 'html'.")
