"""Host benchmark harness: `mvit2 bench`, the attention sweep, the model table, bench-report.

Fast on purpose: tiny models and few runs. These tests check what the harness
records (and that it records the truth: file size, op histogram, MACs against the
Keras graph count, XNNPACK on/off, int8 inputs), never how fast anything is.
"""

import csv
import dataclasses
import io
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from model_utils import mobilevitv2_fused_macs

from keras_mvit2.cli.main import main
from keras_mvit2.export.tflite import inspect_tflite, to_tflite
from keras_mvit2.latency import BenchResult, LatencyStats, load_results, save_results
from keras_mvit2.latency.host import (
    bench_tflite,
    make_interpreter,
    op_profile,
    op_type_breakdown,
    peak_memory_mb,
    random_inputs,
)
from keras_mvit2.latency.report import compare, load_many
from keras_mvit2.profiling import profile

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _tiny_model(name: str = "tiny") -> keras.Model:
    inputs = keras.Input((16, 16, 3), name="image")
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(inputs)
    x = keras.layers.DepthwiseConv2D(3, padding="same")(x)
    x = keras.layers.Conv2D(12, 1)(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(5)(x)
    return keras.Model(inputs, outputs, name=name)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("bench_tiny")
    model = _tiny_model()
    path = os.path.join(folder, "tiny.tflite")
    to_tflite(model, path)
    keras_path = os.path.join(folder, "tiny.keras")
    model.save(keras_path)
    return {"model": model, "path": path, "keras_path": keras_path, "folder": folder}


def _int8_tflite(path: str, io_type) -> None:
    """A tiny full-integer model with `io_type` input/output, straight from the converter."""
    model = _tiny_model("tiny_int8")
    fn = tf.function(lambda x: model(x, training=False),
                     input_signature=[tf.TensorSpec((1, 16, 16, 3), tf.float32)])
    converter = tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()])
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    rng = np.random.default_rng(0)

    def representative():
        for _ in range(8):
            yield [rng.random((1, 16, 16, 3), dtype=np.float32)]

    converter.representative_dataset = representative
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = io_type
    converter.inference_output_type = io_type
    with open(path, "wb") as f:
        f.write(converter.convert())


def _record(name, fmt, precision, device, platform, runtime, threads, delegate, median):
    return BenchResult(
        model={"name": name, "format": fmt, "precision": precision, "size_bytes": 1},
        device={"name": device, "platform": platform},
        runtime={"name": runtime, "version": None, "threads": threads, "delegate": delegate,
                 "batch_size": 1},
        latency_ms=LatencyStats.from_samples([median * 0.9, median, median * 1.2], warmup=1),
    )


# ----------------------------------------------------------------------------------------
# Schema


def test_bench_result_json_round_trip(tmp_path):
    record = _record("m", "tflite", "int8", "Pixel 7", "android", "tflite", 4, "xnnpack", 3.0)
    record.op_histogram = {"CONV_2D": 3}
    record.extra = {"note": "x"}
    path = tmp_path / "r.json"
    save_results([record, record], path)
    loaded = load_results(path)
    assert [r.to_dict() for r in loaded] == [record.to_dict(), record.to_dict()]
    assert isinstance(loaded[0].latency_ms, LatencyStats)
    assert loaded[0].latency_ms.median == pytest.approx(3.0)


# ----------------------------------------------------------------------------------------
# mvit2 bench


