"""Android harness: the `benchmark_model` parser on the documented output format
(tests/data/benchmark_model, see its README) and the whole adb flow against a fake
`adb` executable on PATH that keeps a fake phone file system in a folder."""

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import keras
import pytest

from keras_mvit2.export.tflite import inspect_tflite, to_tflite
from keras_mvit2.latency import android, load_results
from keras_mvit2.latency.adb import device_info
from keras_mvit2.latency.android import (
    AndroidBenchConfig,
    AndroidBenchError,
    PartialRunError,
    parse_benchmark_output,
    parse_getprop,
    run_android_benchmarks,
    to_bench_result,
)
from keras_mvit2.latency.android_driver import DEFAULT_REMOTE_DIR

DATA = Path(__file__).parent / "data" / "benchmark_model"
REMOTE = DEFAULT_REMOTE_DIR


def sample(name: str) -> str:
    return (DATA / name).read_text()


# ----------------------------------------------------------------------------- parser


def test_parse_current_tool_with_percentiles_and_peak_memory():
    out = parse_benchmark_output(sample("tflite_xnnpack_threads4.txt"))
    assert out.completed
    assert out.params["Num threads"] == "4"
    assert out.params["Graph"] == f"{REMOTE}/m0_mobilevitv2_050.tflite"
    assert (out.init_us, out.first_inference_us) == (187654, 41441)
    assert (out.warmup_avg_us, out.inference_avg_us) == (27057, 23175)
    w, r = out.warmup, out.inference
    assert (w.count, w.first, w.min, w.max, w.median) == (5, 41441, 23321, 41441, 23506)
    assert (r.count, r.first, r.curr, r.min, r.max) == (50, 23557, 23026, 22954, 23895)
    assert (r.avg, r.std, r.p5, r.median, r.p95) == (23175, 208, 22963, 23099, 23557)
    assert out.model_size_mb == 5.52125
    assert (out.init_footprint_mb, out.overall_footprint_mb) == (21.3047, 33.0859)
    assert out.peak_memory_mb == 61.7305
    assert out.delegates_applied == [
        {"delegate": "XNNPACK", "graph": "partial", "delegate_kernels": 10}
    ]
    assert out.replaced_nodes == [
        {"delegate": "TfLiteXNNPackDelegate", "replaced": 443, "total": 452, "partitions": 10}
    ]
    assert out.errors == []
    assert out.op_profile is None


def test_record_from_current_tool_output():
    out = parse_benchmark_output(sample("tflite_xnnpack_threads4.txt"))
    result = to_bench_result(
        out, model={"name": "m"}, device={"name": "d", "platform": "android"},
        runtime={"delegate": "xnnpack", "threads": 4}, timestamp="t",
    )
    lat = result.latency_ms
    assert (lat.runs, lat.warmup) == (50, 5)
    assert (lat.min, lat.median, lat.mean, lat.max) == pytest.approx(
        (22.954, 23.099, 23.175, 23.895)
    )
    assert lat.p90 is None  # benchmark_model does not compute it
    assert result.peak_memory_mb == 61.7305
    assert result.extra["p95_ms"] == pytest.approx(23.557)
    assert result.extra["p5_ms"] == pytest.approx(22.963)
    assert result.extra["std_ms"] == pytest.approx(0.208)
    assert result.extra["init_ms"] == pytest.approx(187.654)
    assert result.extra["first_inference_ms"] == pytest.approx(41.441)
    assert result.extra["unavailable_stats"] == ["p90"]


def test_parse_legacy_tool_without_percentiles_leaves_median_unset():
    out = parse_benchmark_output(sample("tflite_legacy_gpu.txt"))
    r = out.inference
    assert (r.count, r.min, r.max, r.avg, r.std) == (50, 13891, 14944, 14240.8, 226)
    assert r.median is None and r.p95 is None
    assert out.warmup.count == 5 and out.first_inference_us == 115373
    assert out.init_us == 1214380 and out.peak_memory_mb is None
    assert out.delegates_applied == [
        {"delegate": "GPU", "graph": "complete", "delegate_kernels": 1},
        {"delegate": "XNNPACK", "graph": "none", "delegate_kernels": 0},
    ]
    result = to_bench_result(out, model={}, device={}, runtime={})
    assert result.latency_ms.median is None  # never estimated from mean/min/max
    assert result.latency_ms.mean == pytest.approx(14.2408)
    assert result.extra["unavailable_stats"] == ["p90", "median"]


