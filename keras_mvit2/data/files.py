"""The files of the image sources, read without TensorFlow: the class folders of an image
folder (and its stratified training / validation split), Fashion-MNIST's IDX files.

`keras_mvit2.data.sources` (tf.data) and `keras_mvit2.data.py_sources` (numpy / PIL) both
read their files through these functions, so a split holds the same images on every
backend.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import warnings

import numpy as np

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp")
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
_FOLDER_LAYOUT = (
    "Expected one sub-folder per class holding that class's images, e.g. "
    "<path>/<class_name>/<image>.jpg (the ImageNet layout; JPEG, PNG, GIF or BMP files)."
)


def _list_class_folder(folder: str) -> list[str]:
    files = []
    for root, dirs, names in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        files.extend(
            os.path.join(root, n)
            for n in sorted(names)
            if not n.startswith(".") and n.lower().endswith(IMAGE_EXTENSIONS)
        )
    return files


@dataclasses.dataclass(frozen=True)
class ImageFiles:
    """The labelled files of an image folder (or of one split of it).

    Attributes:
        paths: the image files, in (class, file name) order.
        labels: int label of each path, in `[0, len(class_names))`.
        class_names: the sorted class sub-folder names, in label order.
        where: what was read, for messages (e.g. "image folder '/data' (training split)").
    """

    paths: list[str]
    labels: list[int]
    class_names: list[str]
    where: str


def list_image_folder(
    path: str | os.PathLike,
    *,
    split: str | None = None,
    validation_fraction: float = 0.0,
    seed: int = 0,
) -> ImageFiles:
    """The image files of a folder with one sub-folder of images per class: the classes,
    files and split of `keras_mvit2.data.image_folder` (arguments as there).

    Raises:
        FileNotFoundError, NotADirectoryError, ValueError: the folder is missing, a file,
            has no class sub-folders or no images, or the split is empty (the message says
            which and the expected layout).
    """
    path = os.fspath(path)
    if split not in (None, "training", "validation"):
        raise ValueError(
            f'`split` must be None, "training" or "validation". Received: split={split!r}'
        )
    if not isinstance(validation_fraction, (int, float)) or not 0.0 <= validation_fraction < 1.0:
        raise ValueError(
            "`validation_fraction` must be a float in [0, 1). "
            f"Received: validation_fraction={validation_fraction!r}"
        )
    if split is not None and validation_fraction == 0.0:
        raise ValueError(
            f"split={split!r} needs validation_fraction > 0 (e.g. 0.1). "
            f"Received: validation_fraction={validation_fraction!r}"
        )
    if split is None and validation_fraction > 0.0:
        raise ValueError(
            f'validation_fraction={validation_fraction} needs split="training" or '
            '"validation". Received: split=None'
        )
    if not os.path.exists(path):
        raise FileNotFoundError(f"Image folder not found. Received: path={path!r}")
    if not os.path.isdir(path):
        raise NotADirectoryError(
            f"Expected a folder of class sub-folders, got a file. Received: path={path!r}. "
            + _FOLDER_LAYOUT
        )
    entries = sorted(e for e in os.listdir(path) if not e.startswith("."))
    class_names = [e for e in entries if os.path.isdir(os.path.join(path, e))]
    if not class_names:
        loose = [e for e in entries if e.lower().endswith(IMAGE_EXTENSIONS)]
        what = (
            f"holds {len(loose)} image file(s) but no class sub-folders"
            if loose
            else ("is empty" if not entries else "has no class sub-folders")
        )
        raise ValueError(f"The image folder {path!r} {what}. {_FOLDER_LAYOUT}")

    per_class = [_list_class_folder(os.path.join(path, c)) for c in class_names]
    if not any(per_class):
        raise ValueError(
            f"No images found in the {len(class_names)} class sub-folder(s) of {path!r} "
            f"(looked for {', '.join(IMAGE_EXTENSIONS)}). {_FOLDER_LAYOUT}"
        )
    empty = [c for c, files in zip(class_names, per_class, strict=True) if not files]
    if empty:
        warnings.warn(
            f"Class sub-folder(s) without images in {path!r}: {empty[:10]}. They keep their "
            "label index but have no examples.",
            stacklevel=2,
        )

    paths: list[str] = []
    labels: list[int] = []
    rng = np.random.default_rng(seed)
    for label, files in enumerate(per_class):
        if split is not None:
            order = rng.permutation(len(files))
            n_val = round(validation_fraction * len(files))
            n_train = len(files) - n_val
            chosen = order[n_train:] if split == "validation" else order[:n_train]
            files = [files[i] for i in sorted(chosen)]
        paths.extend(files)
        labels.extend([label] * len(files))
    if not paths:
        raise ValueError(
            f"The {split!r} split of {path!r} is empty with "
            f"validation_fraction={validation_fraction}; use a fraction that leaves images "
            "in both splits."
        )

    where = f"image folder {path!r}" + (f" ({split} split)" if split else "")
    return ImageFiles(paths=paths, labels=labels, class_names=class_names, where=where)


def _read_idx(path: str, magic: int, ndim: int) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    header = np.frombuffer(data, ">i4", count=1 + ndim)
    if int(header[0]) != magic:
        raise ValueError(
            f"{path!r} is not an IDX file of the expected kind (magic {int(header[0])}, "
            f"expected {magic}); reinstall with `apt-get install --reinstall "
            "dataset-fashion-mnist`."
        )
    shape = tuple(int(d) for d in header[1:])
    offset = 4 * (1 + ndim)
    if len(data) - offset != int(np.prod(shape)):
        raise ValueError(f"{path!r} is truncated: header says {shape}, got {len(data) - offset} B.")
    return np.frombuffer(data, np.uint8, offset=offset).reshape(shape)


def load_fashion_mnist_arrays(
    split: str = "train", *, data_dir: str | os.PathLike = FASHION_MNIST_DIR
) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST as numpy arrays: uint8 images `(N, 28, 28)` and uint8 labels `(N,)`."""
    files = {"train": "train", "test": "t10k"}
    if split not in files:
        raise ValueError(
            f'Fashion-MNIST split must be "train" or "test". Received: split={split!r}'
        )
    data_dir = os.fspath(data_dir)
    prefix = os.path.join(data_dir, files[split])
    image_path, label_path = f"{prefix}-images-idx3-ubyte.gz", f"{prefix}-labels-idx1-ubyte.gz"
    for p in (image_path, label_path):
        if not os.path.exists(p):
            raise FileNotFoundError(
                f"Fashion-MNIST file not found: {p!r}. Install Debian's package with "
                "`apt-get install dataset-fashion-mnist` (it puts the IDX files in "
                f"{FASHION_MNIST_DIR}), or pass data_dir=. Received: data_dir={data_dir!r}"
            )
    images = _read_idx(image_path, 2051, 3)
    labels = _read_idx(label_path, 2049, 1)
    if len(images) != len(labels):
        raise ValueError(f"{len(images)} images but {len(labels)} labels in {data_dir!r}.")
    return images, labels


def _limited_fashion_mnist(split: str, data_dir, limit: int | None):
    """`load_fashion_mnist_arrays` cut to the first `limit` examples (`None`: all)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"`limit` must be a positive int or None. Received: limit={limit!r}")
    images, labels = load_fashion_mnist_arrays(split, data_dir=data_dir)
    return (images, labels) if limit is None else (images[:limit], labels[:limit])


def _skipped_report(counter, max_names: int, verb: str) -> str:
    """The `report()` of `SkippedImages` / `SkippedFiles`: the count and the first names."""
    n = counter.count
    if n == 0:
        return f"No unreadable images were skipped in {counter.where}."
    more = f" and {n - max_names} more" if n > max_names else ""
    return (
        f"Skipped {n} unreadable image{'s' if n != 1 else ''} in {counter.where} "
        f"(corrupt, truncated or not an image; {counter.events} {verb}(s) over all epochs): "
        f"{', '.join(counter.names()[:max_names])}{more}."
    )
