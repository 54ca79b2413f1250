"""`mvit2 web`: serve a page that runs an exported `.tflite` in the browser (MediaPipe
Tasks for the web), on 127.0.0.1, until Ctrl-C."""

import argparse
import os
import tempfile
import threading


def register(sub) -> None:
    p = sub.add_parser(
        "web",
        help="try an exported .tflite in the browser (MediaPipe Tasks web, offline)",
        description=(
            "Serves a page on 127.0.0.1 that loads MODEL (a classifier, segmenter or "
            "detector exported by keras_mvit2) with MediaPipe Tasks for the web and runs it "
            "on images dropped on it, picked from a folder, the --images folder or the "
            "camera: top-5 with the class names of the file, the mask or the boxes, and "
            "the latency per image. The runtime is served from this machine (install it "
            "once with --install-runtime), nothing is fetched from elsewhere."
        ),
    )
    p.add_argument("model", nargs="?", help="the .tflite file (or a NAME.web page folder)")
    p.add_argument("--images", metavar="DIR", help="a folder of images the page lists")
    p.add_argument("--port", type=int, default=0,
                   help="port on 127.0.0.1 (default: a free one, printed)")
    p.add_argument("--install-runtime", nargs="?", const="", metavar="DIR",
                   help="install the pinned @mediapipe/tasks-vision files (with npm) into the "
                        "package, or into DIR (then set MVIT2_WEB_RUNTIME=DIR), and exit")
    p.set_defaults(handler=_web)


def _web(args: argparse.Namespace) -> int:
    from keras_mvit2.export.web import build_site, install_runtime, start_server

    if args.install_runtime is not None:
        print(f"installed {install_runtime(args.install_runtime or None)}")
        return 0
    if not args.model:
        raise ValueError("mvit2 web needs MODEL (a .tflite file), or --install-runtime.")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535. Received: {args.port}")
    with tempfile.TemporaryDirectory(prefix="mvit2-web-") as work:
        if os.path.isdir(args.model) and args.images is None:
            folder = args.model  # a page folder of `mvit2 export -o NAME.web`
        else:
            model = args.model
            if os.path.isdir(model):
                model = os.path.join(model, "model.tflite")
            folder = os.path.join(work, "site")
            config = build_site(model, folder, images=args.images, link=True)
            print(f"{config['model_name']}: {config['task']}, {config['quantization']}, "
                  f"{len(config['class_names'] or [])} class names, "
                  f"{len(config['images'])} images listed")
        server = start_server(folder, args.port)
        print(f"Serving on http://127.0.0.1:{server.server_port}/ (Ctrl-C stops)", flush=True)
        try:
            threading.Event().wait()  # the server runs in its thread until Ctrl-C
        except KeyboardInterrupt:
            pass
        finally:
            server.shutdown()
            server.server_close()
    return 0