def test_bench_tflite_cli_writes_valid_record(tiny, tmp_path):
    out = tmp_path / "tiny.json"
    rc = main(["bench", tiny["path"], "--runs", "7", "--warmup", "2", "--json", str(out)])
    assert rc == 0
    [result] = load_results(out)
    lat = result.latency_ms
    assert lat.runs == 7 and lat.warmup == 2
    assert 0 < lat.min <= lat.median <= lat.p90 <= lat.max
    assert result.model["size_bytes"] == os.path.getsize(tiny["path"])
    assert result.op_histogram == inspect_tflite(tiny["path"]).op_histogram
    # No Keras model next to a bare .tflite: MACs come from the flatbuffer and must
    # equal the Keras graph count of the model it was converted from.
    assert result.model["macs"] == profile(tiny["model"]).macs
    assert result.model["macs_source"] == "tflite"
    assert result.model["input_shape"] == [1, 16, 16, 3]
    assert result.model["precision"] == "float32"
    assert result.runtime["delegate"] == "xnnpack" and result.runtime["threads"] == 1
    assert result.device["platform"] == "host"
    assert result.peak_memory_mb is not None and result.peak_memory_mb > 0
    cpu = result.extra["cpu_ms"]
    assert cpu["runs"] == 7 and cpu["min"] <= cpu["median"] <= cpu["max"]


def test_bench_keras_file_converts_and_uses_keras_counts(tiny, tmp_path, capsys):
    out = tmp_path / "k.json"
    rc = main(["bench", tiny["keras_path"], "--runs", "3", "--warmup", "1", "--no-memory",
               "--json", str(out)])
    assert rc == 0
    assert "temporary float32 .tflite" in capsys.readouterr().err
    [result] = load_results(out)
    expected = profile(tiny["model"])
    assert result.model["params"] == expected.params
    assert result.model["macs"] == expected.macs == result.model["macs_tflite"]
    assert result.peak_memory_mb is None


def test_no_xnnpack_really_runs_without_the_delegate(tiny):
    with_delegate = make_interpreter(tiny["path"], xnnpack=True)._get_ops_details()
    without = make_interpreter(tiny["path"], xnnpack=False)._get_ops_details()
    assert any(op["op_name"] == "DELEGATE" for op in with_delegate)
    assert not any(op["op_name"] == "DELEGATE" for op in without)
    result = bench_tflite(tiny["path"], runs=3, warmup=1, xnnpack=False, measure_memory=False)
    assert result.runtime["delegate"] == "none"


@pytest.mark.slow
def test_bench_registered_name(tmp_path, capsys):
    """Also the MACs oracle: the count read from the converted MobileViTv2 flatbuffer
    (`macs_tflite`) equals the Keras graph count less what the 1x1 pair fusion saves."""
    out = tmp_path / "name.json"
    rc = main(["bench", "mobilevitv2_050", "--input-size", "64", "--runs", "3", "--warmup", "1",
               "--no-memory", "--json", str(out)])
    assert rc == 0
    assert "temporary float32 .tflite" in capsys.readouterr().err
    [result] = load_results(out)
    from keras_mvit2 import create_model
    from keras_mvit2.profiling import count_params, profile

    assert result.model["name"] == "mobilevitv2_050"
    assert result.model["input_shape"] == [1, 64, 64, 3]
    assert result.model["params"] == sum(count_params(create_model(
        "mobilevitv2_050", input_shape=(64, 64, 3))))
    assert result.model["macs_source"] == "keras"
    keras_profile = profile(create_model("mobilevitv2_050", input_shape=(64, 64, 3)))
    # The record carries the reference-convention MACs (comparable with the paper's tables);
    # the flatbuffer holds the executed graph: the Keras graph's executed MACs, less the
    # three 1x1 convolutions the export fuses into the next one (export.tflite.pointwise_fusion).
    assert result.model["macs"] == keras_profile.macs > 10_000_000
    fused = mobilevitv2_fused_macs(create_model("mobilevitv2_050", input_shape=(64, 64, 3)))
    assert fused > 0
    assert result.model["macs_tflite"] == keras_profile.executed_macs - fused
    assert result.latency_ms.min <= result.latency_ms.median <= result.latency_ms.max
    assert sum(result.op_histogram.values()) == result.extra["num_ops"] > 100


