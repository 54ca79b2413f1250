import os, sys; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_nb import write, COLAB_NOTE, install
name = "03_quantize_and_export.ipynb"
write(name, [
("md", f"""
# Quantize and export: TFLite (float16, int8, QAT) and Core ML

{COLAB_NOTE}

Take a trained MobileViTV2-0.5 to a phone: post-training quantization to float16 and
full-integer int8 TFLite (calibrated on training images), quantization-aware training (QAT)
of that int8 file's own graph, a Core ML ML Program for iPhone, and one validation table
that compares every export with the Keras model on held-out test images: output differences,
top-1 agreement, accuracy, size, ops left in float and XNNPACK coverage.
"""),
("code", install("coreml", colab_only="!apt-get -qq install -y dataset-fashion-mnist > /dev/null")),
("md", """
## Settings

Int8 needs trained weights: with random weights the activations vanish and the int8 outputs
go constant, so the notebook trains MobileViTV2-0.5 on Fashion-MNIST for one short epoch first
(the `mvit2 demo` recipe), unless `MVIT2_MODEL` names a trained `.keras` classifier (e.g. the
`model_ema.keras` of `02_train_fashion_mnist.ipynb`) whose classes are Fashion-MNIST's.

`MVIT2_SMALL=1` (the project's CI) trains 48 steps at 32x32 and validates on 500 images; it
skips the quantization-aware training (three conversions and a training: minutes on two
cores; `tests/test_qat.py` covers it) unless `MVIT2_QAT=1`, and then trains 20 steps of 16
images. Without it QAT trains 3 passes of 150 steps; `MVIT2_QAT=0` skips it.
"""),
("code", """
import os

SMALL = os.environ.get("MVIT2_SMALL", "0") == "1"
MODEL = os.environ.get("MVIT2_MODEL")  # a trained .keras classifier; None: train one here
RUN_QAT = os.environ.get("MVIT2_QAT", "0" if SMALL else "1") == "1"
NUM_TEST = 500 if SMALL else 2000  # held-out test images for the validation
QAT_EPOCHS, QAT_STEPS, QAT_BATCH = (1, 20, 16) if SMALL else (3, 150, 8)
OUT = "mvit2_outputs"  # files written by this notebook
os.makedirs(OUT, exist_ok=True)
"""),
("md", """
## 1. A trained model

`demo.train_config` is the packaged Fashion-MNIST recipe cut to one epoch on a subset (what
`mvit2 demo` trains); `training.train` saves `model.keras`, the float32 model with softmax that
is exported below.
"""),
("code", """
import keras

from keras_mvit2 import demo, training

if MODEL is None:
    settings = demo.DemoSettings(image_size=32, train_steps=48) if SMALL else demo.FULL
    config = demo.train_config(f"{OUT}/trained", settings, verbose=2)
    result = training.train(config)
    MODEL = result.model_path
    print(f"trained: top-1 {result.metrics['raw'].top1:.2%} on "
          f"{result.metrics['raw'].num_examples} test images")
model = keras.saving.load_model(MODEL)
SIZE = model.input_shape[1]
print(model.name, model.input_shape, "->", model.output_shape)
"""),
("md", """
## 2. Held-out test images

The validation images are the first test images of Fashion-MNIST at the model's input size
(the evaluation transform); the int8 calibration below reads other images, from the training
split. For your own data pass a folder with one sub-folder per class instead of
`"fashion_mnist:test"`.
"""),
("code", """
from keras_mvit2.export import load_labelled_images

test = load_labelled_images("fashion_mnist:test", image_size=(SIZE, SIZE), limit=NUM_TEST)
print(test.images.shape, test.images.dtype, "labels", test.labels[:10], test.class_names[:3])
"""),
("md", """
## 3. Post-training quantization to TFLite

`to_tflite` converts with builtin ops only (no Flex), writes the file atomically and runs it in
LiteRT before returning. `float16` halves the weights; `int8` is full integer (weights and
activations), its activation ranges calibrated on `representative_data`: here 200 shuffled
Fashion-MNIST training images (`"fashion_mnist"`; a folder of images, a numpy array or a
`tf.data.Dataset` work too). An int8 model in which some op stayed float is an error unless
`allow_float_ops=True`. With the default `io_dtype="float32"` the model quantizes its input
and dequantizes its output itself; `io_dtype="int8"` or `"uint8"` lets an app feed raw pixels.
"""),
("code", """
from keras_mvit2.export import to_tflite

exports = {}
for quantization in ("float32", "float16", "int8"):
    path = f"{OUT}/model_{quantization}.tflite"
    report = to_tflite(model, path, quantization=quantization,
                       representative_data="fashion_mnist" if quantization == "int8" else None,
                       class_names=test.class_names)
    exports[quantization] = path
    print(f"{quantization:>8s}: {report.size_bytes / 1e6:.2f} MB, {report.num_ops} ops, "
          f"float ops left: {report.float_ops if quantization == 'int8' else '(float model)'}")
"""),
("md", """
## 4. Quantization-aware training (QAT)

`keras_mvit2.quantize.qat` starts where post-training quantization ends: it sets a quarter
of the training images aside (seeded) to judge on, converts the int8 file as above, then
trains the convolution and dense weights of that file's own calibrated graph, run in
TensorFlow with every tensor rounded as the int8 file rounds it, towards the float graph's
answers (distillation, on the other training images; the labels are not used), and converts
again with the trained weights: the same ops and tensors. Both files then run in LiteRT on
the held-out `validation_data` and the set-aside images (none of them trained or calibrated
on), and the QAT file is written to `output_path` only where McNemar's exact one-sided test
on the images where the two files disagree gives p < 0.05 that it agrees with the Keras model
more often, its top-1 there is not lower and nothing is lower on the held-out images;
otherwise the post-training file is. A QAT file that agrees no more often is written in at
most 5 % of runs. `result.shipped` says which file (`"qat"` or `"post_training"`),
`result.choice` the figures and `result.reason` why; `learning_rate=0` gives the post-training
file's ops, quantization parameters and outputs. It runs in this process, on the TensorFlow
backend.
"""),
("code", """
if RUN_QAT:
    from keras_mvit2.quantize import qat

    qat_result = qat(model, "fashion_mnist", epochs=QAT_EPOCHS, steps_per_epoch=QAT_STEPS,
                     batch_size=QAT_BATCH, output_path=f"{OUT}/model_qat_int8.tflite",
                     io_dtype="float32", validation_data=(test.images, test.labels),
                     class_names=test.class_names, verbose=not SMALL)
    choice = qat_result.choice
    exports[f"int8 after QAT ({qat_result.shipped})"] = qat_result.tflite_path
    print(f"judged on {qat_result.judged_on}")
    print(f"agreement with Keras: post-training {choice.agreement_a:.2%}, QAT "
          f"{choice.agreement_b:.2%} (paired test p = {choice.p_value:.2g}): wrote the "
          f"{qat_result.shipped} file ({qat_result.reason})")
    print(f"top-1 on {qat_result.num_validation} test images: Keras "
          f"{qat_result.float_accuracy:.2%}, the file {qat_result.int8_accuracy:.2%} "
          f"({qat_result.seconds:.0f} s, training {qat_result.train_seconds:.0f} s)")
else:
    print("QAT skipped (MVIT2_QAT=0).")
"""),
("md", """
## 5. Core ML for iPhone

`to_coreml` writes an ML Program (`.mlpackage`, iOS 16+) with an RGB image input (scale 1/255,
the model's preprocessing) and the class labels, in float16 by default (what the Neural Engine
runs). Conversion works on any OS; Core ML predictions need macOS, so on Linux the validation
below reports its structure only.
"""),
("code", """
from keras_mvit2.export import to_coreml

coreml = to_coreml(model, f"{OUT}/model.mlpackage", class_names=test.class_names)
exports["coreml"] = coreml.path
print(f"{coreml.size_bytes / 1e6:.2f} MB, {sum(coreml.op_histogram.values())} ops, "
      f"inputs {coreml.inputs}")
"""),
("md", """
## 6. The validation table

`validate` runs each export and the Keras model on the same test images (the Keras outputs
are computed once and shared) and reports what the export lost. `mvit2 validate FILE ...
--reference MODEL --data fashion_mnist` prints the same table from the command line.
"""),
("code", """
from keras_mvit2.export import print_reports, save_reports, validate
from keras_mvit2.export.validate import reference_outputs

reference = reference_outputs(model, test.images)
reports = [validate(path, model, test.images, test.labels, class_names=test.class_names,
                    reference_outputs=reference) for path in exports.values()]
print_reports(reports)
save_reports(reports, f"{OUT}/validation.json")
"""),
("md", """
Next: `04_benchmark.ipynb` measures the latency of an exported model on this machine and shows
how to run the same measurement on an Android phone or an iPhone.
"""),
])
