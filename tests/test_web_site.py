"""The web target's parts that need no browser: registry, page server, runtime checks,
bad input. (The page in Chromium: tests/test_web.py, slow tier.)"""

import io
import os
import socket
import tarfile
import urllib.request

import pytest

from keras_mvit2.cli.main import main
from keras_mvit2.export import get_target, target_for_path
from keras_mvit2.export.web import runtime as runtime_module
from keras_mvit2.export.web import serve, start_server
from keras_mvit2.export.web.runtime import (
    TASKS_VISION_VERSION,
    RuntimeMissingError,
    install_runtime,
    runtime_dir,
)
from keras_mvit2.export.web.site import model_info


def test_web_target_is_registered_beside_tflite():
    web = get_target("web")
    assert target_for_path("out/model.web/") is web
    assert web.formats == get_target("tflite").formats and web.default_format == "float32"
    assert "int8" in web.calibrated_formats
    from keras_mvit2.latency.host import bench_file

    with pytest.raises(ValueError, match=r"one thread\. Received: threads=2"):
        bench_file("m.web", threads=2)
    with pytest.raises(FileNotFoundError, match=r"not a page folder .* \(no model\.tflite in it\)"):
        web.metadata("nowhere.web")


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.headers, response.read()


def test_server_serves_the_types_browsers_need_on_localhost_only(tmp_path):
    files = {"index.html": b"<!doctype html>", "m.wasm": b"\0asm", "b.mjs": b"export {};",
             "config.json": b"{}"}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    with serve(tmp_path) as url:
        assert url.startswith("http://127.0.0.1:")
        types = {}
        for name, content in files.items():
            headers, body = _get(url + name)
            assert body == content
            types[name] = headers["Content-Type"]
            # Cross-origin isolation: performance.now() at full resolution for the timings.
            assert headers["Cross-Origin-Opener-Policy"] == "same-origin"
            assert headers["Cross-Origin-Embedder-Policy"] == "require-corp"
        assert types["m.wasm"] == "application/wasm"
        assert types["b.mjs"] == "text/javascript"
        assert types["config.json"] == "application/json"
        port = int(url.rsplit(":", 1)[1].strip("/"))
        with pytest.raises(OSError, match=f"Cannot serve on 127.0.0.1:{port}.*another --port"):
            start_server(tmp_path, port)
        # Bound to the loopback address, not every interface.
        with socket.socket() as s:
            s.settimeout(2)
            host = socket.gethostbyname(socket.gethostname())
            if host != "127.0.0.1" and not host.startswith("127."):
                assert s.connect_ex((host, port)) != 0
    with pytest.raises(FileNotFoundError, match="No page in"):
        start_server(tmp_path / "nothing")


def test_runtime_missing_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime_module, "PACKAGE_RUNTIME_DIR", str(tmp_path / "package"))
    monkeypatch.delenv("MVIT2_WEB_RUNTIME", raising=False)
    with pytest.raises(RuntimeMissingError, match="mvit2 web --install-runtime"):
        runtime_dir()
    # A complete folder under MVIT2_WEB_RUNTIME is found.
    folder = tmp_path / "elsewhere" / f"tasks-vision-{TASKS_VISION_VERSION}"
    folder.mkdir(parents=True)
    for name in ("vision_bundle.mjs", "vision_wasm_internal.js"):
        (folder / name).write_text("x")
    monkeypatch.setenv("MVIT2_WEB_RUNTIME", str(tmp_path / "elsewhere"))
    with pytest.raises(RuntimeMissingError):
        runtime_dir()  # the .wasm is missing
    (folder / "vision_wasm_internal.wasm").write_bytes(b"\0asm")
    assert runtime_dir() == str(folder)


def test_install_runtime_refuses_a_tarball_that_is_not_the_pinned_release(tmp_path):
    tarball = tmp_path / "mediapipe-tasks-vision.tgz"
    with tarfile.open(tarball, "w:gz") as archive:
        data = b"export const ImageClassifier = null;"
        info = tarfile.TarInfo("package/vision_bundle.mjs")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    with pytest.raises(ValueError, match=f"is not @mediapipe/tasks-vision@{TASKS_VISION_VERSION}"
                                         ": its integrity is sha512-"):
        install_runtime(tmp_path / "dest", tarball=tarball)
    assert not os.path.exists(tmp_path / "dest" / f"tasks-vision-{TASKS_VISION_VERSION}")


def test_model_info_refuses_what_the_page_cannot_run(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"Not a \.tflite file"):
        model_info(tmp_path / "model.onnx")
    import tensorflow as tf

    double = tf.function(lambda x: 2.0 * x, input_signature=[tf.TensorSpec((1, 8, 8, 3))])
    path = tmp_path / "plain.tflite"  # an image model converted without keras_mvit2
    path.write_bytes(tf.lite.TFLiteConverter.from_concrete_functions(
        [double.get_concrete_function()], double).convert())
    with pytest.raises(ValueError, match="no standard TFLite metadata"):
        model_info(path)


def test_mvit2_web_bad_input(capsys, tmp_path):
    assert main(["web"]) == 2
    assert "needs MODEL (a .tflite file), or --install-runtime" in capsys.readouterr().err
    assert main(["web", str(tmp_path / "m.tflite"), "--port", "70000"]) == 2
    assert "--port must be in 0..65535" in capsys.readouterr().err
    assert main(["web", str(tmp_path / "m.tflite")]) == 2
    assert "Not a .tflite file" in capsys.readouterr().err
