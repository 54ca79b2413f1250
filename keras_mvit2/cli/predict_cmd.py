"""`mvit2 predict`: classify photos with a pretrained model, a top-k table per image."""

import argparse


def register(sub) -> None:
    p = sub.add_parser(
        "predict",
        help="classify photos with published ImageNet weights (or a checkpoint file)",
        description=(
            "Builds --model with --weights (a published tag, downloaded once and cached, "
            "see `mvit2 list --weights`; or a checkpoint file), applies the checkpoint's "
            "evaluation transform to each image and prints its top-k ImageNet classes."
        ),
    )
    p.add_argument("images", nargs="+", help="image files (JPEG, PNG, ...)")
    p.add_argument("--model", default="mobilevitv2_050",
                   help="registered model (default mobilevitv2_050)")
    p.add_argument("--weights", default="imagenet",
                   help="published tag (default imagenet) or a checkpoint path")
    p.add_argument("--top", type=int, default=5, help="classes per image (default 5)")
    p.set_defaults(handler=_predict)


def _predict(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    from keras_mvit2 import create_model, decode_predictions, preprocess_images
    from keras_mvit2.utils.console import output_console

    if args.top < 1:
        raise ValueError(f"--top must be >= 1. Received: {args.top}")
    model = create_model(args.model, weights=args.weights)
    probs = model.predict(preprocess_images(args.images, model), verbose=0)
    console = output_console()
    for path, top in zip(args.images, decode_predictions(probs, top=args.top), strict=True):
        table = Table("#", "class", "synset", "probability")
        for rank, (synset, name, score) in enumerate(top, 1):
            table.add_row(str(rank), escape(name), synset, f"{score:.4f}")
        console.print(escape(path), soft_wrap=True)
        console.print(table)
    return 0
