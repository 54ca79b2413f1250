"""KerasHub's own model harness on our KerasHub classes: `keras_hub.src.tests.test_case.TestCase`.

The tests KerasHub holds each of its image models to, imported from the installed keras-hub
(the `hub` extra; its harness needs `grain`, in the `test` extra) and called as KerasHub's
own image model tests call them (keras_hub/src/models/mobilenet/*_test.py, vit/*_test.py,
layers/preprocessing/image_converter_test.py), with the harness' default tolerances (the
LiteRT comparison as KerasHub's ResNet test sets it):

- `MobileViTV2Backbone`: `run_vision_backbone_test` (serialization, eager call, compiled
  `predict` on arrays and on a tf.data dataset, the class name, mixed precision and int8 /
  float8 quantization where the harness runs them: not on PyTorch's CPU; channels-last
  only, as MobileNet's test), `run_model_saving_test` (`.keras` round trip);
- `MobileViTV2ImageClassifier`: `run_task_test` (`predict` on arrays, on a tf.data
  dataset and with the preprocessing split out, all equal; `fit` the three ways; no
  `fit` without `compile`), `test_head_dtype`, `run_model_saving_test`,
  `run_litert_export_test` (PyTorch only, the harness skips itself elsewhere:
  litert-torch's `.tflite` run in LiteRT, compared as KerasHub's ResNet test does; the
  backbone's own export, the same graph without the head, is left out: ~1 min each);
- `MobileViTV2ImageConverter` and `MobileViTV2ImageClassifierPreprocessor`:
  `run_preprocessing_layer_test` (serialization; the direct call equal to the layer
  mapped over a tf.data dataset, unbatched and batched, and over a grain dataset).

The raw images are random uint8 photos of another size than the model's, so the
converter's resize and crop really run: on arrays (the direct call, grain) and in tf.data
the converter must give the same numbers (one TensorFlow form on every backend).

Runs on the default backend in the fast tier (the backbone test, which retraces the backbone
for each precision and quantization mode, the task test, which trains, the `.keras` saves and
the LiteRT export in the slow tier), and under `KERAS_BACKEND=jax` and
`KERAS_BACKEND=torch` with `--run-slow` as steps of `.ci/run`. keras_hub and its harness
import TensorFlow on every backend. pytest also collects `tf.test.TestCase.test_session`
(inherited from the harness), which TensorFlow skips as "Not a test".
"""

import keras
import numpy as np
import pytest

if keras.backend.backend() == "torch":
    # keras_hub imports TensorFlow on every backend. Torch convolutions were seen to
    # segfault in a process that imported TensorFlow first (tests/backend_worker.py);
    # running one before is the order known to work (not reproduced with torch 2.13.0 /
    # TensorFlow 2.21.0, where this module passes either way).
    keras.ops.conv(np.ones((1, 8, 8, 3), "float32"), np.ones((3, 3, 3, 4), "float32"))
pytest.importorskip("keras_hub")
pytest.importorskip("grain")  # KerasHub's harness imports it
# The module, not its class: pytest would collect an imported `TestCase` as a test class.
from keras_hub.src.tests import test_case

from keras_mvit2.kerashub import (
    MobileViTV2Backbone,
    MobileViTV2ImageClassifier,
    MobileViTV2ImageClassifierPreprocessor,
    MobileViTV2ImageConverter,
)

