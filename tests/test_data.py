"""keras_mvit2.data: sources, guarded decoding, augmentation and pipelines, on real images.

Real data: Fashion-MNIST images (Debian's dataset-fashion-mnist) written as PNG/JPEG files in
class folders, plus corrupt files. Oracles are plain numpy (slices, flips, convex
combinations) with `tf.image.resize` where a resize is needed.
"""

import io
import os
import sys
import tempfile

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_mvit2 import data as kd
from keras_mvit2.data import augment as ka
from keras_mvit2.data.files import FASHION_MNIST_DIR

HAVE_FASHION_MNIST = os.path.exists(os.path.join(FASHION_MNIST_DIR, "t10k-labels-idx1-ubyte.gz"))
needs_fm = pytest.mark.skipif(
    not HAVE_FASHION_MNIST,
    reason="needs Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist)",
)

N_IMAGES = 40  # real images written to the folder
CORRUPT = ("Bag/truncated.jpg", "Coat/garbage.jpg", "Dress/notes.jpg", "Trouser/empty.png")


def _folder_name(class_name: str) -> str:
    return class_name.replace("/", "_")


@pytest.fixture(scope="module")
def fm_images():
    x, y = kd.load_fashion_mnist_arrays("test")
    return x[:N_IMAGES], y[:N_IMAGES].astype(np.int32)


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory, fm_images):
    """Class folders of real Fashion-MNIST PNG (lossless) and JPEG files, plus 4 bad files."""
    root = tmp_path_factory.mktemp("images")
    x, y = fm_images
    files = {}
    for i, (img, label) in enumerate(zip(x, y, strict=True)):
        folder = root / _folder_name(kd.FASHION_MNIST_CLASSES[label])
        folder.mkdir(exist_ok=True)
        ext = "png" if i % 3 else "jpg"
        path = folder / f"img{i:03d}.{ext}"
        Image.fromarray(img).convert("RGB").save(path)
        files[str(path)] = (i, int(label))
    good_jpeg = (root / _folder_name(kd.FASHION_MNIST_CLASSES[y[0]]) / "img000.jpg").read_bytes()
    for rel in CORRUPT:
        (root / rel).parent.mkdir(exist_ok=True)
    (root / CORRUPT[0]).write_bytes(good_jpeg[: len(good_jpeg) // 2])
    (root / CORRUPT[1]).write_bytes(np.random.default_rng(0).bytes(700))
    (root / CORRUPT[2]).write_text("this is a text file, not an image\n")
    (root / CORRUPT[3]).write_bytes(b"")
    (root / "Bag" / "readme.txt").write_text("ignored: not an image extension")
    return root, files


def _batches(ds):
    return [(x.numpy(), y.numpy()) for x, y in ds]


# --------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------


@needs_fm
def test_image_folder_class_names_and_counts(image_dir, fm_images):
    root, files = image_dir
    src = kd.image_folder(root)
    expected_classes = sorted({os.path.basename(os.path.dirname(p)) for p in files} | {"Bag"})
    assert src.class_names == expected_classes
    assert src.num_examples == N_IMAGES + len(CORRUPT)  # listed; the corrupt ones fail later
    labels = np.array([int(label) for _, label in src.dataset])
    for c, name in enumerate(src.class_names):
        n_good = sum(1 for p in files if os.path.basename(os.path.dirname(p)) == name)
        n_bad = sum(1 for rel in CORRUPT if rel.split("/")[0] == name)
        assert (labels == c).sum() == n_good + n_bad, name


@needs_fm
def test_corrupt_images_skipped_counted_and_reported(image_dir, fm_images):
    root, files = image_dir
    src = kd.image_folder(root)
    ds = kd.make_eval_dataset(src, image_size=28, batch_size=7, num_classes=10, crop_ratio=1.0)
    batches = _batches(ds)
    images = np.concatenate([b[0] for b in batches])
    labels = np.concatenate([b[1] for b in batches]).argmax(-1)
    assert len(images) == N_IMAGES  # every good image, none of the bad ones
    assert src.skipped.count == len(CORRUPT)
    assert src.skipped.names() == sorted(str(root / rel) for rel in CORRUPT)
    report = src.skipped.report()
    assert f"Skipped {len(CORRUPT)} unreadable images" in report
    assert str(root / CORRUPT[0]) in report

    # The PNGs decode to the exact pixels (crop_ratio 1, same size: the resize is identity).
    x, _ = fm_images
    paths = [p for _, p, _ in src.make_records(False, None).as_numpy_iterator()]
    good = [p.decode() for p in paths if p.decode() in files]
    for k, path in enumerate(good):
        i, label = files[path]
        assert labels[k] == src.class_names.index(_folder_name(kd.FASHION_MNIST_CLASSES[label]))
        if path.endswith(".png"):
            np.testing.assert_allclose(
                images[k], np.repeat(x[i][..., None], 3, -1) / 255.0, atol=1e-6
            )

    # A second pass counts the same files once more as events, not as new images.
    _batches(ds)
    assert src.skipped.count == len(CORRUPT)
    assert src.skipped.events == 2 * len(CORRUPT)

    # The training pipeline runs through them too.
    train = kd.make_train_dataset(src, image_size=16, batch_size=8, num_classes=10, seed=0)
    n = sum(b[0].shape[0] for b in _batches(train))
    assert n == (N_IMAGES // 8) * 8


@needs_fm
def test_train_order_deterministic_with_seed(image_dir):
    root, _ = image_dir
    src = kd.image_folder(root)

    def run(seed, augment):
        ds = kd.make_train_dataset(
            src, image_size=16, batch_size=8, num_classes=10, seed=seed, augment=augment
        )
        return ds, _batches(ds)

    # Every random draw (Keras' RandAugment/RandomErasing/CutMix/MixUp included) is seeded.
    advanced = kd.AugmentConfig.advanced()
    ds_a, a = run(3, advanced)
    _, b = run(3, advanced)
    assert len(a) == len(b) == N_IMAGES // 8
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    # A second epoch of the same dataset is reshuffled and re-augmented.
    again = _batches(ds_a)
    assert not all(np.array_equal(x1, x2) for (x1, _), (x2, _) in zip(a, again, strict=True))
    # Another seed gives another order (standard augmentation, cheaper to build).
    _, c3 = run(3, None)
    _, c4 = run(4, None)
    order3 = np.concatenate([y.argmax(-1) for _, y in c3])
    order4 = np.concatenate([y.argmax(-1) for _, y in c4])
    assert not np.array_equal(order3, order4)
    assert not all(np.array_equal(x3, x4) for (x3, _), (x4, _) in zip(c3, c4, strict=True))


@needs_fm
def test_split_is_disjoint_complete_stratified_and_seeded(image_dir):
    root, _ = image_dir

    def paths(split, seed=0):
        src = kd.image_folder(root, split=split, validation_fraction=0.25, seed=seed)
        return {p.decode() for _, p, _ in src.make_records(False, None).as_numpy_iterator()}

    everything = {
        p.decode()
        for _, p, _ in kd.image_folder(root).make_records(False, None).as_numpy_iterator()
    }
    train, val = paths("training"), paths("validation")
    assert train.isdisjoint(val)
    assert train | val == everything
    for name in kd.image_folder(root).class_names:
        n = sum(1 for p in everything if f"/{name}/" in p)
        assert sum(1 for p in val if f"/{name}/" in p) == round(0.25 * n)
    assert paths("validation") == val
    assert paths("validation", seed=1) != val


@needs_fm
def test_tfrecord_round_trip(tmp_path, fm_images):
    x, y = fm_images
    n_shards = 3
    writers = [
        tf.io.TFRecordWriter(str(tmp_path / f"train-{k}-of-{n_shards}")) for k in range(n_shards)
    ]
    for i, (img, label) in enumerate(zip(x, y, strict=True)):
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="PNG")
        example = tf.train.Example(
            features=tf.train.Features(
                feature={
                    "image/encoded": tf.train.Feature(
                        bytes_list=tf.train.BytesList(value=[buf.getvalue()])
                    ),
                    "image/class/label": tf.train.Feature(
                        int64_list=tf.train.Int64List(value=[int(label)])
                    ),
                    "image/id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                }
            )
        )
        writers[i % n_shards].write(example.SerializeToString())
    bad = tf.train.Example(
        features=tf.train.Features(
            feature={
                "image/encoded": tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[b"garbage"])
                ),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[1])),
                "image/id": tf.train.Feature(int64_list=tf.train.Int64List(value=[-1])),
            }
        )
    )
    writers[0].write(bad.SerializeToString())
    for w in writers:
        w.close()

    src = kd.tfrecords(tmp_path / "train-*", class_names=list(kd.FASHION_MNIST_CLASSES))
    assert src.num_examples == N_IMAGES + 1
    assert src.class_names == list(kd.FASHION_MNIST_CLASSES)
    ds = kd.make_eval_dataset(src, image_size=28, batch_size=16, num_classes=10, crop_ratio=1.0)
    batches = _batches(ds)
    images = np.concatenate([b[0] for b in batches])
    labels = np.concatenate([b[1] for b in batches]).argmax(-1)
    assert len(images) == N_IMAGES
    assert src.skipped.count == 1
    assert src.skipped.names() == [f"{tmp_path / 'train-0-of-3'}#{(N_IMAGES + 2) // 3}"]
    # Order: shards interleaved record by record, i.e. image i at position i.
    np.testing.assert_array_equal(labels, y)
    np.testing.assert_allclose(images, np.repeat(x[..., None], 3, -1) / 255.0, atol=1e-6)

    # Default class names come from the labels found; wrong keys are a clear error.
    assert len(kd.tfrecords(tmp_path / "train-*").class_names) == int(y.max()) + 1
    with pytest.raises(ValueError, match=r"no bytes_list feature 'jpeg'.*image/encoded"):
        kd.tfrecords(tmp_path / "train-*", image_key="jpeg")
    with pytest.raises(FileNotFoundError, match="No TFRecord files match"):
        kd.tfrecords(tmp_path / "nothing-*")


