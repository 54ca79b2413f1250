import os, sys; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_nb import write, COLAB_NOTE, install
name = "02_train_fashion_mnist.ipynb"
write(name, [
("md", f"""
# Train MobileViTv2 on Fashion-MNIST (or on your own images)

{COLAB_NOTE}

Train MobileViTV2-0.5 from scratch with the paper's recipe (AdamW without weight decay on norms
and biases, linear warm-up + cosine learning rate, label smoothing, gradient clipping, an EMA of
the weights), plot the loss and accuracy curves, and evaluate the model: top-1 / top-5,
per-class accuracy and the confusion matrix. Fashion-MNIST is read from Debian's
`dataset-fashion-mnist` package; the same code trains on a folder of your own images.
"""),
("code", install(colab_only="!apt-get -qq install -y dataset-fashion-mnist > /dev/null")),
("md", """
## Settings

`MVIT2_SMALL=1` (set by the project's CI) trains two short epochs at 32x32 so that every cell
runs in about a minute on a CPU; the accuracy is then far from what the model can do. Without
it the notebook runs the packaged recipe (`keras_mvit2/configs/fashion_mnist.yaml`: 48x48,
12 epochs over the 60,000 training images: 92.8 % in 45 min on 2 CPU cores, faster on a GPU).

`IMAGES` switches to your own data: a folder with one sub-folder of images per class
(`my_images/cat/001.jpg`, `my_images/dog/002.png`, ...). 10 % of each class is held out for
validation; unreadable images are skipped and counted.
"""),
("code", """
import os

SMALL = os.environ.get("MVIT2_SMALL", "0") == "1"
IMAGES = os.environ.get("MVIT2_IMAGES")  # e.g. "my_images"; None: Fashion-MNIST
OUT = "mvit2_outputs"  # files written by this notebook
os.makedirs(OUT, exist_ok=True)
"""),
("md", """
## 1. The training config

A config is a validated YAML tree (model, data, optimizer, schedule, augment, ema, training,
output). `load_config` reads a packaged config by name and applies `section.field=value`
overrides; a wrong key or value fails at once with the field named. The command-line
equivalent is `mvit2 train --config fashion_mnist --set training.epochs=2` (`--data DIR` for a
folder).
"""),
("code", """
import json

from keras_mvit2 import training

overrides = [f"output.dir={OUT}/fashion_mnist", "output.resume=false", "output.tensorboard=false",
             "output.verbose=2"]
if SMALL:
    overrides += ["model.image_size=32", "training.epochs=2", "training.steps_per_epoch=30",
                  "training.validate_every=1", "data.validation_limit=500",
                  "schedule.warmup_epochs=0.2", "optimizer.lr=0.003"]
if IMAGES:
    overrides += ["data.source=image_folder", f"data.train={json.dumps(IMAGES)}",
                  "data.validation_fraction=0.1", "data.crop_ratio=0.875",
                  "model.num_classes=null", f"output.dir={OUT}/my_images"]
config = training.load_config("fashion_mnist", overrides=overrides)
print(config.to_yaml())
"""),
("md", """
## 2. Train

`train` writes a run folder: the final config, a checkpoint after every epoch (run the cell
again with `output.resume=true` and it continues where it stopped), `model.keras` and
`model_ema.keras` (float32 inference models with softmax) and `metrics.json`. The callback
below only records the running loss and accuracy after every step, for the curves.
"""),
("code", """
import keras

steps = []
record = keras.callbacks.LambdaCallback(
    on_train_batch_end=lambda batch, logs: steps.append({k: float(v) for k, v in logs.items()}))
result = training.train(config, callbacks=[record])
print(f"{result.optimizer_step} steps, global batch {result.global_batch_size}, "
      f"{result.images_per_second:.0f} images/s")
for name, metrics in result.metrics.items():
    print(f"{name:>4s} weights: top-1 {metrics.top1:.2%}, top-5 {metrics.top5:.2%}")
"""),
("md", """
## 3. Loss and accuracy curves

Left: the training loss and accuracy after every step (Keras' running mean over the epoch so
far). Right: the validation accuracy after every validated epoch, of the trained weights and of
their EMA (`result.history`).
"""),
("code", """
import matplotlib.pyplot as plt

fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.8))
ax.plot([s["loss"] for s in steps], color="tab:blue")
ax.set_xlabel("step")
ax.set_ylabel("training loss", color="tab:blue")
ax2 = ax.twinx()
ax2.plot([s["accuracy"] for s in steps], color="tab:orange")
ax2.set_ylabel("training accuracy", color="tab:orange")
ax.set_title("training (running mean per epoch)")
epochs = [h for h in result.history if "val_accuracy" in h]
for key, label in (("accuracy", "train"), ("val_accuracy", "validation"),
                   ("val_ema_accuracy", "validation, EMA weights")):
    bx.plot([h["epoch"] for h in epochs], [h.get(key) for h in epochs], marker="o", label=label)
bx.set_xticks([h["epoch"] for h in epochs])
bx.set_xlabel("epoch")
bx.set_ylabel("top-1 accuracy")
bx.set_title("accuracy per epoch")
bx.legend()
fig.tight_layout()
fig.savefig(f"{OUT}/training_curves.png")
plt.show()
"""),
("md", """
## 4. Evaluate the saved model

A saved model is evaluated on the validation data with `training.evaluate`: top-1, top-5, the
accuracy of each class and the confusion matrix (`mvit2 eval MODEL --data fashion_mnist` does
the same from the command line). It gives the figure `train` reported for the same weights.
"""),
("code", """
from keras_mvit2 import data as mvdata

model = keras.saving.load_model(result.ema_model_path or result.model_path)
_, val_source = training.make_sources(config)
class_names = list(val_source.class_names)
val_data = mvdata.make_eval_dataset(val_source, image_size=config.model.image_size,
                                    batch_size=256, num_classes=len(class_names),
                                    crop_ratio=config.data.crop_ratio)
evaluation = training.evaluate(model, val_data, class_names)
print(f"top-1 {evaluation.top1:.2%}, top-5 {evaluation.top5:.2%} on "
      f"{evaluation.num_examples} images (train reported "
      f"{result.metrics['ema' if result.ema_model_path else 'raw'].top1:.2%})")
for name, accuracy in sorted(evaluation.per_class().items(), key=lambda item: item[1]):
    print(f"{name:>12s} {accuracy:6.1%}")
"""),
("md", """
## 5. Confusion matrix

Rows are the true classes, columns the predicted ones; colours are the fraction of each true
class, the numbers are counts. On Fashion-MNIST the confusions are between shirts, T-shirts,
pullovers and coats.
"""),
("code", """
from IPython.display import Image

png = training.plot_confusion_matrix(evaluation, f"{OUT}/confusion_matrix.png")
Image(png)
"""),
("md", """
Next: `03_quantize_and_export.ipynb` quantizes a trained model (int8, float16, QAT) and exports
it to TFLite and Core ML; `mvit2 demo` runs training, export, validation and a benchmark in one
command.
"""),
])
