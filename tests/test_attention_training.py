"""`model.attention` of the training config, and every attention trained with the recipe.

The config field is checked like every other one (names, aliases, argument mappings, bad
values named). The smoke test trains MobileViTV2-0.5 with each registered attention for
a few steps of the packaged Fashion-MNIST recipe on 64 real images and checks what a
regression in an attention's forward or gradients breaks: the loss stays finite and
falls (the images are seen several times), every attention layer receives finite,
non-zero gradients, and the trained model's outputs differ between images.
"""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_mvit2 import training
from keras_mvit2.layers import attention_registry

FASHION = "/usr/share/datasets/fashion-mnist"
needs_fashion = pytest.mark.skipif(
    not os.path.exists(os.path.join(FASHION, "train-images-idx3-ubyte.gz")),
    reason="Debian's dataset-fashion-mnist is not installed",
)
MECHANISMS = ["separable", "mha", "linformer", "rfa", "mobile_attention"]


def test_the_smoke_test_covers_every_registered_attention():
    assert sorted(MECHANISMS) == attention_registry.available()


# --------------------------------------------------------------------------------------
# The config field
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("mha", "mha"),
    ("multi_head", "mha"),           # an alias is stored as its canonical name
    ("Mobile-Attention", "mobile_attention"),
    ("linear", "separable"),
    ("null", None),
    ("{name: linformer, projected_tokens: 16}", {"name": "linformer", "projected_tokens": 16}),
    ("{name: transformer, num_heads: 2}", {"name": "mha", "num_heads": 2}),
])
def test_model_attention_from_set(text, expected):
    config = training.load_config("fashion_mnist", [f"model.attention={text}"])
    assert config.model.attention == expected


def test_model_attention_from_yaml_round_trips(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  name: mobilevitv2_050\n  attention:\n"
                    "    name: rfa\n    num_heads: 2\n")
    config = training.load_config(str(path))
    assert config.model.attention == {"name": "rfa", "num_heads": 2}
    config.save(tmp_path / "saved.yaml")
    assert training.load_config(str(tmp_path / "saved.yaml")) == config
    assert training.load_config("fashion_mnist").model.attention is None  # the model's own


@pytest.mark.parametrize("text, match", [
    ("softmax_free", r"model\.attention must be null, one of \['linformer', 'mha'.*"
                     r"Received: attention='softmax_free'"),
    ("{projected_tokens: 16}", r"model\.attention must be null, one of"),
    ("{name: mha, heads: 4}", r"model\.attention must be a mapping of arguments that 'mha' "
                              r"accepts .*heads"),
    ("3", r"model\.attention must be a string or dict or null\. Received: attention=3"),
])
def test_bad_model_attention_is_named(text, match):
    with pytest.raises(ValueError, match=match):
        training.load_config("fashion_mnist", [f"model.attention={text}"])


def test_the_attention_reaches_the_model():
    config = training.load_config("fashion_mnist", [
        "model.image_size=32", "model.attention={name: mha, num_heads: 2}"])
    model = training.build_classifier(config, num_classes=10)
    assert attention_registry.names_in(model) == ["mha"]
    heads = {layer.num_heads for layer in model._flatten_layers()
             if isinstance(layer, attention_registry.get_class("mha"))}
    assert heads == {2}
    default = training.build_classifier(training.load_config(
        "fashion_mnist", ["model.image_size=32"]), num_classes=10)
    assert attention_registry.names_in(default) == ["separable"]


# --------------------------------------------------------------------------------------
# Every mechanism learns with the recipe
# --------------------------------------------------------------------------------------


def _attention_gradients(model: keras.Model, images, labels) -> dict[str, list[np.ndarray]]:
    """Gradients of the cross-entropy w.r.t. each attention layer's weights."""
    layers = [layer for layer in model._flatten_layers()
              if type(layer) in {attention_registry.get_class(n) for n in MECHANISMS}]
    with tf.GradientTape() as tape:
        probs = model(images, training=False)
        loss = keras.losses.sparse_categorical_crossentropy(labels, probs)
    weights = [w for layer in layers for w in layer.trainable_weights]
    grads = iter(tape.gradient(loss, [w.value for w in weights]))
    return {layer.path: [np.asarray(next(grads)) for _ in layer.trainable_weights]
            for layer in layers}