@needs_fm
def test_fashion_mnist_source_gray_to_rgb_exact():
    src = kd.fashion_mnist("test", limit=24)
    x, y = kd.load_fashion_mnist_arrays("test")
    assert src.num_examples == 24
    assert src.class_names[0] == "T-shirt/top" and src.class_names[9] == "Ankle boot"
    ds = kd.make_eval_dataset(src, image_size=28, batch_size=10, num_classes=10, crop_ratio=1.0)
    batches = _batches(ds)
    assert [b[0].shape for b in batches] == [(10, 28, 28, 3), (10, 28, 28, 3), (4, 28, 28, 3)]
    images = np.concatenate([b[0] for b in batches])
    np.testing.assert_array_equal(images[..., 0], images[..., 1])
    np.testing.assert_array_equal(images[..., 0], images[..., 2])
    np.testing.assert_allclose(images[..., 0], x[:24] / 255.0, atol=1e-6)
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), np.eye(10)[y[:24]])
    # Training images are RGB with equal channels too.
    xb, yb = next(iter(kd.make_train_dataset(src, image_size=32, batch_size=8, num_classes=10)))
    assert xb.shape == (8, 32, 32, 3) and yb.shape == (8, 10)
    np.testing.assert_array_equal(xb[..., 0], xb[..., 2])
    assert 0.0 <= float(tf.reduce_min(xb)) and float(tf.reduce_max(xb)) <= 1.0