def test_parse_nnapi_partial_delegation():
    out = parse_benchmark_output(sample("tflite_nnapi_threads1.txt"))
    assert out.params["Num threads"] == "1"
    assert out.inference.median == 30412 and out.peak_memory_mb == 88.1055
    assert [d["delegate"] for d in out.delegates_applied] == ["NNAPI", "XNNPACK"]
    assert out.delegates_applied[0] == {
        "delegate": "NNAPI", "graph": "partial", "delegate_kernels": 4
    }


def test_parse_op_profiling_tables():
    out = parse_benchmark_output(sample("tflite_none_op_profiling.txt"))
    # One warm-up run: the tool prints only "count=1 curr=5104" (+ percentiles).
    assert (out.warmup.count, out.warmup.min, out.warmup.max, out.warmup.avg) == (
        1, 5104, 5104, 5104
    )
    assert out.inference.count == 20 and out.inference.median == 2490
    profile = out.op_profile
    assert profile.nodes_executed == 8
    assert [r["node_type"] for r in profile.by_node_type] == [
        "FULLY_CONNECTED", "MUL", "SUM", "RELU", "SPLIT_V", "SOFTMAX"
    ]
    fc = profile.by_node_type[0]
    assert (fc["count"], fc["avg_ms"], fc["avg_pct"], fc["times_called"]) == (2, 1.866, 77.46, 2)
    assert len(profile.run_order) == 8
    assert profile.run_order[1] == {
        "node_type": "SPLIT_V", "first": 0.061, "avg_ms": 0.038, "pct": 1.577,
        "cdf_pct": 50.228, "mem_kb": 0.0, "times_called": 1, "name": "[attn/split]:1",
    }
    assert profile.top_by_time[0]["name"] == "[attn/qkv_proj/MatMul]:0"
    assert profile.top_by_time[1]["name"] == "[attn/out_proj/MatMul]:7"
    assert profile.timings.count == 20 and profile.timings.avg == 2409
    assert out.init_profile.run_order[0]["node_type"] == "AllocateTensors"
    assert out.init_profile.run_order[0]["avg_ms"] == 1.356

    result = to_bench_result(out, model={}, device={}, runtime={})
    top = result.extra["op_profile"]["top_ops"]
    assert [t["node_type"] for t in top] == ["FULLY_CONNECTED", "MUL", "SUM", "RELU", "SPLIT_V"]
    assert top[0]["pct"] == 77.46
    assert result.extra["op_profile"]["profiled_run_mean_ms"] == pytest.approx(2.409)


def test_op_profiling_tables_with_tabs_lost_parse_the_same():
    text = sample("tflite_none_op_profiling.txt")
    spaced = parse_benchmark_output(text.replace("\t", "    ")).op_profile
    tabbed = parse_benchmark_output(text).op_profile
    assert spaced.by_node_type == tabbed.by_node_type
    assert spaced.run_order == tabbed.run_order


def test_parse_failed_run():
    out = parse_benchmark_output(sample("tflite_gpu_failed.txt"))
    assert not out.completed
    assert out.errors == ["Failed to apply GPU delegate.", "Benchmarking failed."]
    with pytest.raises(ValueError, match="Failed to apply GPU delegate"):
        to_bench_result(out, model={}, device={}, runtime={})