@pytest.mark.slow
@needs_fashion
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_every_attention_learns_with_the_recipe(mechanism, tmp_path):
    config = training.load_config("fashion_mnist", [
        f"model.attention={mechanism}", "model.image_size=32",
        "data.train_limit=64", "data.batch_size=16", "data.validation_split=null",
        "optimizer.reference_batch_size=16", "schedule.warmup_epochs=0",
        "augment.random_resized_crop=false", "augment.horizontal_flip=false",
        "ema.enabled=false", "training.epochs=1", "training.steps_per_epoch=24",
        f"output.dir={tmp_path / mechanism}", "output.verbose=0", "output.tensorboard=false",
    ])
    step_losses: list[float] = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: step_losses.append(float(logs["loss"])))
    result = training.train(config, callbacks=[record])
    losses = np.array(step_losses)
    print(f"{mechanism}: loss {losses[:4].mean():.3f} -> {losses[-4:].mean():.3f}")
    assert len(losses) == 24 and np.isfinite(losses).all(), losses
    # 64 images seen six times: a mechanism whose gradients are broken does not fit them.
    assert losses[-4:].mean() < 0.75 * losses[:4].mean(), losses
    assert result.attention == [mechanism]
    run = json.loads(open(os.path.join(result.output_dir, "run.json")).read())
    assert run["attention"] == [mechanism]

    model = keras.saving.load_model(result.model_path)
    assert attention_registry.names_in(model) == [mechanism]
    source = training.make_sources(config)[0]
    images, labels = zip(*source.dataset.take(32), strict=True)
    images = tf.image.resize(tf.image.grayscale_to_rgb(tf.cast(np.stack(images), tf.float32)
                                                       / 255.0), (32, 32))
    probs = model.predict(images, verbose=0)
    assert np.isfinite(probs).all()
    assert probs.std(axis=0).max() > 0.02, "the trained model gives every image one output"
    grads = _attention_gradients(model, images, np.array(labels))
    assert len(grads) == 2 + 4 + 3  # one attention per transformer layer of the 3 stages
    for path, layer_grads in grads.items():
        assert all(np.isfinite(g).all() for g in layer_grads), path
        assert max(np.abs(g).max() for g in layer_grads) > 0.0, f"{path}: no gradient"


# --------------------------------------------------------------------------------------
# The trained attention is reported by the run, `mvit2 eval` and the exported files
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_trained_attention_is_reported_everywhere(tmp_path, capsys):
    """`mvit2 train` and `mvit2 eval` say which attention the run trained (the exported
    files say it too, for every attention: tests/test_attention_contract.py)."""
    from PIL import Image

    from keras_mvit2.cli.main import main

    data = tmp_path / "images"
    rng = np.random.default_rng(0)
    for name, colour in (("red", (220, 30, 30)), ("blue", (30, 30, 220))):
        os.makedirs(data / name)
        for i in range(8):
            pixels = np.array(colour) + rng.normal(0, 30, (32, 32, 3))
            Image.fromarray(np.clip(pixels, 0, 255).astype("uint8")).save(
                data / name / f"{i}.png")
    out = tmp_path / "run"
    sets = ["model.name=mobilevitv2_050", "model.attention=multi_head", "model.image_size=32",
            "data.batch_size=8", "optimizer.reference_batch_size=8", "training.epochs=1",
            "schedule.warmup_epochs=0", "output.verbose=0", "output.tensorboard=false"]
    argv = ["train", "--config", "fashion_mnist", "--data", str(data), "-o", str(out)]
    assert main(argv + [a for s in sets for a in ("--set", s)]) == 0
    assert "attention: mha" in capsys.readouterr().out
    assert json.loads((out / "run.json").read_text())["attention"] == ["mha"]
    assert json.loads((out / "metrics.json").read_text())["attention"] == ["mha"]
    assert "attention: mha" in (out / "config.yaml").read_text()  # the canonical name

    assert main(["eval", str(out), "--data", str(data), "-o", str(tmp_path / "eval")]) == 0
    assert "attention: mha" in capsys.readouterr().out
    assert json.loads((tmp_path / "eval" / "eval.json").read_text())["attention"] == ["mha"]