@needs_fm
def test_tfds_source_reads_a_locally_built_dataset(tmp_path, fm_images):
    tfds = pytest.importorskip("tensorflow_datasets", reason="tensorflow-datasets not installed")
    x, y = fm_images
    name = _register_tiny_tfds_builder(tfds, x, y)
    src = kd.tfds_source(name, "train", data_dir=str(tmp_path))  # built locally, no download
    assert src.num_examples == N_IMAGES
    assert src.class_names == list(kd.FASHION_MNIST_CLASSES)
    ds = kd.make_eval_dataset(src, image_size=28, batch_size=16, num_classes=10, crop_ratio=1.0)
    batches = _batches(ds)
    images = np.concatenate([b[0] for b in batches])[..., 0]
    labels = np.concatenate([b[1] for b in batches]).argmax(-1)
    assert len(images) == N_IMAGES and src.skipped.count == 0
    # TFDS reorders examples by key hash: match each image back to its original.
    index = {img.tobytes(): i for i, img in enumerate(x)}
    found = [index[np.round(img * 255).astype(np.uint8).tobytes()] for img in images]
    assert sorted(found) == list(range(N_IMAGES))
    np.testing.assert_array_equal(labels, y[found])
    with pytest.raises(ValueError, match="Unknown split"):
        kd.tfds_source(name, "validation", data_dir=str(tmp_path))


