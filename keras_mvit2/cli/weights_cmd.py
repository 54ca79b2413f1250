"""`mvit2 convert-weights`: a PyTorch checkpoint to a Keras `.weights.h5`."""

import argparse


def register(sub) -> None:
    p = sub.add_parser(
        "convert-weights",
        help="port an Apple ml-cvnets or timm checkpoint to a Keras .weights.h5",
    )
    p.add_argument("source", help="checkpoint: .pt / .pth / .bin / .safetensors")
    p.add_argument("output", help="destination, ending in .weights.h5 (written atomically)")
    p.add_argument("--model", default="mobilevitv2_100",
                   help="registered model matching the checkpoint (default mobilevitv2_100)")
    p.add_argument("--classes", type=int, default=1000, help="classes of the checkpoint's head")
    p.add_argument("--no-top", action="store_true", help="drop the classifier head")
    p.set_defaults(handler=_convert)


def _convert(args: argparse.Namespace) -> int:
    from keras_mvit2.models import convert_weights

    kwargs = {"classes": args.classes}
    if args.no_top:
        kwargs["include_top"] = False
    model = convert_weights(args.source, args.output, model=args.model, **kwargs)
    print(f"wrote {args.output} ({model.name}, {len(model.weights)} arrays)")
    return 0
