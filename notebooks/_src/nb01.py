import os, sys; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_nb import write, COLAB_NOTE, INSTALL
name = "01_quickstart.ipynb"
write(name, [
("md", f"""
# keras_mvit2 quickstart

{COLAB_NOTE}

A pretrained MobileViTv2 in one line, a few photos classified with the checkpoint's own
preprocessing, what the separable self-attention attends to (the paper's context-score maps,
Fig. 5 / Fig. 8), and a TFLite file for a phone.
"""),
("code", INSTALL),
("md", """
## Settings

`MVIT2_SMALL=1` (set by the project's CI) keeps the export step small. In the project's CI the
weights come from a local stand-in of the Hugging Face hub (`HF_ENDPOINT`) serving a checkpoint
with random weights, so the labels printed there are meaningless; in Colab they are Apple's.
"""),
("code", """
import os

SMALL = os.environ.get("MVIT2_SMALL", "0") == "1"
STAND_IN = os.environ.get("MVIT2_HUB_STANDIN") == "1"  # CI: random weights from a local hub
OUT = "mvit2_outputs"  # files written by this notebook
os.makedirs(OUT, exist_ok=True)
"""),
("md", """
## 1. A pretrained model

`weights="imagenet"` downloads Apple's ImageNet-1k weights once (timm's copy on the Hugging Face
hub, `timm/mobilevitv2_050.cvnets_in1k`, 5.5 MB), ports them to Keras and caches the result: the
next run reads one `.weights.h5`, also offline (`HF_HUB_OFFLINE=1`). `mv.list_weights()` lists
every published checkpoint with its input size and top-1.
"""),
("code", """
import keras_mvit2 as mv

for w in mv.list_weights("mobilevitv2_050"):
    print(f"{w.model}  weights={w.tag!r:16s} {w.input_size}x{w.input_size}  top-1 {w.top1:.2f} %")
model = mv.MobileViTV2(0.5, weights="imagenet")
print(mv.profile(model))
"""),
("md", """
## 2. Classify photos

The photos are scikit-image's bundled CC0 / public-domain images. `preprocess_images` applies
the checkpoint's evaluation transform: RGB, shorter side resized to 288 (bicubic), center crop
256, pixels / 255 (no mean/std). It takes paths, PIL images, uint8 arrays and tf tensors.
"""),
("code", """
from skimage import data

photos = {"astronaut": data.astronaut(), "cat": data.chelsea(), "coffee": data.coffee(),
          "rocket": data.rocket()}
x = mv.preprocess_images(list(photos.values()), model)
probs = model.predict(x, verbose=0)
for name, top in zip(photos, mv.decode_predictions(probs, top=5)):
    print(f"{name}:")
    for synset, label, score in top:
        print(f"    {score:6.3f}  {label} ({synset})")
if STAND_IN:
    print("(CI stand-in hub: random weights, so these labels are meaningless)")
"""),
("md", """
## 3. Context-score maps

Each separable attention layer scores the patches against a learned latent token. Folding the
scores back to the feature-map grid shows where each layer looks, at output strides 8, 16 and 32.
"""),
("code", """
from IPython.display import Image as ShowImage

maps = mv.visualize.context_scores(model, x[1])
png = mv.visualize.plot_context_scores(x[1], maps, f"{OUT}/context_scores.png")
ShowImage(png)
"""),
("md", """
## 4. Export for a phone

Float32 TFLite for Android (builtin ops only, checked by running it in LiteRT) and a Core ML ML
Program for iPhone. `mvit2 demo --pretrained --calibration PHOTOS/` makes the int8 TFLite and
Core ML files with the ImageNet labels; more in `03_quantize_and_export.ipynb`.
"""),
("code", """
report = mv.export.to_tflite(model, f"{OUT}/mobilevitv2_050.tflite")
print(report.size_bytes, "bytes;", report.num_ops, "ops; TRANSPOSE:",
      report.op_histogram.get("TRANSPOSE", 0), "; max rank:", report.max_tensor_rank)
batch = x[:2] if SMALL else x
print("max |TFLite - Keras| =",
      float(abs(mv.export.run_tflite(report.path, batch) - model.predict(batch, verbose=0)).max()))
"""),
])