_TINY_TFDS = {}


def _register_tiny_tfds_builder(tfds, x, y):
    """A TFDS builder (registered once per process) that generates the given images."""
    if "name" not in _TINY_TFDS:
        from etils import epath  # a tensorflow-datasets dependency

        class KerasMvit2TinyFashion(tfds.core.GeneratorBasedBuilder):
            VERSION = tfds.core.Version("1.0.0")
            pkg_dir_path = epath.Path(tempfile.mkdtemp(prefix="tfds_pkg_"))  # no metadata files

            def _info(self):
                return self.dataset_info_from_configs(
                    features=tfds.features.FeaturesDict(
                        {
                            "image": tfds.features.Image(shape=(28, 28, 1)),
                            "label": tfds.features.ClassLabel(names=list(kd.FASHION_MNIST_CLASSES)),
                        }
                    )
                )

            def _split_generators(self, dl_manager):
                return {"train": self._generate_examples()}

            def _generate_examples(self):
                for i in range(len(_TINY_TFDS["x"])):
                    image = _TINY_TFDS["x"][i][..., None]
                    yield i, {"image": image, "label": int(_TINY_TFDS["y"][i])}

        _TINY_TFDS["name"] = "keras_mvit2_tiny_fashion"
    _TINY_TFDS.update(x=x, y=y)
    return _TINY_TFDS["name"]


# --------------------------------------------------------------------------------------
# Augmentation
# --------------------------------------------------------------------------------------


def _seed(i):
    return tf.constant([i, 17], tf.int64)


def test_crop_and_resize_matches_numpy_slice(rng):
    image = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    box = (5, 11, 20, 30)
    out = ka.crop_and_resize(tf.constant(image), tuple(tf.constant(v) for v in box), (16, 24))
    oy, ox, h, w = box
    oracle = (
        tf.image.resize(
            image[oy : oy + h, ox : ox + w].astype(np.float32), (16, 24), antialias=True
        ).numpy()
        / 255.0
    )
    np.testing.assert_allclose(out.numpy(), np.clip(oracle, 0, 1), atol=1e-6)
    # random_resized_crop is that crop at the sampled box.
    seed = _seed(7)
    sampled = ka.sample_crop_box(tf.shape(image), seed)
    oy, ox, h, w = (int(v) for v in sampled)
    rrc = ka.random_resized_crop(tf.constant(image), (16, 24), seed)
    oracle = (
        tf.image.resize(
            image[oy : oy + h, ox : ox + w].astype(np.float32), (16, 24), antialias=True
        ).numpy()
        / 255.0
    )
    np.testing.assert_allclose(rrc.numpy(), np.clip(oracle, 0, 1), atol=1e-6)


