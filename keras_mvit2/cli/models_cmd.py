"""`mvit2 list` and `mvit2 profile`."""

import argparse

from keras_mvit2.utils.files import write_json


def register(sub) -> None:
    p = sub.add_parser("list", help="list the registered models (or their published weights)")
    p.add_argument(
        "pattern", nargs="?", default="*", help="shell-style filter, e.g. 'mobilevitv2*'"
    )
    p.add_argument("--weights", action="store_true",
                   help="list the published ImageNet weights: tag, input size, file size, top-1")
    p.set_defaults(handler=_list)

    p = sub.add_parser("profile", help="parameters and MACs of registered models")
    p.add_argument("models", nargs="*",
                   help="model names or shell patterns, e.g. 'mobilevitv2*' (default: all)")
    p.add_argument("--input-size", type=int, nargs="+", metavar="PX",
                   help="input size: one value (square) or height width "
                        "(default: each model's own, 256 for MobileViT, 224 for DeiT)")
    p.add_argument("--classes", type=int, default=1000, help="classifier classes (default 1000)")
    p.add_argument("--json", dest="json_path", help="also write the results to this JSON file")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    p.set_defaults(handler=_profile)


def _list(args: argparse.Namespace) -> int:
    from keras_mvit2 import list_models

    if args.weights:
        return _list_weights(args.pattern)
    for name in list_models(args.pattern):
        print(name)
    return 0


def _list_weights(pattern: str) -> int:
    import fnmatch

    from rich.table import Table

    from keras_mvit2 import list_weights
    from keras_mvit2.utils.console import output_console

    table = Table("model", "weights=", "input", "file", "top-1 %", "source",
                  title="Published MobileViTv2 weights (ImageNet-1k top-1)")
    for w in list_weights():
        if not fnmatch.fnmatch(w.model, pattern):
            continue
        size = "-" if w.file_size_mb is None else f"{w.file_size_mb:g} MB"
        source = w.location if w.source == "timm" else "Apple .pt (torch extra)"
        table.add_row(w.model, w.tag, f"{w.input_size}", size, f"{w.top1:.2f}", source)
    output_console().print(table)
    return 0


def _input_shape(sizes: list[int] | None) -> tuple[int, int, int] | None:
    if sizes is None:
        return None
    if len(sizes) == 1:
        return (sizes[0], sizes[0], 3)
    if len(sizes) == 2:
        return (sizes[0], sizes[1], 3)
    raise ValueError(f"--input-size takes one or two values. Received: {sizes}")


def _profile(args: argparse.Namespace) -> int:
    from keras_mvit2 import create_model, list_models
    from keras_mvit2.profiling import profile

    names = []
    for pattern in args.models or ["*"]:
        matches = list_models(pattern)
        names.extend(matches or [pattern])  # an unknown plain name errors in create_model
    shape = _input_shape(args.input_size)
    kwargs = {"classes": args.classes}
    if shape is not None:
        kwargs["input_shape"] = shape
    rows = [profile(create_model(name, **kwargs)) for name in dict.fromkeys(names)]
    headers = ("model", "input", "params", "MACs (G)", "executed MACs (G)")
    table = [
        (r.name, "x".join(map(str, r.input_shape[:2])), f"{r.params:,}", f"{r.gmacs:.3f}",
         f"{r.executed_macs / 1e9:.3f}")
        for r in rows
    ]
    if args.markdown:
        print_markdown(headers, table)
    else:
        from rich.table import Table

        from keras_mvit2.utils.console import output_console

        out = Table(*headers, title="keras_mvit2 profile (parameters exclude BN statistics)")
        for row in table:
            out.add_row(*row)
        output_console().print(out)
    if args.json_path:
        write_json(args.json_path, [r.to_dict() for r in rows])
    return 0


def print_markdown(headers, rows) -> None:
    """Prints a Markdown table: the header row, its rule, then `rows` (strings)."""
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for row in rows:
        print("| " + " | ".join(row) + " |")
