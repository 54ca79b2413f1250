import os, sys; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_nb import write, COLAB_NOTE, INSTALL
name = "01_quickstart.ipynb"
write(name, [
("md", f"""
# keras_mvit2 quickstart

{COLAB_NOTE}

Build a MobileViTv2 in Keras 3, port Apple (ml-cvnets) or timm weights if you have a checkpoint,
classify a few photos and look at what the separable self-attention attends to (the paper's
context-score maps, Fig. 5 / Fig. 8).
"""),
("code", INSTALL),
("md", """
## Settings

`CHECKPOINT` is the path of a PyTorch checkpoint of MobileViTv2-0.5 (an Apple ml-cvnets `.pt` or a
timm `.pth` / `.safetensors`). Nothing is downloaded: without a checkpoint the model keeps its
random initialization, so the predictions below are meaningless, but every step still runs.
`MVIT2_SMALL=1` (set by the project's CI) uses a smaller input.
"""),
("code", """
import os

CHECKPOINT = os.environ.get("MVIT2_CHECKPOINT")  # e.g. "mobilevitv2-0.5.pt"
SMALL = os.environ.get("MVIT2_SMALL", "0") == "1"
SIZE = 128 if SMALL else 256
OUT = "mvit2_outputs"  # files written by this notebook
os.makedirs(OUT, exist_ok=True)
"""),
("md", """
## 1. Build a model

`MobileViTV2` follows the `keras.applications` signature. Any width multiplier builds; the seven
published widths also have named builders (`mv.list_models()`). `mv.profile` counts parameters and
multiply-accumulates at the model's input size.
"""),
("code", """
import keras_mvit2 as mv

print(mv.list_models())
model = mv.MobileViTV2(width_multiplier=0.5, input_shape=(SIZE, SIZE, 3), weights=CHECKPOINT)
print(mv.profile(model))
"""),
("md", """
## 2. Classify sample photos

The photos are scikit-image's bundled CC0 / public-domain images. `preprocess_input` maps RGB
uint8 to [0, 1], the reference's preprocessing (no mean/std).
"""),
("code", """
import numpy as np
from PIL import Image
from skimage import data

photos = {"astronaut": data.astronaut(), "cat": data.chelsea(), "coffee": data.coffee(),
          "rocket": data.rocket()}
batch = np.stack([np.asarray(Image.fromarray(p).resize((SIZE, SIZE), Image.BICUBIC))
                  for p in photos.values()])
probs = model.predict(mv.preprocess_input(batch), verbose=0)
for name, top in zip(photos, mv.decode_predictions(probs, top=3)):
    print(f"{name:10s}", ", ".join(f"{label} {score:.2f}" for _, label, score in top))
if CHECKPOINT is None:
    print("(random weights: pass a checkpoint for real predictions)")
"""),
("md", """
## 3. Context-score maps

Each separable attention layer scores the patches against a learned latent token. Folding the
scores back to the feature-map grid shows where each layer looks, at output strides 8, 16 and 32.
"""),
("code", """
from IPython.display import Image as ShowImage

maps = mv.visualize.context_scores(model, batch[1])
png = mv.visualize.plot_context_scores(batch[1], maps, f"{OUT}/context_scores.png")
ShowImage(png)
"""),
("md", """
## 4. Export for a phone

Float32 TFLite for Android (builtin ops only, checked by running it in LiteRT) and a Core ML ML
Program for iPhone. Quantized exports are in `03_quantize_and_export.ipynb`.
"""),
("code", """
report = mv.export.to_tflite(model, f"{OUT}/mobilevitv2_050.tflite")
print(report.size_bytes, "bytes;", report.num_ops, "ops; TRANSPOSE:",
      report.op_histogram.get("TRANSPOSE", 0), "; max rank:", report.max_tensor_rank)
x = mv.preprocess_input(batch)
print("max |TFLite - Keras| =",
      float(np.abs(mv.export.run_tflite(report.path, x) - model.predict(x, verbose=0)).max()))
"""),
])