def test_crop_box_area_and_aspect_ratio_in_range():
    shape = tf.constant([300, 400, 3])
    scale, ratio = (0.2, 0.6), (0.5, 2.0)
    areas, ratios = [], []
    for i in range(300):
        oy, ox, h, w = (
            int(v) for v in ka.sample_crop_box(shape, _seed(i), scale=scale, ratio=ratio)
        )
        assert 0 <= oy and oy + h <= 300 and 0 <= ox and ox + w <= 400
        if (h, w) == (300, 400):
            continue  # the fallback after max_attempts misses
        areas.append(h * w / (300 * 400))
        ratios.append(w / h)
    assert len(areas) > 250
    tol = 2 * (1 / 300 + 1 / 400)  # rounding of h and w to whole pixels
    assert min(areas) >= scale[0] - tol and max(areas) <= scale[1] + tol
    assert min(ratios) >= ratio[0] * (1 - tol) and max(ratios) <= ratio[1] * (1 + tol)
    # The range is used, not a fixed value.
    assert min(areas) < 0.3 and max(areas) > 0.5
    assert min(ratios) < 0.8 and max(ratios) > 1.3


def test_horizontal_flip_equals_numpy_flip_when_it_fires(rng):
    image = rng.random((6, 9, 3)).astype(np.float32)
    fired = 0
    for i in range(40):
        out = ka.random_horizontal_flip(tf.constant(image), _seed(i)).numpy()
        if np.array_equal(out, image[:, ::-1]):
            fired += 1
        else:
            np.testing.assert_array_equal(out, image)
    assert 8 <= fired <= 32


@pytest.mark.parametrize(
    "shape,size,crop_ratio",
    [((40, 60, 3), 16, 0.8), ((75, 50, 1), (20, 12), 0.875), ((33, 33, 3), 33, 1.0)],
)
def test_eval_transform_center_crop_matches_numpy(rng, shape, size, crop_ratio):
    image = rng.integers(0, 256, shape, dtype=np.uint8)
    out_h, out_w = (size, size) if isinstance(size, int) else size
    h, w = shape[:2]
    # Oracle: scale so both sides cover floor(size / crop_ratio), then take the middle.
    factor = max(np.floor(out_h / crop_ratio) / h, np.floor(out_w / crop_ratio) / w)
    new_h, new_w = max(round(h * factor), out_h), max(round(w * factor), out_w)
    rgb = np.repeat(image, 3, -1) if shape[-1] == 1 else image
    resized = tf.image.resize(rgb.astype(np.float32), (new_h, new_w), antialias=True).numpy()
    top, left = (new_h - out_h) // 2, (new_w - out_w) // 2
    oracle = np.clip(resized[top : top + out_h, left : left + out_w] / 255.0, 0, 1)
    out = ka.eval_transform(tf.constant(image), size, crop_ratio).numpy()
    assert out.shape == (out_h, out_w, 3)
    np.testing.assert_allclose(out, oracle, atol=1e-6)
    if shape == (40, 60, 3):
        assert (new_h, new_w) == (20, 30) and (top, left) == (2, 7)  # shorter side 16/0.8


def _constant_batch(batch=8):
    """Image k is filled with value v[c] of its class c; classes are all different."""
    values = (np.arange(batch) + 1.0) / (batch + 1)
    classes = np.random.default_rng(1).permutation(batch)
    images = np.broadcast_to(values[classes][:, None, None, None], (batch, 12, 10, 3))
    labels = np.eye(batch, dtype=np.float32)[classes]
    return tf.constant(images, tf.float32), tf.constant(labels), values


