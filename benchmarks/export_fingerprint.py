"""Export fingerprint: what every export path writes, to prove a refactor changed nothing.

    python benchmarks/export_fingerprint.py [--out DIR] [--compare BASELINE.json] [--no-coreml]

Builds a fixed set of models with seeded random weights (MobileViTv2-0.5 with every
registered attention, MobileViT-XXS, DeiT-Tiny-shaped ViT, SSDLite with and without the
TFLite detection post-process, DeepLabV3), exports each through the public API (TFLite in
every numeric format, Core ML in both precisions and the Vision detector pipeline) and runs
the twin that quantization-aware training builds. For each file it records the SHA-256 of
the bytes, the op histogram (TFLite) or MIL op counts (Core ML), and the outputs on fixed
images (TFLite and the twin; Core ML does not run on Linux).

Writes ``export_fingerprint.json`` (+ ``export_fingerprint.npz`` with the outputs) and
``export_fingerprint.md`` to ``--out`` (default ``benchmarks/results/``). With
``--compare BASELINE.json`` it also checks this run against a baseline: every file must be
byte-identical, or else have the same ops and outputs within 1e-6 (the converter is not
deterministic everywhere); the table says which, and the exit status is 1 if any differs.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import sys
import tempfile

import numpy as np

ATOL = 1e-6
SIZE = 64


def _sha(path: str) -> str:
    digest = hashlib.sha256()
    paths = [path] if os.path.isfile(path) else sorted(
        p for p in glob.glob(os.path.join(path, "**"), recursive=True) if os.path.isfile(p))
    for p in paths:
        if os.path.isdir(path):
            digest.update(os.path.relpath(p, path).encode())
        with open(p, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def _models():
    """name -> (model factory, kind). Weights are seeded per model."""
    import keras_mvit2 as mv
    from keras_mvit2 import attention
    from keras_mvit2.tasks import DeepLabV3, SSDLite

    shape = (SIZE, SIZE, 3)
    cases = {}
    for name in attention.available():
        cases[f"mobilevitv2_050_{name}"] = (
            lambda name=name: mv.MobileViTV2(0.5, input_shape=shape, classes=10,
                                             attention=name), "classifier")
    cases["mobilevit_xxs"] = (lambda: mv.create_model("mobilevit_xxs", input_shape=shape,
                                                      classes=10), "classifier")
    cases["ssdlite_050"] = (lambda: SSDLite(0.5, input_shape=(128, 128, 3), classes=4),
                            "detector")
    cases["deeplabv3_050"] = (lambda: DeepLabV3(0.5, input_shape=shape, classes=5),
                              "segmenter")
    return cases


def _trained_looking(model):
    """`model` with its all-zero weights (norm shifts, biases) set to small seeded values,
    as after training (int16x8 refuses zero shifts, and they hide ops' biases)."""
    rng = np.random.default_rng(0)
    for weight in model.weights:
        value = np.asarray(weight.numpy())
        if value.size and not value.any() and "variance" not in weight.path:
            weight.assign(rng.uniform(-0.1, 0.1, value.shape).astype(value.dtype))
    return model


def _images(shape, n=4, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0, 1, (n, *shape)).astype("float32")


def main(argv: list[str] | None = None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(here, "results"))
    parser.add_argument("--compare", default=None)
    parser.add_argument("--no-coreml", action="store_true")
    parser.add_argument("--no-twin", action="store_true")
    args = parser.parse_args(argv)

    import keras

    from keras_mvit2 import export
    from keras_mvit2.export.detection_postprocess import with_detection_postprocess

    coreml = not args.no_coreml
    if coreml:
        from keras_mvit2.export.coreml_detection import to_coreml_detector

    records: dict[str, dict] = {}
    outputs: dict[str, np.ndarray] = {}
    twins: list[tuple[str, keras.Model, np.ndarray]] = []
    with tempfile.TemporaryDirectory(prefix="keras_mvit2_fingerprint_") as tmp:
        for name, (factory, kind) in _models().items():
            keras.utils.set_random_seed(0)
            model = _trained_looking(factory())
            shape = tuple(model.input_shape[1:])
            x = _images(shape)
            calibration = _images(shape, n=16, seed=1)
            formats = ["float32", "int8"]
            if name == "mobilevitv2_050_separable":
                formats = ["float32", "float16", "dynamic_int8", "int8", "int16x8"]
            for fmt in formats:
                path = os.path.join(tmp, f"{name}_{fmt}.tflite")
                rep = calibration if fmt in ("int8", "int16x8") else None
                names = [f"class_{i}" for i in range(10)] if kind == "classifier" else None
                report = export.to_tflite(model, path, quantization=fmt,
                                          representative_data=rep, class_names=names,
                                          allow_float_ops=True)
                key = f"tflite/{name}/{fmt}"
                records[key] = {"sha256": _sha(path), "ops": report.op_histogram}
                outputs[key] = np.concatenate(
                    [np.asarray(export.run_tflite(path, x[i:i + 1])).reshape(1, -1)
                     for i in range(len(x))])
            if kind == "detector":
                path = os.path.join(tmp, f"{name}_postprocess.tflite")
                report = export.to_tflite(with_detection_postprocess(model), path,
                                          class_names=[f"object_{i}" for i in range(3)])
                records[f"tflite/{name}/postprocess"] = {"sha256": _sha(path),
                                                        "ops": report.op_histogram}
            if coreml:
                precisions = ["float16", "float32"] if name == "mobilevitv2_050_separable" \
                    else ["float16"]
                for precision in precisions:
                    path = os.path.join(tmp, f"{name}_{precision}.mlpackage")
                    labels = [f"class_{i}" for i in range(10)] if kind == "classifier" else None
                    report = export.to_coreml(model, path, precision=precision,
                                              class_labels=labels)
                    records[f"coreml/{name}/{precision}"] = {"sha256": _sha(path),
                                                            "ops": report.op_histogram}
                if kind == "detector":
                    path = os.path.join(tmp, f"{name}_vision.mlpackage")
                    to_coreml_detector(model, path, [f"object_{i}" for i in range(3)])
                    records[f"coreml/{name}/vision"] = {
                        "sha256": _sha(path), "ops": export.inspect_coreml(path).op_histogram}
            if kind == "classifier" and not args.no_twin:
                twins.append((name, model, x))
            print(f"{name}: done", flush=True)
        if twins:
            from keras_mvit2.quantize.tf_keras_twin import twin_outputs

            got = twin_outputs([m for _, m, _ in twins], twins[0][2])
            for (name, model, x), y in zip(twins, got, strict=True):
                key = f"twin/{name}"
                outputs[key] = np.asarray(y, np.float32).reshape(len(x), -1)
                records[key] = {"max_abs_vs_keras": float(np.abs(
                    outputs[key] - np.asarray(model.predict(x, verbose=0)).reshape(len(x), -1)
                ).max())}

    for key, y in outputs.items():
        records[key]["output_sha256"] = hashlib.sha256(
            np.ascontiguousarray(y, np.float32).tobytes()).hexdigest()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "export_fingerprint.json"), "w") as f:
        json.dump(records, f, indent=1, sort_keys=True)
    np.savez(os.path.join(args.out, "export_fingerprint.npz"),
             **{k.replace("/", "__"): v for k, v in outputs.items()})

    rows = ["| export | ops | sha256 | vs baseline |", "|---|---|---|---|"]
    failed = 0
    base = base_out = None
    if args.compare:
        with open(args.compare) as f:
            base = json.load(f)
        base_out = np.load(os.path.splitext(args.compare)[0] + ".npz")
    for key, rec in sorted(records.items()):
        verdict = ""
        if base is not None:
            old = base.get(key)
            if old is None:
                verdict = "new"
            elif old.get("sha256") == rec.get("sha256") and \
                    old.get("output_sha256") == rec.get("output_sha256"):
                verdict = "identical"
            elif old.get("ops") != rec.get("ops"):
                verdict, failed = "DIFFERENT OPS", failed + 1
            elif key.replace("/", "__") in base_out.files and key in outputs:
                diff = float(np.abs(base_out[key.replace("/", "__")] - outputs[key]).max())
                ok = diff <= ATOL
                verdict = f"same ops, outputs {'within' if ok else 'OVER'} 1e-6 ({diff:.1e})"
                failed += not ok
            elif "sha256" in rec:
                verdict = "same ops, bytes differ (no outputs to compare)"
            else:
                verdict, failed = "outputs differ", failed + 1
        ops = sum(rec.get("ops", {}).values()) if "ops" in rec else "-"
        rows.append(f"| {key} | {ops} | {rec.get('sha256', rec.get('output_sha256'))[:12]} "
                    f"| {verdict} |")
    if base is not None:
        for key in sorted(set(base) - set(records)):
            rows.append(f"| {key} | - | - | MISSING |")
            failed += 1
    table = "\n".join(rows)
    with open(os.path.join(args.out, "export_fingerprint.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
