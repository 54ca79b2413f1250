"""`mvit2 visualize`: context-score maps of a MobileViTv2 for one image (paper Fig. 5 / 8)."""

import argparse


def register(sub) -> None:
    p = sub.add_parser("visualize", help="save the context-score maps of every attention layer")
    p.add_argument("model", help="a .keras file or a registered model name")
    p.add_argument("image", help="an image file (JPEG/PNG/...), resized to the model's input")
    p.add_argument("-o", "--output", default="context_scores.png", help="PNG to write")
    p.add_argument("--weights", help="checkpoint for a registered model name")
    p.add_argument("--input-size", type=int, default=256, help="input size for a model name")
    p.set_defaults(handler=_visualize)


def load_model_arg(model: str, weights: str | None = None, input_size: int = 256):
    """A `.keras` path or a registered model name (+ weights) as a Keras model."""
    from keras_mvit2 import create_model
    from keras_mvit2.utils.model_files import load_keras_model

    if model.endswith(".keras"):
        return load_keras_model(model, compile=True)
    return create_model(model, weights=weights, input_shape=(input_size, input_size, 3))


def load_image(path: str, size: tuple[int, int]):
    """Reads an image as RGB uint8 resized to `size` (height, width)."""
    import os

    import numpy as np
    from PIL import Image, UnidentifiedImageError

    if not os.path.exists(path):
        raise FileNotFoundError(f"Image not found: {path!r}")
    try:
        with Image.open(path) as image:
            rgb = image.convert("RGB").resize((size[1], size[0]), Image.BICUBIC)
    except (UnidentifiedImageError, OSError) as err:
        raise ValueError(f"{path!r} is not a readable image ({err}).") from err
    return np.asarray(rgb)


def _visualize(args: argparse.Namespace) -> int:
    from keras_mvit2.visualize import context_scores, plot_context_scores

    model = load_model_arg(args.model, args.weights, args.input_size)
    image = load_image(args.image, model.input_shape[1:3])
    maps = context_scores(model, image)
    plot_context_scores(image, maps, args.output)
    print(f"wrote {args.output} ({len(maps)} context-score maps)")
    return 0