@pytest.mark.parametrize("kind", ["cutmix", "mixup"])
def test_mixing_gives_convex_soft_labels_that_match_the_pixels(kind):
    images, labels, values = _constant_batch()
    cfg = kd.AugmentConfig(
        mixup_alpha=0.4 if kind == "mixup" else 0.0, cutmix_alpha=1.0 if kind == "cutmix" else 0.0
    )
    mixer = ka.BatchMixer(cfg)
    mixed_any = 0
    for i in range(6):
        out_x, out_y = (t.numpy() for t in mixer(images, labels, _seed(i)))
        assert out_x.shape == images.shape and out_y.shape == labels.shape
        assert (out_y >= -1e-6).all() and (out_y <= 1 + 1e-6).all()
        np.testing.assert_allclose(out_y.sum(-1), 1.0, atol=1e-5)
        # Every pixel and the label weights tell the same mixture: mean pixel = y . values.
        np.testing.assert_allclose(out_x.mean(axis=(1, 2, 3)), out_y @ values, atol=1e-5)
        if kind == "cutmix":
            for k in range(len(out_x)):
                own = values[labels.numpy()[k].argmax()]
                pasted = ~np.isclose(out_x[k, ..., 0], own)
                if pasted.any():
                    pix = out_x[k, ..., 0][pasted]
                    c = int(np.argmin(np.abs(values - pix[0])))
                    np.testing.assert_allclose(pix, values[c], atol=1e-6)  # one source image
                    # The label weight of the pasted class is the fraction of changed pixels.
                    np.testing.assert_allclose(out_y[k, c], pasted.mean(), atol=1e-6)
                    mixed_any += 1
        else:
            mixed_any += int((out_y.max(-1) < 0.999).sum())
    assert mixed_any > 0


def test_train_pipeline_soft_labels_are_convex():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (32, 20, 20, 3), dtype=np.uint8)
    y = rng.integers(0, 5, 32).astype(np.int32)
    src = _array_source(x, y, 5)
    cfg = kd.AugmentConfig(mixup_alpha=0.3, cutmix_alpha=1.0, switch_probability=0.5)
    ds = kd.make_train_dataset(src, image_size=16, batch_size=8, num_classes=5, augment=cfg)
    soft = 0
    for xb, yb in _batches(ds):
        assert xb.shape == (8, 16, 16, 3) and yb.shape == (8, 5)
        np.testing.assert_allclose(yb.sum(-1), 1.0, atol=1e-5)
        assert (yb >= 0).all() and (yb <= 1 + 1e-6).all()
        soft += int((yb.max(-1) < 0.999).sum())
    assert soft > 0


def _array_source(x, y, num_classes):
    """An ImageSource over arrays, through the generic (no make_records) code path."""
    return kd.ImageSource(
        dataset=tf.data.Dataset.from_tensor_slices((x, y)),
        num_examples=len(x),
        class_names=[str(i) for i in range(num_classes)],
        skipped=kd.SkippedImages("test arrays"),
    )


def test_rand_augment_differs_per_example_in_a_batch():
    image = np.random.default_rng(0).integers(0, 256, (24, 24, 3), dtype=np.uint8)
    src = _array_source(np.repeat(image[None], 16, 0), np.zeros(16, np.int32), 1)
    cfg = kd.AugmentConfig(random_resized_crop=False, horizontal_flip=False, rand_augment=True)
    xb, _ = next(
        iter(kd.make_train_dataset(src, image_size=24, batch_size=16, num_classes=1, augment=cfg))
    )
    distinct = {xb[k].numpy().tobytes() for k in range(16)}
    assert len(distinct) > 4  # one op sequence per example, not per batch
    # Without RandAugment the 16 copies are identical.
    plain = kd.AugmentConfig(random_resized_crop=False, horizontal_flip=False)
    xb, _ = next(
        iter(kd.make_train_dataset(src, image_size=24, batch_size=16, num_classes=1, augment=plain))
    )
    assert len({xb[k].numpy().tobytes() for k in range(16)}) == 1