def test_parse_logcat_prefixes_crlf_scientific_and_all_same():
    lines = [
        "11-22 10:00:00.000  4242  4242 I tflite  : Running benchmark for at least 3 "
        "iterations and at least 0 seconds but terminate if exceeding 150 seconds.",
        "11-22 10:00:00.001  4242  4242 I tflite  : count=3 curr=7(all same)",
        "I tflite  : Running benchmark for at least 3 iterations and at least 0 seconds but "
        "terminate if exceeding 150 seconds.",
        "I tflite  : count=3 first=1200000 curr=1300000 min=1200000 max=1400000 "
        "avg=1.3e+06 std=81649",
        "I tflite  : Inference timings in us: Init: 5685, First inference: 7, "
        "Warmup (avg): 7, Inference (avg): 1.3e+06",
    ]
    out = parse_benchmark_output("\r\n".join(lines) + "\r\n")
    assert (out.warmup.count, out.warmup.min, out.warmup.max, out.warmup.std) == (3, 7, 7, 0)
    assert out.inference.avg == 1.3e6 and out.inference.max == 1400000
    assert out.inference_avg_us == 1.3e6 and out.init_us == 5685


def test_parse_oldest_average_timings_line_and_nan_warmup():
    text = (
        "Running benchmark for at least 0 iterations and at least 0 seconds but terminate "
        "if exceeding 150 seconds.\ncount=0\n"
        "Running benchmark for at least 50 iterations and at least 1 seconds but terminate "
        "if exceeding 150 seconds.\n"
        "count=50 first=79449 curr=81350 min=77385 max=88213 avg=79732 std=1929\n"
        "Average inference timings in us: Warmup: -nan, Init: 38467, Inference: 79760.9\n"
    )
    out = parse_benchmark_output(text)
    assert out.warmup.count == 0 and out.warmup_avg_us is None
    assert out.init_us == 38467 and out.inference_avg_us == 79760.9
    result = to_bench_result(out, model={}, device={}, runtime={})
    assert result.latency_ms.warmup == 0 and result.latency_ms.runs == 50


def test_unparseable_output_is_not_a_result():
    out = parse_benchmark_output("sh: ./benchmark_model: not executable: 64-bit ELF file\n")
    assert not out.completed
    with pytest.raises(ValueError, match="no timed runs"):
        to_bench_result(out, model={}, device={}, runtime={})


def test_benchmark_flags():
    flags = android.benchmark_flags("/x/m.tflite", delegate="gpu", threads=2, runs=30,
                                    warmup=3, op_profiling=True, extra_flags=["--gpu_backend=cl"])
    assert flags == [
        "--graph=/x/m.tflite", "--num_threads=2", "--warmup_runs=3", "--warmup_min_secs=0",
        "--num_runs=30", "--min_secs=0", "--use_gpu=true", "--use_xnnpack=true",
        "--report_peak_memory_footprint=true", "--enable_op_profiling=true",
        "--gpu_backend=cl",
    ]
    assert "--use_xnnpack=false" in android.benchmark_flags(
        "m", delegate="none", threads=1, runs=1, warmup=1, peak_memory=False
    )


# ----------------------------------------------------------------------------- fake adb

GETPROP = """\
[ro.build.id]: [AP2A.240905.003]
[ro.build.version.release]: [14]
[ro.build.version.sdk]: [34]
[ro.product.cpu.abi]: [arm64-v8a]
[ro.product.cpu.abilist]: [arm64-v8a,armeabi-v7a,armeabi]
[ro.product.device]: [panther]
[ro.product.manufacturer]: [Google]
[ro.product.model]: [Pixel 7]
[ro.soc.manufacturer]: [Google]
[ro.soc.model]: [GS201]
[ro.board.platform]: [gs201]
"""