SIZE = 64
#: The backbone's output for SIZE: stride 32, MobileViTV2-0.5's 256 channels.
FEATURES = (2, SIZE // 32, SIZE // 32, 256)


def _photos(n: int = 2, height: int = 75, width: int = 90, seed: int = 0) -> np.ndarray:
    """Random uint8 RGB photos of another size than the model's (the resize and crop run)."""
    return np.random.default_rng(seed).integers(0, 256, (n, height, width, 3), dtype=np.uint8)


class MobileViTV2BackboneTest(test_case.TestCase):
    def setUp(self):
        self.init_kwargs = {"width_multiplier": 0.5, "image_shape": (SIZE, SIZE, 3)}
        self.input_data = keras.ops.convert_to_tensor(
            np.random.default_rng(1).random((2, SIZE, SIZE, 3)).astype("float32"))

    # 10 s on the AVX-512 host, 16 s on an AVX2-only one (over the fast tier's limit, at
    # 32x32 too): the harness retraces the backbone for mixed precision and quantization.
    @pytest.mark.slow
    def test_backbone_basics(self):
        self.run_vision_backbone_test(
            cls=MobileViTV2Backbone,
            init_kwargs=self.init_kwargs,
            input_data=self.input_data,
            expected_output_shape=FEATURES,
            run_data_format_check=False,
        )

    @pytest.mark.slow
    def test_saved_model(self):
        self.run_model_saving_test(
            cls=MobileViTV2Backbone,
            init_kwargs=self.init_kwargs,
            input_data=self.input_data,
        )


class MobileViTV2ImageClassifierTest(test_case.TestCase):
    def setUp(self):
        self.images = _photos()
        self.labels = [0, 2]
        self.backbone = MobileViTV2Backbone(width_multiplier=0.5, image_shape=(SIZE, SIZE, 3))
        self.image_converter = MobileViTV2ImageConverter(image_size=(SIZE, SIZE))
        self.preprocessor = MobileViTV2ImageClassifierPreprocessor(self.image_converter)
        self.init_kwargs = {
            "backbone": self.backbone,
            "preprocessor": self.preprocessor,
            "num_classes": 3,
        }
        self.train_data = (self.images, self.labels)

    @pytest.mark.slow  # fit traces MobileViTV2's training step (~30 s on TensorFlow)
    def test_classifier_basics(self):
        self.run_task_test(
            cls=MobileViTV2ImageClassifier,
            init_kwargs=self.init_kwargs,
            train_data=self.train_data,
            expected_output_shape=(2, 3),
        )

    def test_head_dtype(self):
        model = MobileViTV2ImageClassifier(**self.init_kwargs, head_dtype="bfloat16")
        self.assertEqual(model.output_dense.compute_dtype, "bfloat16")

    @pytest.mark.slow
    def test_saved_model(self):
        self.run_model_saving_test(
            cls=MobileViTV2ImageClassifier,
            init_kwargs=self.init_kwargs,
            input_data=keras.ops.convert_to_tensor(self.preprocessor(self.images)),
        )

    @pytest.mark.slow
    def test_litert_export(self):
        # As KerasHub's ResNet classifier test: a deep float32 network's LiteRT logits are
        # not within the strict 1e-6 of torch's (measured on 3 seeds: max |diff| 1.2e-6 to
        # 7.1e-6, mean 1.1e-6 to 3.0e-6; the backbone's 2048 features: max 1.5e-5 to 4.3e-5).
        self.run_litert_export_test(
            cls=MobileViTV2ImageClassifier,
            init_kwargs=self.init_kwargs,
            input_data=keras.ops.convert_to_numpy(self.preprocessor(self.images)),
            expected_output_shape=(2, 3),
            comparison_mode="statistical",
            output_thresholds={"*": {"max": 5e-5, "mean": 1e-5}},
        )


class MobileViTV2PreprocessingTest(test_case.TestCase):
    def test_image_converter_basics(self):
        self.run_preprocessing_layer_test(
            cls=MobileViTV2ImageConverter,
            init_kwargs={"image_size": (SIZE, SIZE)},
            input_data=_photos(),
        )

    def test_preprocessor_basics(self):
        self.run_preprocessing_layer_test(
            cls=MobileViTV2ImageClassifierPreprocessor,
            init_kwargs={"image_converter": MobileViTV2ImageConverter(image_size=(SIZE, SIZE))},
            input_data=(_photos(seed=2), np.array([1, 0])),
        )