def test_switch_rand_augment_equals_keras_rand_augment():
    image = tf.constant(np.random.default_rng(2).random((1, 20, 20, 3)), tf.float32)
    layer = ka.SwitchRandAugment(value_range=(0, 1), num_ops=3, factor=0.9)
    n_ops = len(keras.layers.RandAugment._AUGMENT_LAYERS)
    for i in range(n_ops):  # every op appears in every slot
        with ka.seeded_layer(layer, _seed(i)):
            t = layer.get_random_transformation(image, training=True)
        t["layer_idxes"] = tf.constant([i % n_ops, (3 * i + 1) % n_ops, (5 * i + 2) % n_ops])
        ours = layer.transform_images(image, t).numpy()
        # Oracle: Keras' own transform (every op computed, one kept with `where`).
        theirs = keras.layers.RandAugment.transform_images(layer, image, t).numpy()
        np.testing.assert_allclose(ours, theirs, atol=1e-6)


def test_random_erasing_probability_one_and_zero():
    x = np.random.default_rng(3).integers(1, 256, (16, 20, 20, 3), dtype=np.uint8)
    src = _array_source(x, np.zeros(16, np.int32), 1)

    def run(p):
        cfg = kd.AugmentConfig(random_resized_crop=False, horizontal_flip=False, random_erasing=p)
        ds = kd.make_train_dataset(src, image_size=20, batch_size=16, num_classes=1, augment=cfg)
        return next(iter(ds))[0].numpy()

    never, always = run(0.0), run(1.0)  # same seed: same order
    # p=0: the images themselves (shuffled).
    np.testing.assert_allclose(
        np.sort(never.reshape(16, -1), 0), np.sort(x.reshape(16, -1) / 255.0, 0), atol=1e-6
    )
    for k in range(16):
        changed = np.abs(always[k] - never[k]).max(-1) > 1e-6
        assert changed.any()  # p=1: every image is erased
        assert np.all(always[k][changed] == 0.0)  # filled with 0
        rows, cols = np.nonzero(changed)
        assert changed[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1].all()  # a box


def test_augment_config_validation():
    cfg = kd.AugmentConfig.from_dict({"rrc_scale": [0.25, 1.0], "mixup_alpha": 0.2})
    assert cfg.rrc_scale == (0.25, 1.0) and cfg.mixup_alpha == 0.2
    assert kd.AugmentConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"Unknown augment key\(s\) \['mixup'\].*mixup_alpha"):
        kd.AugmentConfig.from_dict({"mixup": 0.2})
    with pytest.raises(ValueError, match=r"rrc_scale.*Received: rrc_scale=\(0.5, 0.2\)"):
        kd.AugmentConfig(rrc_scale=(0.5, 0.2))
    with pytest.raises(ValueError, match="random_erasing must be a number in \\[0, 1\\]"):
        kd.AugmentConfig(random_erasing=1.5)
    with pytest.raises(ValueError, match="rand_augment must be a bool"):
        kd.AugmentConfig.from_dict({"rand_augment": "yes"})
    with pytest.raises(ValueError, match="rand_augment_ops must be an int >= 1"):
        kd.AugmentConfig(rand_augment_ops=0)
    with pytest.raises(ValueError, match="cutmix_alpha"):
        kd.AugmentConfig(cutmix_alpha=2.0)


# --------------------------------------------------------------------------------------
# Multi-scale
# --------------------------------------------------------------------------------------


def test_multiscale_pairs_follow_the_cvnets_rule():
    pairs = kd.multiscale_batch_pairs(256, 128)
    assert pairs == [(160, 327), (192, 227), (256, 128), (288, 101), (320, 81)]
    for size, batch in pairs:
        assert size % 32 == 0
        assert batch * size**2 <= 128 * 256**2 < (batch + 1) * size**2
    pairs = kd.multiscale_batch_pairs(64, 30, (0.5, 1.0, 1.5), size_divisor=16, batch_multiple=4)
    assert pairs == [(32, 120), (64, 28), (96, 12)]
    with pytest.raises(ValueError, match="multiple of size_divisor=32"):
        kd.multiscale_batch_pairs(100, 8)