FAKE_ADB = r'''
import json, os, shlex, shutil, sys

root = os.environ["FAKE_ADB_ROOT"]
data = os.environ["FAKE_ADB_DATA"]
args = sys.argv[1:]
with open(os.environ["FAKE_ADB_LOG"], "a") as f:
    f.write(json.dumps(args) + "\n")
if args[:1] == ["-s"]:
    args = args[2:]


def phone(path):
    return os.path.join(root, path.lstrip("/"))


if args[0] == "devices":
    print("List of devices attached")
    for entry in filter(None, os.environ.get("FAKE_ADB_DEVICES", "").split(";")):
        print(entry.replace(":", "\t"))
    print()
elif args[0] == "push":
    os.makedirs(os.path.dirname(phone(args[2])), exist_ok=True)
    shutil.copyfile(args[1], phone(args[2]))
    print(args[1] + ": 1 file pushed.")
elif args[0] == "pull":
    shutil.copyfile(phone(args[1]), args[2])
elif args[0] == "shell":
    line = " ".join(args[1:])
    words = shlex.split(line.split(";")[0])
    if line == "getprop":
        print(open(os.environ["FAKE_ADB_GETPROP"]).read(), end="")
    elif words[:2] == ["mkdir", "-p"]:
        os.makedirs(phone(words[2]), exist_ok=True)
    elif words[:2] == ["chmod", "+x"]:
        os.chmod(phone(words[2]), 0o755)
    elif words[:2] == ["rm", "-rf"]:
        shutil.rmtree(phone(words[2]), ignore_errors=True)
    elif words[0] == "cd" and words[2] == "&&":
        rest = words[3:]
        if rest[0] == "taskset":
            rest = rest[2:]
        binary, flags = rest[0], rest[1:rest.index(">")]
        log = rest[rest.index(">") + 1]
        if not os.access(phone(binary), os.X_OK):
            print("keras_mvit2_exit=126")
            sys.exit(0)
        options = dict(f[2:].split("=", 1) for f in flags)
        if not os.path.isfile(phone(options["graph"])):
            sys.exit("fake adb: the model was not pushed: " + options["graph"])
        if options.get("use_gpu") == "true":
            name = os.environ.get("FAKE_GPU_SAMPLE", "tflite_legacy_gpu.txt")
        elif options.get("use_nnapi") == "true":
            name = "tflite_nnapi_threads1.txt"
        elif options.get("enable_op_profiling") == "true":
            name = "tflite_none_op_profiling.txt"
        else:
            name = "tflite_xnnpack_threads4.txt"
        shutil.copyfile(os.path.join(data, name), phone(log))
        print("keras_mvit2_exit=%d" % (1 if "failed" in name else 0))
    else:
        sys.exit("fake adb: unexpected shell command: " + line)
else:
    sys.exit("fake adb: unexpected command: " + " ".join(args))
'''


def elf_header(machine: int) -> bytes:
    head = bytearray(64)
    head[:4] = b"\x7fELF"
    head[4], head[5], head[6] = 2, 1, 1  # 64-bit, little endian, version 1
    head[16:18] = (3).to_bytes(2, "little")  # ET_DYN
    head[18:20] = machine.to_bytes(2, "little")
    return bytes(head)


@pytest.fixture(scope="module")
def tiny_tflite(tmp_path_factory) -> Path:
    model = keras.Sequential(
        [keras.Input((16, 16, 3)), keras.layers.Conv2D(4, 3, activation="relu"),
         keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3, activation="softmax")],
        name="tiny",
    )
    path = tmp_path_factory.mktemp("models") / "tiny_float32.tflite"
    to_tflite(model, path)
    return path


class FakePhone:
    def __init__(self, tmp_path: Path, monkeypatch):
        self.root = tmp_path / "phone"
        self.root.mkdir()
        self.log = tmp_path / "adb_calls.jsonl"
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        adb = bin_dir / "adb"
        adb.write_text(f"#!{sys.executable}\n{FAKE_ADB}")
        adb.chmod(adb.stat().st_mode | stat.S_IEXEC)
        getprop = tmp_path / "getprop.txt"
        getprop.write_text(GETPROP)
        self.binary = tmp_path / "android_aarch64_benchmark_model"
        self.binary.write_bytes(elf_header(183) + b"\0" * 64)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("FAKE_ADB_ROOT", str(self.root))
        monkeypatch.setenv("FAKE_ADB_DATA", str(DATA))
        monkeypatch.setenv("FAKE_ADB_LOG", str(self.log))
        monkeypatch.setenv("FAKE_ADB_GETPROP", str(getprop))
        monkeypatch.setenv("FAKE_ADB_DEVICES", "FAKE0001:device")

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def shell_runs(self) -> list[list[str]]:
        return [c for c in self.calls()
                if len(c) > 3 and c[2] == "shell" and "--graph=" in c[3]]


