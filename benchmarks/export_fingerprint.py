"""Export fingerprint: what every export path writes, to prove a refactor changed nothing.

    python benchmarks/export_fingerprint.py [--out DIR] [--compare BASELINE.json] [--no-coreml]
        [--no-twin] [--models SUBSTRING ...]

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


def _zip_times_zeroed(data: bytes) -> bytes:
    """`data` with the modification times of the zip appended to a .tflite zeroed (the
    packed labels.txt of the standard metadata carries the time of the export)."""
    import io
    import zipfile

    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        return data
    out = bytearray(data)
    for info in archive.infolist():  # local headers: time and date at +10
        out[info.header_offset + 10:info.header_offset + 14] = bytes(4)
    position = archive.start_dir  # central directory entries: time and date at +12
    while out[position:position + 4] == b"PK\x01\x02":
        out[position + 12:position + 16] = bytes(4)
        lengths = [int.from_bytes(out[position + k:position + k + 2], "little")
                   for k in (28, 30, 32)]
        position += 46 + sum(lengths)
    return bytes(out)


def _sha(path: str) -> str:
    """SHA-256 of an export's content: a .tflite with its zip times zeroed; an .mlpackage's
    files but Manifest.json (random item identifiers)."""
    digest = hashlib.sha256()
    if os.path.isfile(path):
        with open(path, "rb") as f:
            digest.update(_zip_times_zeroed(f.read()))
        return digest.hexdigest()
    for p in sorted(glob.glob(os.path.join(path, "**"), recursive=True)):
        if os.path.isfile(p) and os.path.basename(p) != "Manifest.json":
            digest.update(os.path.relpath(p, path).encode())
            with open(p, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


def _pipeline_ops(path: str) -> dict[str, int]:
    """MIL op histogram of the ML Programs inside a Core ML pipeline, by model index."""
    import coremltools as ct

    spec = ct.models.MLModel(path, skip_model_load=True).get_spec()
    histogram: dict[str, int] = {}
    for index, model in enumerate(spec.pipeline.models):
        kind = model.WhichOneof("Type")
        if kind != "mlProgram":
            histogram[f"{index}:{kind}"] = 1
            continue
        for function in model.mlProgram.functions.values():
            for block in function.block_specializations.values():
                for op in block.operations:
                    key = f"{index}:{op.type}"
                    histogram[key] = histogram.get(key, 0) + 1
    return dict(sorted(histogram.items()))


def _recorded(records: dict, key: str, make, *args, **kwargs) -> bool:
    """`records[key] = make(*args, **kwargs)`, or the error it raised (recorded, not fatal)."""
    try:
        records[key] = make(*args, **kwargs)
        return True
    except Exception as err:  # an error is a fingerprint too
        records[key] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
        print(f"{key}: {records[key]['error']}", flush=True)
        return False


def _tflite(model, path: str, **options) -> dict:
    from keras_mvit2 import export

    report = export.to_tflite(model, path, **options)
    return {"sha256": _sha(path), "ops": report.op_histogram}


def _coreml(model, path: str, **options) -> dict:
    from keras_mvit2 import export

    report = export.to_coreml(model, path, **options)
    return {"sha256": _sha(path), "ops": report.op_histogram}


def _vision(model, path: str, object_names: list[str]) -> dict:
    # The old path of to_coreml_detector (kept working by the export redesign).
    from keras_mvit2.export.coreml.detection import to_coreml_detector

    to_coreml_detector(model, path, object_names)
    return {"sha256": _sha(path), "ops": _pipeline_ops(path)}


def _models():
    """name -> (model factory, kind). Weights are seeded per model."""
    import keras_mvit2 as mv
    from keras_mvit2.layers import attention_registry
    from keras_mvit2.tasks import DeepLabV3, SSDLite

    shape = (SIZE, SIZE, 3)
    cases = {}
    for name in attention_registry.available():
        # RFA draws its random features from `seed` (None: a new draw every build).
        layer = {"name": name, "seed": 0} if name == "rfa" else name
        cases[f"mobilevitv2_050_{name}"] = (
            lambda layer=layer: mv.MobileViTV2(0.5, input_shape=shape, classes=10,
                                               attention=layer), "classifier")
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
    parser.add_argument("--models", nargs="*", metavar="SUBSTRING",
                        help="only the models whose name contains one of these")
    args = parser.parse_args(argv)

    import keras

    from keras_mvit2 import export
    from keras_mvit2.export.tflite.detection_postprocess import with_detection_postprocess

    coreml = not args.no_coreml
    records: dict[str, dict] = {}
    outputs: dict[str, np.ndarray] = {}
    twins: list[tuple[str, keras.Model, np.ndarray]] = []
    with tempfile.TemporaryDirectory(prefix="keras_mvit2_fingerprint_") as tmp:
        for name, (factory, kind) in _models().items():
            if args.models and not any(part in name for part in args.models):
                continue
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
                key = f"tflite/{name}/{fmt}"
                if _recorded(records, key, _tflite, model, path, quantization=fmt,
                             representative_data=rep, class_names=names,
                             allow_float_ops=True):
                    outputs[key] = np.concatenate(
                        [np.asarray(export.run_tflite(path, x[i:i + 1])).reshape(1, -1)
                         for i in range(len(x))])
            if kind == "detector":
                path = os.path.join(tmp, f"{name}_postprocess.tflite")
                _recorded(records, f"tflite/{name}/postprocess", _tflite,
                          with_detection_postprocess(model), path,
                          class_names=[f"object_{i}" for i in range(3)])
            if coreml:
                precisions = ["float16", "float32"] if name == "mobilevitv2_050_separable" \
                    else ["float16"]
                for precision in precisions:
                    path = os.path.join(tmp, f"{name}_{precision}.mlpackage")
                    labels = [f"class_{i}" for i in range(10)] if kind == "classifier" else None
                    _recorded(records, f"coreml/{name}/{precision}", _coreml, model, path,
                              quantization=precision, class_names=labels)
                if kind == "detector":
                    path = os.path.join(tmp, f"{name}_vision.mlpackage")
                    _recorded(records, f"coreml/{name}/vision", _vision, model, path,
                              [f"object_{i}" for i in range(3)])
            if kind == "classifier" and not args.no_twin:
                twins.append((name, model, x))
            print(f"{name}: done", flush=True)
        if twins:
            from keras_mvit2.quantize.twin_transfer import twin_outputs

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
            elif "error" in old or "error" in rec:
                same = old.get("error") == rec.get("error")
                verdict = "same error" if same else "ERROR DIFFERS"
                failed += not same
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
        digest = rec.get("sha256") or rec.get("output_sha256") or rec.get("error", "")
        rows.append(f"| {key} | {ops} | {digest[:12]} "
                    f"| {verdict} |")
    if base is not None and not args.models:
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