@needs_fm
@pytest.mark.parametrize("advanced", [False, True])
def test_multiscale_dataset_yields_expected_shapes_at_constant_pixels(advanced):
    src = kd.fashion_mnist("test", limit=240)
    pairs = kd.multiscale_batch_pairs(64, 8, (0.5, 1.0, 1.5))
    assert pairs == [(32, 32), (64, 8), (96, 3)]
    # Erasing and CutMix are the Keras layers that need static shapes (RandAugment is slow to
    # trace once per scale, and is covered per example above).
    augment = (
        kd.AugmentConfig(random_erasing=0.5, cutmix_alpha=1.0, mixup_alpha=0.2)
        if advanced
        else None
    )

    def run():
        ds = kd.make_multiscale_train_dataset(
            src,
            base_size=64,
            base_batch_size=8,
            num_classes=10,
            scales=(0.5, 1.0, 1.5),
            seed=5,
            augment=augment,
        )
        return _batches(ds)

    batches = run()
    seen = []
    for xb, yb in batches:
        b, h, w, c = xb.shape
        assert (h, b) in pairs and h == w and c == 3 and yb.shape == (b, 10)
        assert b * h * w <= 8 * 64 * 64 < (b + 1) * h * w
        np.testing.assert_allclose(yb.sum(-1), 1.0, atol=1e-5)
        seen.append((h, b))
    total = sum(b for _, b in seen)
    assert 240 - 32 < total <= 240  # one pass, only an incomplete last run dropped
    assert len(set(seen)) >= 2
    again = run()
    assert [x.shape for x, _ in again] == [x.shape for x, _ in batches]
    for (x1, y1), (x2, y2) in zip(batches, again, strict=True):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------


def test_folder_errors_name_the_path_and_the_layout(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"Image folder not found. Received: path='.*nope'"):
        kd.image_folder(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"'.*empty' is empty.*one sub-folder per class"):
        kd.image_folder(empty)
    loose = tmp_path / "loose"
    loose.mkdir()
    Image.new("RGB", (4, 4)).save(loose / "a.png")
    with pytest.raises(ValueError, match=r"holds 1 image file\(s\) but no class sub-folders"):
        kd.image_folder(loose)
    no_images = tmp_path / "no_images"
    (no_images / "cat").mkdir(parents=True)
    (no_images / "cat" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match=r"No images found in the 1 class sub-folder\(s\)"):
        kd.image_folder(no_images)
    with pytest.raises(ValueError, match="needs validation_fraction > 0"):
        kd.image_folder(loose, split="validation")
    with pytest.raises(ValueError, match=r"split must be None|`split` must be None"):
        kd.image_folder(loose, split="val")


def test_fashion_mnist_missing_names_the_package(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        kd.fashion_mnist(data_dir=tmp_path)
    with pytest.raises(ValueError, match='"train" or "test"'):
        kd.fashion_mnist("validation")


def test_tfds_missing_package_is_a_clear_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(ImportError, match="pip install tensorflow-datasets"):
        kd.tfds_source("mnist", "train")


def test_pipeline_argument_errors():
    src = _array_source(np.zeros((4, 8, 8, 3), np.uint8), np.arange(4, dtype=np.int32), 4)
    with pytest.raises(ValueError, match="num_classes >= 4"):
        kd.make_train_dataset(src, image_size=8, batch_size=2, num_classes=3)
    with pytest.raises(ValueError, match=r"image_size.*Received: image_size=0"):
        kd.make_eval_dataset(src, image_size=0, batch_size=2, num_classes=4)
    with pytest.raises(ValueError, match=r"Unknown augment key\(s\) \['flip'\]"):
        kd.make_train_dataset(
            src, image_size=8, batch_size=2, num_classes=4, augment={"flip": True}
        )
    with pytest.raises(ValueError, match="4 examples, fewer than batch_size=8"):
        kd.make_train_dataset(src, image_size=8, batch_size=8, num_classes=4)
    with pytest.raises(ValueError, match="crop_ratio"):
        kd.make_eval_dataset(src, image_size=8, batch_size=2, num_classes=4, crop_ratio=1.5)