@pytest.fixture
def phone(tmp_path, monkeypatch) -> FakePhone:
    return FakePhone(tmp_path, monkeypatch)


def test_whole_flow_through_the_command_line(phone, tiny_tflite, tmp_path, capsys):
    second = tmp_path / "second.tflite"
    shutil.copyfile(tiny_tflite, second)
    out_json = tmp_path / "results" / "pixel7.json"
    status = android.main([
        str(tiny_tflite), str(second), "--benchmark-model", str(phone.binary),
        "--delegate", "xnnpack", "gpu", "--threads", "4", "--runs", "50", "--warmup", "5",
        "--repeats", "2", "-o", str(out_json), "--tool-version", "nightly-test",
        "--raw-dir", str(tmp_path / "raw"),
    ])
    printed = capsys.readouterr()
    assert status == 0, printed.err
    results = load_results(out_json)
    assert [(r.model["name"], r.runtime["delegate"]) for r in results] == [
        ("tiny_float32", "xnnpack"), ("tiny_float32", "gpu"),
        ("second", "xnnpack"), ("second", "gpu"),
    ]
    histogram = inspect_tflite(tiny_tflite).op_histogram
    for r in results:
        assert r.device == {
            "name": "Pixel 7", "platform": "android", "machine": "arm64-v8a",
            "os": "Android 14 (API 34)", "cpu": "Google GS201", "manufacturer": "Google",
            "device": "panther", "build": "AP2A.240905.003",
        }
        assert r.runtime["threads"] == 4 and r.runtime["batch_size"] == 1
        assert r.runtime["version"] == "nightly-test"
        assert r.model["format"] == "tflite" and r.model["input_shape"] == [1, 16, 16, 3]
        assert r.model["size_bytes"] == tiny_tflite.stat().st_size
        assert r.op_histogram == histogram
        assert r.extra["repeats"]["count"] == 2
        assert len(r.extra["binary_sha256"]) == 64
    xnn, gpu = results[0], results[1]
    assert (xnn.latency_ms.runs, xnn.latency_ms.median, xnn.latency_ms.p90) == (
        50, pytest.approx(23.099), None
    )
    assert xnn.peak_memory_mb == 61.7305
    assert gpu.latency_ms.median is None and gpu.latency_ms.mean == pytest.approx(14.2408)
    assert gpu.extra["delegates_applied"][0]["graph"] == "complete"
    assert "Pixel 7" in printed.out and "n/a" in printed.out  # the table

    calls = phone.calls()
    assert calls[0] == ["devices"]
    assert all(c[:2] == ["-s", "FAKE0001"] for c in calls[1:])
    steps = [c[2:] for c in calls[1:]]
    assert steps[0] == ["shell", "getprop"]
    assert steps[1] == ["shell", f"mkdir -p {REMOTE}"]
    assert steps[2] == ["push", str(phone.binary), f"{REMOTE}/benchmark_model"]
    assert steps[3] == ["shell", f"chmod +x {REMOTE}/benchmark_model"]
    assert steps[4] == ["push", str(tiny_tflite), f"{REMOTE}/m0_tiny_float32.tflite"]
    assert steps[5] == ["push", str(second), f"{REMOTE}/m1_second.tflite"]
    assert steps[-1] == ["shell", f"rm -rf {REMOTE}"]
    runs = [c[3] for c in phone.shell_runs()]
    order = [("m0_" in r, "--use_gpu=true" in r) for r in runs]
    one_round = [(True, False), (True, True), (False, False), (False, True)]
    assert order == one_round * 2  # interleaved rounds
    for run in runs:
        for flag in ("--num_threads=4", "--num_runs=50", "--warmup_runs=5", "--min_secs=0",
                     "--warmup_min_secs=0", "--report_peak_memory_footprint=true"):
            assert flag in run
        assert run.startswith(f"cd {REMOTE} && {REMOTE}/benchmark_model --graph={REMOTE}/m")
        assert run.endswith("2>&1; echo keras_mvit2_exit=$?")
    assert runs[1].index("--use_gpu=true") < runs[1].index("--use_xnnpack=true")
    assert "--use_gpu" not in runs[0] and "--use_xnnpack=true" in runs[0]
    pulls = [s for s in steps if s[0] == "pull"]
    assert len(pulls) == 8 and all(p[1].startswith(f"{REMOTE}/run") for p in pulls)
    assert not (phone.root / REMOTE.lstrip("/")).exists()  # the work folder is removed
    assert len(list((tmp_path / "raw").glob("*.log"))) == 8