@pytest.mark.parametrize("io_type", [tf.int8, tf.uint8])
def test_bench_int8_model_feeds_valid_quantized_inputs(tmp_path, io_type):
    path = str(tmp_path / f"tiny_{io_type.name}.tflite")
    _int8_tflite(path, io_type)
    interpreter = make_interpreter(path)
    [feed] = random_inputs(interpreter)
    assert feed.dtype == io_type.as_numpy_dtype and feed.shape == (1, 16, 16, 3)
    info = np.iinfo(feed.dtype)
    assert info.min <= feed.min() < feed.max() <= info.max
    assert len(np.unique(feed)) > 100          # spread over the range, not a constant
    result = bench_tflite(path, runs=5, warmup=1)
    assert result.model["input_dtype"] == io_type.name
    assert result.model["precision"] == "int8"
    assert result.model["macs"] == profile(_tiny_model()).macs
    assert result.latency_ms.min <= result.latency_ms.median <= result.latency_ms.max


def test_peak_memory_grows_with_the_weights(tiny, tmp_path):
    inputs = keras.Input((1024,))
    big = keras.Model(inputs, keras.layers.Dense(2048)(inputs))   # 8 MiB of float32 weights
    big_path = str(tmp_path / "big.tflite")
    to_tflite(big, big_path)
    small_mb, small_info = peak_memory_mb(tiny["path"])
    big_mb, _ = peak_memory_mb(big_path)
    assert "VmHWM" in small_info["method"] or "ru_maxrss" in small_info["method"]
    assert small_mb < 8
    assert big_mb - small_mb > 7.5            # at least the 8 MiB of weights are resident


