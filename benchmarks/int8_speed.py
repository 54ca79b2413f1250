"""Is full int8 faster than float32? Every attention, per op, with the gate that says so.

    python benchmarks/int8_speed.py [--attentions separable mha linformer rfa mobile_attention]
        [--sizes 64 256] [--threads 1 2] [--runs 60] [--rounds 6] [--no-profile]
        [--no-variants] [--out benchmarks/results]

A phone runs a full-int8 file only because it is faster than float. For MobileViTV2-0.5 with
each attention of the papers (the registry's default arguments, random weights: latency does
not depend on them; int8 calibrated on 32 Fashion-MNIST training images), at each size:

1. **The gate.** The float32 file and the full-int8 file (`to_tflite`'s defaults, int8 I/O;
   ``allow_float_ops=True`` for the attentions that declare float ops, `int8_float_ops`: RFA's
   SIN / COS, MHA's and Linformer's SOFTMAX in float inside XNNPACK) timed interleaved in
   one run per thread count (`measure_interleaved`; 1 thread: the calling thread's CPU time,
   2 threads: wall clock), medians with distribution-free 95 % intervals. Every int8 file
   that is not faster than its float32 file is named in a banner and the script exits with
   status 1, so a change that slows int8 down is caught in the round it lands. ms per GMAC
   of the separable model beside MobileNetV2-0.5's (`keras.applications`, the same two
   conversions) at the largest size.
2. **Where the time goes** (`--no-profile` skips it): at the largest size, 1 thread, each
   op of the int8 and the float32 file timed on its own
   (`keras_mvit2.latency.op_timing.op_profile`), summed per op kind, with the ops XNNPACK
   leaves to LiteRT's own kernels.
3. **The measured reasons** (`--no-variants` skips them): the default int8 file against the
   forms and rewrites it does not use, timed interleaved with it:
   the GroupNorm's `x . x` in XNNPACK (its operand at zero point 0; a timing-only rewrite of
   the default file: the values are not the model's), every RSQRT a table (also the tiny
   ones), the file without the post-quantization rewrites (`fast_int8_kernels` off: RSQRT in
   LiteRT's kernel, constant matmul operands asymmetric), RFA's random features as 256-entry
   tables (`lookup_tables`, ``islands``), Mobile-Attention's flow epsilon added, the
   products as written, and MHA's and Linformer's integer-only files (LiteRT's int8 SOFTMAX),
   at each thread count; and single ops of the attentions' shapes in each form (an int8
   BATCH_MATMUL in XNNPACK and in LiteRT's kernel, a DIV and its products by rsqrt, RSQRT
   and its table).

Writes ``int8_speed.json`` and ``int8_speed.md`` (with the CPU model and the flags that
decide XNNPACK's kernels). Exit status 1 when the gate fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from attention_table import calibration_images, median_interval  # noqa: E402

MODEL = "mobilevitv2_050"
ATTENTIONS = ("separable", "mha", "linformer", "rfa", "mobile_attention")
PRECISIONS = ("float32", "int8")
CONTROL = "mobilenetv2_050"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--attentions", nargs="+", default=list(ATTENTIONS))
    p.add_argument("--sizes", nargs="+", type=int, default=[64, 256])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--runs", type=int, default=60, help="timed invokes per file and thread count")
    p.add_argument("--rounds", type=int, default=6, help="interleaving rounds")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--no-profile", dest="profile", action="store_false")
    p.add_argument("--no-variants", dest="variants", action="store_false")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    return p.parse_args(argv)


# --------------------------------------------------------------------------------------
# Files


def build_model(name: str, size: int):
    """MobileViTV2-0.5 with attention `name` (or the MobileNetV2-0.5 control), random
    weights (seed 0), 10 classes."""
    import keras

    keras.utils.set_random_seed(0)
    if name == CONTROL:
        return keras.applications.MobileNetV2(alpha=0.5, weights=None, classes=10,
                                              input_shape=(size, size, 3))
    from keras_mvit2.models import create_model

    return create_model(MODEL, input_shape=(size, size, 3), classes=10, attention=name,
                        classifier_activation="softmax")


def declared_float_ops(name: str) -> bool:
    """Whether the attention `name` declares float ops in full int8 (`int8_float_ops`): its
    int8 file is converted with ``allow_float_ops=True`` (RFA's SIN / COS, the softmax
    attentions' SOFTMAX islands), every other file integer-only."""
    from keras_mvit2.layers import attention_registry

    return name != CONTROL and bool(attention_registry.int8_float_ops(name))


def convert(model, path: str, precision: str, images: np.ndarray, **options) -> dict[str, Any]:
    """float32, or full int8 with int8 I/O calibrated on `images` (`options`: `to_tflite`'s,
    with `allow_float_ops` as `declared_float_ops` says); what the file holds."""
    from keras_mvit2.export import to_tflite

    if precision == "float32":
        report = to_tflite(model, path, **options)
    else:
        report = to_tflite(model, path, quantization=options.pop("quantization", "int8"),
                           representative_data=images, num_calibration_samples=len(images),
                           io_dtype="int8", **options)
    return {"float_ops": dict(report.float_ops), "num_ops": int(report.num_ops),
            "xnnpack_partitions": report.num_xnnpack_partitions,
            "ops_outside_xnnpack": dict(report.ops_outside_xnnpack or {})}


def timed(paths: dict[Any, str], threads: Sequence[int], args: argparse.Namespace
          ) -> dict[tuple[Any, int], dict[str, Any]]:
    """Every file at every thread count, interleaved: `{(key, threads): {median, low, high,
    clock}}` (ms; 1 thread: the calling thread's CPU time, more: wall clock)."""
    from keras_mvit2.latency.litert_timing import make_interpreter, measure_interleaved

    interpreters = {(key, n): make_interpreter(path, threads=n)
                    for key, path in paths.items() for n in threads}
    samples = measure_interleaved(interpreters, runs=args.runs, warmup=args.warmup,
                                  rounds=args.rounds)
    out = {}
    for (key, n), s in samples.items():
        clock, values = ("cpu", s.cpu_ms) if n == 1 else ("wall", s.wall_ms)
        low, high = median_interval(values)
        out[(key, n)] = {"median": float(np.median(values)), "low": low, "high": high,
                         "clock": clock}
    return out


# --------------------------------------------------------------------------------------
# 1. The gate


def gate(args: argparse.Namespace, folder: str, images: dict[int, np.ndarray]
         ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The float32 and int8 rows of every attention (and the control at the largest size)."""
    from keras_mvit2.profiling import profile

    paths: dict[tuple[str, int, str], str] = {}
    files: dict[tuple[str, int, str], dict[str, Any]] = {}
    macs: dict[tuple[str, int], int] = {}
    largest = max(args.sizes)
    jobs = [(name, size) for name in args.attentions for size in args.sizes]
    jobs += [(CONTROL, largest)]
    for name, size in jobs:
        model = build_model(name, size)
        macs[(name, size)] = int(profile(model).macs)
        for precision in PRECISIONS:
            path = os.path.join(folder, f"{name}_{size}_{precision}.tflite")
            print(f"{name} @{size}: {precision} ...", flush=True)
            files[(name, size, precision)] = convert(
                model, path, precision, images[size],
                **({"allow_float_ops": declared_float_ops(name)} if precision == "int8" else {}))
            paths[(name, size, precision)] = path
    times = timed(paths, args.threads, args)
    rows = []
    for name, size in jobs:
        for n in args.threads:
            fp32, int8 = times[((name, size, "float32"), n)], times[((name, size, "int8"), n)]
            ratio = int8["median"] / fp32["median"]
            rows.append({
                "model": name, "size": size, "threads": n, "float32": fp32, "int8": int8,
                "ratio": ratio, "faster": bool(int8["high"] is not None and fp32["low"]
                                               is not None and int8["high"] < fp32["low"]),
                "slower": ratio >= 1.0, "gmacs": macs[(name, size)] / 1e9,
                "int8_file": files[(name, size, "int8")],
                "float32_file": files[(name, size, "float32")]})
    per_gmac = {}
    for n in args.threads:
        for name in ("separable", CONTROL):
            row = next((r for r in rows if r["model"] == name and r["size"] == largest
                        and r["threads"] == n), None)
            if row is not None:
                per_gmac[f"{name} {n}"] = {p: row[p]["median"] / row["gmacs"]
                                           for p in PRECISIONS}
    return rows, {"paths": paths, "ms_per_gmac": per_gmac}


# --------------------------------------------------------------------------------------
# 2. Where the time goes


def op_kinds(path: str) -> dict[str, Any]:
    """Per op kind of the file (each op timed on its own, 1 thread): count, ms, share."""
    from keras_mvit2.latency.op_timing import op_profile, op_type_breakdown

    timings, info = op_profile(path, threads=1, runs=10, rounds=3)
    return {"kinds": [{k: g[k] for k in ("op", "count", "ms", "share")}
                      for g in op_type_breakdown(timings)],
            "sum_ms": info["sum_ms"], "model_ms": info["model_ms"], "method": info["method"]}


# --------------------------------------------------------------------------------------
# 3. The measured reasons


def _gn_products_in_xnnpack(source: str, path: str) -> None:
    """Timing only: the default file with each x . x operand at zero point 0 (XNNPACK then
    takes the product; the values are no longer the model's)."""
    with open(source, "rb") as f:
        content = _with_second_operand_zero_point(f.read(), 0, squares_only=True)
    with open(path, "wb") as f:
        f.write(content)


def _tables(**options) -> Callable[[str, str], None]:
    """The default file with `tabulate_elementwise(**options)` applied again."""
    def rewrite(source: str, path: str) -> None:
        from keras_mvit2.export.tflite.flatbuffer import parse_flatbuffer, serialize_flatbuffer
        from keras_mvit2.export.tflite.lookup_tables import tabulate_elementwise

        model = parse_flatbuffer(source)
        tabulate_elementwise(model, **options)
        with open(path, "wb") as f:
            f.write(serialize_flatbuffer(model, size_hint=os.path.getsize(source) + 1024))
    return rewrite


def variants(args: argparse.Namespace, folder: str, images: dict[int, np.ndarray],
             defaults: dict[tuple[str, int, str], str]) -> list[dict[str, Any]]:
    """Each alternative beside the default int8 file of the same model and size, 1 thread."""
    from keras_mvit2.export.tflite.quantization import TFLITE_QUANTIZATIONS
    from keras_mvit2.layers.export_forms import INT8

    no_rewrites = dataclasses.replace(TFLITE_QUANTIZATIONS["int8"], fast_int8_kernels=False)
    large, small = max(args.sizes), min(args.sizes)
    plans: list[tuple[str, str, int, str, Callable[[str, str], None] | dict[str, Any]]] = [
        ("separable", "gn_products_in_xnnpack", large,
         "the GroupNorm's x . x in XNNPACK (operand at zero point 0; timing only)",
         _gn_products_in_xnnpack),
        ("separable", "every_rsqrt_a_table", small,
         "every RSQRT a table (also the GroupNorms' one value per sample)",
         _tables(min_elements=1)),
        ("mobile_attention", "no_rewrites", large,
         "no post-quantization rewrites (RSQRT in LiteRT's kernel)",
         {"quantization": no_rewrites}),
        ("rfa", "features_as_tables", large,
         "RFA's SIN / COS island as 256-entry tables (GATHER)", _tables(islands=True)),
        ("rfa", "no_rewrites", large,
         "no post-quantization rewrites (constant matmul operands asymmetric, RSQRT / SQRT "
         "in LiteRT's kernels)", {"quantization": no_rewrites}),
    ]
    for size in sorted({small, large}):
        plans.append(("mobile_attention", "flow_epsilon_added", size,
                      "Mobile-Attention's flow epsilon added",
                      {"forms": dataclasses.replace(INT8, flow_epsilon="add")}))
    for name in ("linformer", "rfa", "mha"):
        plans.append((name, "products_as_written", small, "the products as written",
                      {"forms": dataclasses.replace(INT8, products="as_written")}))
    for name in ("mha", "linformer"):
        for size in sorted({small, large}):
            plans.append((name, "integer_only", size,
                          "integer-only (no allow_float_ops): LiteRT's int8 SOFTMAX",
                          {"allow_float_ops": False}))
    paths: dict[Any, str] = {}
    made = []
    for name, key, size, what, how in plans:
        default = defaults.get((name, size, "int8"))
        if name not in args.attentions or default is None:
            continue
        path = os.path.join(folder, f"{name}_{size}_{key}.tflite")
        print(f"variant {name} @{size}: {key} ...", flush=True)
        if callable(how):
            how(default, path)
            facts = None
        else:
            facts = convert(build_model(name, size), path, "int8", images[size],
                            **{"allow_float_ops": declared_float_ops(name), **how})
        paths[(name, size, key)] = path
        paths[(name, size, "default")] = default
        made.append((name, size, key, what, facts))
    times = timed(paths, args.threads, args)
    return [{"model": name, "size": size, "variant": key, "what": what, "file": facts,
             "threads": n, "variant_ms": times[((name, size, key), n)],
             "default_ms": times[((name, size, "default"), n)],
             "ratio": times[((name, size, key), n)]["median"]
             / times[((name, size, "default"), n)]["median"]}
            for name, size, key, what, facts in made for n in args.threads]


# --------------------------------------------------------------------------------------
# 4. The kernels


def _int8_graph(function, shapes: Sequence[tuple[int, ...]], ranges: Sequence[tuple[float, float]]
                ) -> bytes:
    """`function` of float inputs of `shapes` as a full-int8 flatbuffer (int8 I/O), calibrated
    on uniform samples of `ranges`."""
    import tensorflow as tf

    graph = tf.function(function, input_signature=[tf.TensorSpec(s, tf.float32) for s in shapes])
    rng = np.random.default_rng(0)

    def representative():
        for _ in range(8):
            yield [rng.uniform(lo, hi, s).astype(np.float32) for s, (lo, hi) in
                   zip(shapes, ranges, strict=True)]

    converter = tf.lite.TFLiteConverter.from_concrete_functions([graph.get_concrete_function()])
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = representative
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = converter.inference_output_type = tf.int8
    return converter.convert()


def _float_graph(function, shapes: Sequence[tuple[int, ...]]) -> bytes:
    import tensorflow as tf

    graph = tf.function(function, input_signature=[tf.TensorSpec(s, tf.float32) for s in shapes])
    return tf.lite.TFLiteConverter.from_concrete_functions(
        [graph.get_concrete_function()]).convert()


def _with_second_operand_zero_point(content: bytes, zero_point: int = 0,
                                    squares_only: bool = False) -> bytes:
    """Timing only: every BATCH_MATMUL's second operand (of a tensor times itself only, with
    `squares_only`), and the input of a TRANSPOSE feeding it, at `zero_point` (0: XNNPACK
    takes the product, as `activation_ranges.zero_offset_matmul_operands` gives a product of
    several rows; else LiteRT's kernel)."""
    from keras_mvit2.export.tflite.flatbuffer import (
        op_names,
        parse_flatbuffer,
        serialize_flatbuffer,
        tensor_indices,
    )

    model = parse_flatbuffer(content)
    kinds = op_names(model)
    graph = model.subgraphs[0]
    producer = {o: op for op in graph.operators for o in tensor_indices(op.outputs)}
    for op in graph.operators:
        ins = tensor_indices(op.inputs)
        if kinds[op.opcodeIndex] != "BATCH_MATMUL" or (squares_only and ins[0] != ins[1]):
            continue
        operand = [ins[1]]
        if ins[1] in producer and kinds[producer[ins[1]].opcodeIndex] == "TRANSPOSE":
            operand.append(tensor_indices(producer[ins[1]].inputs)[0])
        for i in operand:
            graph.tensors[i].quantization.zeroPoint = np.array([zero_point], np.int64)
    return serialize_flatbuffer(model, size_hint=len(content) + 1024)


def _tabulated(content: bytes) -> bytes:
    """The file as `to_tflite` writes it: RSQRT / SQRT tables (`int8_kernels`)."""
    from keras_mvit2.export.tflite.flatbuffer import parse_flatbuffer, serialize_flatbuffer
    from keras_mvit2.export.tflite.int8_kernels import for_fast_kernels

    model = parse_flatbuffer(content)
    for_fast_kernels(model)
    return serialize_flatbuffer(model, size_hint=len(content) + 1024)


def _association_cases() -> list[tuple[str, str, dict[str, bytes], int]]:
    """Linformer's weighted sum with its `F v` operand either way round, and a linear
    attention's `phi_q phi_k^T v` in either association (`functional.linformer_attention`,
    `functional.kernel_attention`), at the shapes of MobileViTV2-0.5's blocks."""
    import tensorflow as tf

    def weighted_sum(a, v):                      # the second operand (K, N)
        return tf.linalg.matmul(a, v)

    def weighted_sum_t(a, v_t):                  # the second operand (N, K): adjoint flag
        return tf.linalg.matmul(a, v_t, adjoint_b=True)

    def linear(pq, pk, v):                       # phi_q (phi_k^T v)
        return tf.linalg.matmul(pq, tf.linalg.matmul(pk, v, adjoint_a=True))

    def state_transposed(pq, pk, v):             # phi_q (v^T phi_k)^T
        return tf.linalg.matmul(pq, tf.linalg.matmul(v, pk, adjoint_a=True), adjoint_b=True)

    def token_first(pq, pk, v):                  # (phi_q phi_k^T) v
        return tf.linalg.matmul(tf.linalg.matmul(pq, pk, adjoint_b=True), v)

    cases = []
    weights, values = (4, 4, 16, 256), (4, 4, 256, 16)
    ranges = ((0, 1), (-1, 1))
    cases.append(("BATCH_MATMUL", "Linformer's weighted sum at 16 tokens, (16, 256) @ (256, 16)"
                  ", 16 batches x heads", {
                      "float32, second operand (K, N)": _float_graph(weighted_sum,
                                                                     (weights, values)),
                      "int8, second operand (K, N)": _with_second_operand_zero_point(
                          _int8_graph(weighted_sum, (weights, values), ranges)),
                      "int8, second operand (N, K), adjoint flag": _with_second_operand_zero_point(
                          _int8_graph(weighted_sum_t, (weights, (4, 4, 16, 256)), ranges))},
                  int(np.prod(weights)) * values[-1]))
    for tokens, channels, forms in ((16, 16, (linear, token_first)),
                                    (4, 24, (linear, token_first)),
                                    (256, 16, (linear, state_transposed))):
        shapes = ((4, 4, tokens, 128), (4, 4, tokens, 128), (4, 4, tokens, channels))
        ranges = ((-0.1, 0.1), (-0.1, 0.1), (-1, 1))
        names = {linear: "phi_q (phi_k^T v)", token_first: "(phi_q phi_k^T) v",
                 state_transposed: "phi_q (v^T phi_k)^T"}
        files = {}
        for form in forms:
            files[f"float32, {names[form]}"] = _float_graph(form, shapes)
            files[f"int8, {names[form]}"] = _with_second_operand_zero_point(
                _int8_graph(form, shapes, ranges))
        cases.append(("products of three", f"phi_q phi_k^T v, {tokens} tokens, 128 features, "
                      f"{channels} channels, 16 batches x heads (MACs: the linear form's)", files,
                      16 * 2 * tokens * 128 * channels))
    return cases


def kernels(args: argparse.Namespace, folder: str) -> list[dict[str, Any]]:
    """Single ops of the attentions' shapes, each form timed interleaved, 1 thread."""
    import tensorflow as tf

    from keras_mvit2.layers.functional import divide_positive

    cases: list[tuple[str, str, dict[str, bytes], int]] = []

    def matmul(a, b):
        return tf.linalg.matmul(a, b)

    for what, a, b in (
            ("an attention's q k^T, 256 tokens, 16 batches x heads", (4, 4, 256, 16),
             (4, 4, 16, 256)),
            ("one row times a matrix (one token's scores)", (4, 4, 1, 32), (4, 4, 32, 256)),
            ("the GroupNorm's x . x, 65,536 values", (1, 1, 65536), (1, 65536, 1))):
        int8 = _int8_graph(matmul, (a, b), ((-1, 1), (-1, 1)))
        cases.append(("BATCH_MATMUL", what, {
            "float32 (XNNPACK)": _float_graph(matmul, (a, b)),
            "int8, second operand at zero point 0 (XNNPACK)":
                _with_second_operand_zero_point(int8, 0),
            "int8, second operand at zero point 3 (LiteRT's kernel)":
                _with_second_operand_zero_point(int8, 3)},
            int(np.prod(a[:-1])) * a[-1] * b[-1]))
    cases += _association_cases()
    values, divisor = (4, 4, 256, 16), (4, 4, 256, 1)

    def divide(v, d):  # by 1 + |d| >= 1: any int8 input is a valid divisor
        return v / (1.0 + tf.abs(d))

    def products(v, d):
        return divide_positive(v, 1.0 + tf.abs(d))

    cases.append(("DIV", "a (4, 4, 256, 16) tensor by a positive (4, 4, 256, 1) one", {
        "float32 division (XNNPACK)": _float_graph(divide, (values, divisor)),
        "int8 DIV (LiteRT's kernel)": _int8_graph(divide, (values, divisor),
                                                  ((-1, 1), (-3, 3))),
        "int8 products by rsqrt (divide_positive; its RSQRT a table)": _tabulated(_int8_graph(
            products, (values, divisor), ((-1, 1), (-3, 3))))},
        int(np.prod(values))))
    shape = (4, 4, 256, 16)
    rsqrt = _int8_graph(tf.math.rsqrt, (shape,), ((0.25, 4),))
    cases.append(("RSQRT", "a (4, 4, 256, 16) tensor", {
        "float32 (XNNPACK)": _float_graph(tf.math.rsqrt, (shape,)),
        "int8 RSQRT (LiteRT's kernel)": rsqrt,
        "int8 table (CAST, ADD, GATHER)": _tabulated(rsqrt)}, int(np.prod(shape))))
    paths = {}
    for i, (_, _, forms, _) in enumerate(cases):
        for form, content in forms.items():
            path = os.path.join(folder, f"kernel_{i}_{len(paths)}.tflite")
            with open(path, "wb") as f:
                f.write(content)
            paths[(i, form)] = path
    print(f"timing {len(paths)} single-op files ...", flush=True)
    times = timed(paths, [1], args)
    return [{"op": op, "what": what, "form": form, "elements_or_macs": size,
             "ms": times[((i, form), 1)]}
            for i, (op, what, forms, size) in enumerate(cases) for form in forms]


# --------------------------------------------------------------------------------------
# Report


def _ms(t: dict[str, Any], digits: int = 2) -> str:
    low, high = t["low"], t["high"]
    band = (f" ({low:.{digits}f}-{high:.{digits}f})" if low is not None and high is not None
            else "")
    return f"{t['median']:.{digits}f}{band}"


def verdict(result: dict[str, Any]) -> str:
    """The gate's sentence: every row faster, or the rows that are not."""
    failing = [r for r in result["gate"] if r["slower"]]
    if not failing:
        return "**Gate: int8 is faster than float32 in every row.**"
    text = ("**GATE FAILED: int8 is not faster than float32 in "
            + ", ".join(f"{r['model']} @{r['size']} {r['threads']} thread(s)" for r in failing)
            + ".**")
    control = [r for r in failing if r["model"] == CONTROL]
    if control:
        text += (f" The control ({CONTROL}, no attention) is not faster in int8 either (at "
                 + ", ".join(f"{r['size']}x{r['size']} {r['threads']} thread(s): "
                             f"{r['ratio']:.2f}x" for r in control)
                 + "): on this CPU XNNPACK's int8 kernels are slower than its float32 ones "
                 "for a plain convolutional network.")
    return text


def gate_table(result: dict[str, Any], models: Sequence[str] | None = None) -> list[str]:
    """The gate's rows (of `models` only where given)."""
    lines = ["| model | size | threads | float32 ms | int8 ms | int8 / float32 | "
             "XNNPACK partitions (int8) | ops outside XNNPACK (int8) |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in result["gate"]:
        if models is not None and r["model"] not in models:
            continue
        f = r["int8_file"]
        outside = ", ".join(f"{k} {v}" for k, v in sorted(f["ops_outside_xnnpack"].items()))
        lines.append(f"| {r['model']} | {r['size']} | {r['threads']} | {_ms(r['float32'])} | "
                     f"{_ms(r['int8'])} | {r['ratio']:.2f}{'' if not r['slower'] else ' **!**'}"
                     f" | {f['xnnpack_partitions']} | {outside or '-'} |")
    return lines


def gmac_table(result: dict[str, Any]) -> list[str]:
    return ["| model, threads | float32 | int8 |", "|---|---:|---:|"] + [
        f"| {k} | {v['float32']:.2f} | {v['int8']:.2f} |"
        for k, v in result["ms_per_gmac"].items()]


def profile_table(result: dict[str, Any]) -> list[str]:
    lines = ["| model | file | sum / model ms | largest op kinds (ms) |", "|---|---|---:|---|"]
    for key, p in sorted(result["profile"].items()):
        name, precision = key.split()
        kinds = "; ".join(f"{k['op']} x{k['count']} {k['ms']:.2f}" for k in p["kinds"][:5])
        lines.append(f"| {name} | {precision} | {p['sum_ms']:.2f} / {p['model_ms']:.2f} | "
                     f"{kinds} |")
    return lines


def variants_table(result: dict[str, Any]) -> list[str]:
    return ["| model | size | threads | variant | ms | default ms | variant / default |",
            "|---|---:|---:|---|---:|---:|---:|"] + [
        f"| {v['model']} | {v['size']} | {v.get('threads', 1)} | {v['what']} | "
        f"{_ms(v['variant_ms'])} | {_ms(v['default_ms'])} | {v['ratio']:.2f} |"
        for v in result["variants"]]


def kernels_table(result: dict[str, Any]) -> list[str]:
    lines = ["| op | of | form | ms | ns per element (DIV, RSQRT) or per 1,000 MACs |",
             "|---|---|---|---:|---:|"]
    for k in result["kernels"]:
        per = 1e6 * k["ms"]["median"] / k["elements_or_macs"]
        per = per * 1000 if k["op"] in ("BATCH_MATMUL", "products of three") else per
        lines.append(f"| {k['op']} | {k['what']} | {k['form']} | {_ms(k['ms'], 3)} | "
                     f"{per:.2f} |")
    return lines


def host_line(result: dict[str, Any]) -> str:
    cpu = result["cpu"]
    return (f"{cpu['model']} ({result['cores']} cores; flags that decide XNNPACK's kernels: "
            f"{', '.join(cpu['flags']) or 'none'}), LiteRT {result['litert']}, XNNPACK")


def markdown(result: dict[str, Any]) -> str:
    lines = ["# Full int8 against float32, every attention", "",
             f"`python benchmarks/int8_speed.py` on {host_line(result)}. MobileViTV2-0.5 with "
             "each attention (random weights), float32 and full int8 (int8 I/O) interleaved; "
             "median ms (95 % interval); 1 thread: thread CPU time, 2 threads: wall clock.", "",
             verdict(result), "", *gate_table(result)]
    if result["ms_per_gmac"]:
        lines += ["", "ms per GMAC at the largest size:", "", *gmac_table(result)]
    if result.get("profile"):
        lines += ["", f"Where the time goes at {result['profile_size']}x{result['profile_size']}, "
                  "1 thread (each op timed on its own; ms summed per op kind, the five "
                  "largest):", "", *profile_table(result)]
    if result.get("variants"):
        when = ("at each thread count" if "threads" in result["variants"][0] else "1 thread")
        lines += ["", "The forms and rewrites the default int8 file does not use, against it "
                  f"({when}):", "", *variants_table(result)]
    if result.get("kernels"):
        lines += ["", "Single ops of the attentions' shapes, each form (1 thread):", "",
                  *kernels_table(result)]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from keras_mvit2.latency.host_info import _litert_version, _timestamp, cpu_features
    from keras_mvit2.utils.files import write_json, write_text

    images = {size: calibration_images(size) for size in sorted(set(args.sizes))}
    with tempfile.TemporaryDirectory(prefix="int8_speed_") as folder:
        rows, extra = gate(args, folder, images)
        result: dict[str, Any] = {
            "command": " ".join(["python benchmarks/int8_speed.py", *(argv or sys.argv[1:])]),
            "timestamp": _timestamp(), "cpu": cpu_features(), "cores": os.cpu_count(),
            "litert": _litert_version(), "runs": args.runs, "rounds": args.rounds,
            "gate": rows, "ms_per_gmac": extra["ms_per_gmac"],
            "profile_size": max(args.sizes)}
        if args.profile:
            result["profile"] = {
                f"{name} {precision}": op_kinds(
                    extra["paths"][(name, max(args.sizes), precision)])
                for name in args.attentions for precision in PRECISIONS}
        if args.variants:
            result["variants"] = variants(args, folder, images, extra["paths"])
            result["kernels"] = kernels(args, folder)
    text = markdown(result)
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "int8_speed.json"), result)
    write_text(os.path.join(args.out, "int8_speed.md"), text)
    print(text)
    failing = [r for r in rows if r["slower"]]
    if failing:
        banner = "!" * 78
        print(f"{banner}\nGATE FAILED: the int8 file is not faster than the float32 file of "
              f"the same model in {len(failing)} row(s):", file=sys.stderr)
        for r in failing:
            print(f"  {r['model']} @{r['size']}x{r['size']}, {r['threads']} thread(s): "
                  f"int8 {r['int8']['median']:.2f} ms, float32 {r['float32']['median']:.2f} "
                  f"ms ({r['ratio']:.2f}x)", file=sys.stderr)
        print(banner, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