def test_op_profiling_and_taskset(phone, tiny_tflite):
    config = AndroidBenchConfig(
        models=[tiny_tflite], benchmark_model=phone.binary, delegates=["none"], threads=[1],
        runs=20, warmup=1, op_profiling=True, taskset="f0",
    )
    (result,) = run_android_benchmarks(config, log=lambda m: None)
    (run,) = [c[3] for c in phone.shell_runs()]
    assert f"&& taskset f0 {REMOTE}/benchmark_model" in run
    assert "--enable_op_profiling=true" in run and "--use_xnnpack=false" in run
    assert result.runtime["delegate"] == "none"
    assert result.extra["op_profiling"] is True
    assert result.extra["op_profile"]["top_ops"][0]["node_type"] == "FULLY_CONNECTED"
    assert result.latency_ms.warmup == 1 and result.latency_ms.runs == 20


def test_failed_gpu_run_keeps_the_other_results(phone, tiny_tflite, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_GPU_SAMPLE", "tflite_gpu_failed.txt")
    config = AndroidBenchConfig(
        models=[tiny_tflite], benchmark_model=phone.binary, delegates=["gpu", "xnnpack"],
        threads=[4], repeats=2,
    )
    with pytest.raises(PartialRunError) as info:
        run_android_benchmarks(config, log=lambda m: None)
    err = info.value
    assert [r.runtime["delegate"] for r in err.results] == ["xnnpack"]
    assert len(err.failures) == 1
    assert "'gpu'" in err.failures[0] and "Failed to apply GPU delegate." in err.failures[0]
    assert "exit status 1" in err.failures[0]
    # The failed configuration is not retried in round 2; the phone is cleaned up.
    assert sum("--use_gpu=true" in r[3] for r in phone.shell_runs()) == 1
    assert not (phone.root / REMOTE.lstrip("/")).exists()

    out_json = tmp_path / "partial.json"
    status = android.main([str(tiny_tflite), "--benchmark-model", str(phone.binary),
                           "--delegate", "gpu", "xnnpack", "--threads", "4",
                           "-o", str(out_json)])
    assert status == 1
    assert [r.runtime["delegate"] for r in load_results(out_json)] == ["xnnpack"]


def test_thread_count_is_checked_against_the_tool_log(phone, tiny_tflite):
    # The fake serves the 4-thread XNNPACK log: a 2-thread request must not pass as one.
    config = AndroidBenchConfig(models=[tiny_tflite], benchmark_model=phone.binary,
                                threads=[2])
    with pytest.raises(PartialRunError, match="ran with 4 threads instead of 2"):
        run_android_benchmarks(config, log=lambda m: None)


@pytest.mark.parametrize(
    ("devices", "serial", "message"),
    [
        ("", None, "No Android device found.*USB debugging"),
        ("A1:unauthorized", None, "unauthorized.*Allow USB debugging"),
        ("A1:device;B2:device", None, "Several devices.*--serial"),
        ("A1:device", "B2", "'B2' is not attached"),
        ("A1:offline", None, "'offline', not ready"),
    ],
)
def test_device_selection_errors(phone, tiny_tflite, monkeypatch, devices, serial, message):
    monkeypatch.setenv("FAKE_ADB_DEVICES", devices)
    config = AndroidBenchConfig(models=[tiny_tflite], benchmark_model=phone.binary,
                                serial=serial)
    with pytest.raises(AndroidBenchError, match=message):
        run_android_benchmarks(config, log=lambda m: None)
    assert not any(c[2] == "push" for c in phone.calls() if len(c) > 2)


def test_serial_selects_one_of_several_devices(phone, tiny_tflite, monkeypatch):
    monkeypatch.setenv("FAKE_ADB_DEVICES", "A1:device;B2:device")
    config = AndroidBenchConfig(models=[tiny_tflite], benchmark_model=phone.binary,
                                threads=[4], serial="B2")
    (result,) = run_android_benchmarks(config, log=lambda m: None)
    assert result.device["name"] == "Pixel 7"
    assert all(c[:2] == ["-s", "B2"] for c in phone.calls()[1:])


def test_binary_for_the_wrong_cpu_or_an_apk_is_refused(phone, tiny_tflite, tmp_path):
    x86 = tmp_path / "linux_x86-64_benchmark_model"
    x86.write_bytes(elf_header(62))
    config = AndroidBenchConfig(models=[tiny_tflite], benchmark_model=x86)
    with pytest.raises(AndroidBenchError, match=r"built for x86-64.*android_aarch64_benchmark"):
        run_android_benchmarks(config, log=lambda m: None)
    apk = tmp_path / "android_aarch64_benchmark_model.apk"
    apk.write_bytes(b"PK\x03\x04" + b"\0" * 60)
    config = AndroidBenchConfig(models=[tiny_tflite], benchmark_model=apk)
    with pytest.raises(AndroidBenchError, match=r"not a native executable.*\.apk"):
        run_android_benchmarks(config, log=lambda m: None)
    assert not any(c[2] == "push" for c in phone.calls() if len(c) > 2)


def test_bad_configurations_are_refused_before_adb(tmp_path, tiny_tflite, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no adb at all
    with pytest.raises(FileNotFoundError, match="android_aarch64_benchmark_model"):
        run_android_benchmarks(AndroidBenchConfig(
            models=[tiny_tflite], benchmark_model=tmp_path / "missing"), log=print)
    binary = tmp_path / "benchmark_model"
    binary.write_bytes(elf_header(183))
    package = tmp_path / "m.mlpackage"
    package.mkdir()
    cases = [
        (dict(models=[package]), ValueError, "runs .tflite files"),
        (dict(models=[tmp_path / "gone.tflite"]), FileNotFoundError, "Model not found"),
        (dict(delegates=["hexagon"]), ValueError, "delegates must be among"),
        (dict(threads=[0]), ValueError, "threads must be >= 1"),
        (dict(taskset="big"), ValueError, "hexadecimal CPU mask"),
        (dict(remote_dir="/sdcard/x"), ValueError, "under /data/local/tmp/"),
    ]
    for overrides, error, message in cases:
        kwargs = dict(models=[tiny_tflite], benchmark_model=binary) | overrides
        with pytest.raises(error, match=message):
            run_android_benchmarks(AndroidBenchConfig(**kwargs), log=print)
    with pytest.raises(AndroidBenchError, match=r"adb not found.*Platform-Tools"):
        run_android_benchmarks(AndroidBenchConfig(models=[tiny_tflite], benchmark_model=binary),
                               log=print)


def test_getprop_parsing_falls_back_to_the_board_name():
    props = parse_getprop("[ro.product.model]: [SM-G991B]\n[ro.board.platform]: [exynos2100]\n"
                          "[ro.build.version.release]: [13]\n[ro.build.version.sdk]: [33]\n"
                          "garbage line\n")
    info = device_info(props)
    assert (info["name"], info["cpu"], info["os"]) == ("SM-G991B", "exynos2100",
                                                       "Android 13 (API 33)")