def test_bench_mlpackage_needs_macos(tmp_path, capsys):
    from keras_mvit2.export.coreml import coreml_predictions_available

    if coreml_predictions_available():
        pytest.skip("on macOS the .mlpackage path really runs Core ML")
    rc = main(["bench", str(tmp_path / "model.mlpackage"), "--runs", "2"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "needs macOS" in err and "model.mlpackage" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "no_such_model"], "neither a model file"),
        (["bench", "missing.tflite"], "not found"),
        (["bench", "m.tflite", "--input-size", "64"], "registered model names only"),
        (["bench", "mobilevitv2_050", "--runs", "0"], "runs must be"),
    ],
)
def test_bench_bad_input_gives_clear_error(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_op_profile_times_every_op(tiny):
    timings, info = op_profile(tiny["path"], runs=3, rounds=2)
    histogram = inspect_tflite(tiny["path"]).op_histogram
    assert len(timings) == sum(histogram.values())
    rows = op_type_breakdown(timings)
    assert {r["op"]: r["count"] for r in rows} == histogram
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    assert sum(t.macs for t in timings) == profile(tiny["model"]).macs
    assert all(t.ms >= 0 for t in timings) and info["model_ms"] > 0


# ----------------------------------------------------------------------------------------
# bench-report


def test_bench_report_merges_three_devices(tmp_path, capsys):
    host = [_record("mobilevitv2_050", "tflite", "float32", "vm", "host", "litert", 1,
                    "xnnpack", 12.0),
            _record("mobilevitv2_050", "tflite", "int8", "vm", "host", "litert", 1,
                    "xnnpack", 10.0)]
    android = [_record("mobilevitv2_050", "tflite", "float32", "Pixel 7", "android",
                       "benchmark_model", 4, "gpu", 5.0),
               _record("mobilevitv2_050", "tflite", "float32", "Pixel 7", "android",
                       "benchmark_model", 4, "gpu", 7.0)]      # a repeat: median of the two
    ios = [_record("mobilevitv2_050", "mlpackage", None, "iPhone 12", "ios", "coreml", None,
                   "cpu_and_ne", 1.6)]
    files = []
    for name, records in (("host", host), ("android", android), ("ios", ios)):
        path = tmp_path / f"{name}.json"
        save_results(records, path)
        files.append(str(path))
    md, csv_path, js = tmp_path / "t.md", tmp_path / "t.csv", tmp_path / "t.json"
    rc = main(["bench-report", *files, "--markdown", str(md), "--csv", str(csv_path),
               "--json", str(js)])
    assert rc == 0

    table = compare(load_many(files))
    host_col = "vm (host) · litert · 1 thr · xnnpack"
    android_col = "Pixel 7 (android) · benchmark_model · 4 thr · gpu"
    ios_col = "iPhone 12 (ios) · coreml · - thr · cpu_and_ne"
    assert table.columns == [host_col, android_col, ios_col]
    fp32, int8 = "mobilevitv2_050 [tflite/float32]", "mobilevitv2_050 [tflite/int8]"
    ml = "mobilevitv2_050 [mlpackage]"
    assert table.rows == [fp32, int8, ml]
    assert table.cell(fp32, host_col) == pytest.approx(12.0)
    assert table.cell(int8, host_col) == pytest.approx(10.0)
    assert table.cell(fp32, android_col) == pytest.approx(6.0)
    assert table.counts[(fp32, android_col)] == 2
    assert table.cell(ml, ios_col) == pytest.approx(1.6)
    assert table.cell(int8, android_col) is None and table.cell(ml, host_col) is None

    rows = list(csv.reader(io.StringIO(csv_path.read_text())))
    assert rows[0] == ["model", host_col, android_col, ios_col]
    assert rows[1] == [fp32, "12", "6", ""]
    assert rows[3] == [ml, "", "", "1.6"]
    text = md.read_text()
    assert f"| {fp32} | 12.00 | 6.000 (n=2) | - |" in text
    data = json.loads(js.read_text())
    assert data["rows"][0]["median_ms"] == {host_col: 12.0, android_col: 6.0}
    assert "iPhone 12" in capsys.readouterr().out


def test_bench_report_rejects_foreign_json(tmp_path, capsys):
    path = tmp_path / "other.json"
    path.write_text(json.dumps([{"schema": "something/else"}]))
    assert main(["bench-report", str(path)]) == 2
    assert "other.json" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------
# bench-attention


def test_attention_sweep_tiny_every_mechanism(tmp_path):
    from keras_mvit2.latency.attention_sweep import run_attention_sweep, write_sweep
    from keras_mvit2.layers import attention_registry

    sweep = run_attention_sweep(tokens=(16, 32), dim=32, runs=3, warmup=1, rounds=1,
                                profile_tokens=(16,), profile_runs=2)
    mechanisms = attention_registry.available()
    assert sorted(sweep.mechanisms) == mechanisms and sweep.mechanisms[0] == "separable"
    assert len(sweep.results) == 2 * len(mechanisms)
    for r in sweep.results:
        assert r.extra["tokens"] in (16, 32) and r.extra["dim"] == 32
        assert r.model["input_shape"] == [1, r.extra["tokens"], 32]
        assert r.latency_ms.runs == 3 and r.model["macs"] > 0
        assert r.op_histogram and "cpu_ms" in r.extra
    mha = next(r for r in sweep.results if r.extra["mechanism"] == "mha")
    assert mha.extra["layer_kwargs"] == {"num_heads": 8}
    assert mha.op_histogram.get("BATCH_MATMUL", 0) >= 2
    sep = next(r for r in sweep.results if r.extra["mechanism"] == "separable")
    # Separable: one (1, N, 1)^T x (1, N, d) product, the score-weighted sum over tokens.
    assert sep.op_histogram.get("BATCH_MATMUL") == 1
    assert set(sweep.op_breakdown[16]) == set(mechanisms)
    assert sweep.bars("cpu") == {}                     # k=1024/2048 not measured

    paths = write_sweep(sweep, tmp_path / "out")
    with open(paths["png"], "rb") as f:
        assert f.read(8) == PNG_MAGIC
    assert len(load_results(paths["json"])) == len(sweep.results)
    text = open(paths["markdown"]).read()
    assert "| 16 |" in text and "| 32 |" in text and "Top-5 operations" in text
    summary = json.load(open(paths["summary"]))
    assert set(summary["median_ms"]["cpu"]) == set(mechanisms)


def test_attention_sweep_bars_arithmetic():
    from keras_mvit2.latency.attention_sweep import AttentionSweep

    def rec(m, k, ms):
        r = _record(f"attention/{m}", "tflite", "float32", "vm", "host", "litert", 1,
                    "xnnpack", ms)
        r.extra = {"mechanism": m, "tokens": k}
        return r

    sweep = AttentionSweep(dim=512, tokens=[1024, 2048], mechanisms=["separable", "mha"],
                           layer_kwargs={}, op_breakdown={}, op_profile_info={},
                           results=[rec("separable", 1024, 10.0), rec("separable", 2048, 23.0),
                                    rec("mha", 1024, 31.0), rec("mha", 2048, 100.0)])
    bars = sweep.bars()
    assert bars["mha_over_separable_k1024"]["value"] == pytest.approx(3.1)
    assert bars["mha_over_separable_k1024"]["passed"]
    assert bars["mha_over_separable_k2048"]["value"] == pytest.approx(100 / 23)
    assert not bars["mha_over_separable_k2048"]["passed"]
    assert bars["separable_k2048_over_k1024"]["value"] == pytest.approx(2.3)
    assert not bars["separable_k2048_over_k1024"]["passed"]


# ----------------------------------------------------------------------------------------
# bench-models


def test_models_table_small(tmp_path):
    from keras_mvit2.latency.models_table import (
        int8_available,
        load_models_table,
        run_models_table,
        write_models_table,
    )

    precisions = ("float32", "int8") if int8_available()[0] else ("float32",)
    table = run_models_table(["mobilenetv2", "no_such_model"], precisions=precisions,
                             input_size=32, runs=3, warmup=1, rounds=1, measure_memory=False)
    assert [s["model"] for s in table.skipped] == ["no_such_model"]
    assert {r.model["precision"] for r in table.results} == set(precisions)
    fp32 = table.find("mobilenetv2", "float32")
    assert fp32.model["input_shape"] == [1, 32, 32, 3]
    assert fp32.model["params"] > 3_000_000 and fp32.model["macs"] > 0
    assert fp32.extra["weights"] == "random"
    if "int8" in precisions:
        int8 = table.find("mobilenetv2", "int8")
        assert int8.model["input_dtype"] == "int8"
        assert int8.model["size_bytes"] < 0.5 * fp32.model["size_bytes"]
    paths = write_models_table(table, tmp_path)
    with open(paths["png"], "rb") as f:
        assert f.read(8) == PNG_MAGIC
    again = load_models_table(paths["json"])
    assert [dataclasses.asdict(r.latency_ms) for r in again.results] == [
        dataclasses.asdict(r.latency_ms) for r in table.results]
    assert "| mobilenetv2 | 32x32 |" in open(paths["markdown"]).read()


def test_report_marks_records_without_a_median():
    """Older Android benchmark_model builds print no median: the mean is shown, marked."""
    from keras_mvit2.latency import BenchResult, LatencyStats
    from keras_mvit2.latency.report import compare

    record = BenchResult(
        model={"name": "m", "format": "tflite", "precision": "float32"},
        device={"name": "Pixel 7", "platform": "android"},
        runtime={"name": "benchmark_model", "threads": 4, "delegate": "xnnpack"},
        latency_ms=LatencyStats(runs=50, warmup=5, min=3.0, median=None, p90=None,
                                max=5.0, mean=4.0),
    )
    table = compare([record])
    (row,), (column,) = table.rows, table.columns
    assert table.cell(row, column) == 4.0
    assert table.cell_text(row, column) == "4.000*"
    assert "* mean latency" in table.to_markdown()


def test_cpu_features_reads_the_model_and_the_kernel_flags(tmp_path):
    from keras_mvit2.latency.host_info import cpu_features

    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
                   "flags\t\t: fpu sse4_2 avx2 avx512f avx512_vnni amx_tile amx_int8 ht\n"
                   "processor\t: 1\nmodel name\t: ignored\nflags\t\t: fpu\n")
    got = cpu_features(str(x86))
    assert got["model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert got["flags"] == ["sse4_2", "avx2", "avx512f", "avx512_vnni", "amx_tile", "amx_int8"]
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd asimddp i8mm\nCPU part\t: 0xd41\n")
    assert cpu_features(str(arm))["flags"] == ["asimd", "asimddp", "i8mm"]
