"""iPhone harness: the Swift records (harness/ios) against the Python schema.

Swift cannot be compiled here, so the link between the two is checked statically:
the CodingKeys of the Swift structs must name exactly the fields of the Python
dataclasses and cover every stored property, and the fixture the Swift tests decode
(Tests/MViT2BenchTests/Fixtures/sample_records.json, written field by field after the
structs) must load with `load_results` and merge with Android records.
"""

import dataclasses
import json
import re
from pathlib import Path

import pytest

from keras_mvit2.latency import BenchResult, LatencyStats, android, ios, load_results, save_results

REPO = Path(__file__).resolve().parents[1]
SWIFT_PACKAGE = REPO / "harness" / "ios"
SWIFT_RECORDS = SWIFT_PACKAGE / "Sources" / "MViT2Bench" / "BenchRecord.swift"
FIXTURE = SWIFT_PACKAGE / "Tests" / "MViT2BenchTests" / "Fixtures" / "sample_records.json"
DATA = Path(__file__).parent / "data" / "benchmark_model"


def _body(source: str, open_brace: int) -> str:
    depth = 0
    for i in range(open_brace, len(source)):
        if source[i] == "{":
            depth += 1
        elif source[i] == "}":
            depth -= 1
            if depth == 0:
                return source[open_brace + 1:i]
    raise AssertionError("unbalanced braces in the Swift source")


def swift_structs(source: str) -> dict[str, dict]:
    """{struct: {"properties": {name: type}, "keys": {property: json name}}} of the
    `public struct`s of a Swift file (stored `public var`s and their CodingKeys)."""
    structs = {}
    for match in re.finditer(r"public struct (\w+)\s*:[^{]*\{", source):
        body = _body(source, match.end() - 1)
        enum = re.search(r"enum CodingKeys: String, CodingKey \{(.*?)\n\s*\}", body, re.S)
        keys = {}
        for line in re.findall(r"^\s*case (.+)$", enum.group(1) if enum else "", re.M):
            for item in line.split(","):
                name, _, json_name = item.partition("=")
                keys[name.strip()] = json_name.strip().strip('"') or name.strip()
        properties = dict(re.findall(r"^    public var (\w+): ([^\n={]+?)\s*$", body, re.M))
        structs[match.group(1)] = {"properties": properties, "keys": keys}
    return structs


@pytest.fixture(scope="module")
def structs() -> dict[str, dict]:
    return swift_structs(SWIFT_RECORDS.read_text())


def test_swift_coding_keys_match_the_python_schema(structs):
    record = structs["BenchRecord"]["keys"]
    assert list(record.values()) == [f.name for f in dataclasses.fields(BenchResult)]
    latency = structs["LatencyStats"]["keys"]
    assert list(latency.values()) == [f.name for f in dataclasses.fields(LatencyStats)]
    # Fields without a default in Python are not optional in Swift (always encoded).
    required = {f.name for f in dataclasses.fields(BenchResult)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    props = structs["BenchRecord"]["properties"]
    for swift_name, json_name in record.items():
        if json_name in required:
            assert not props[swift_name].endswith("?"), swift_name
    assert 'benchSchema = "keras_mvit2.bench/1"' in SWIFT_RECORDS.read_text()
    assert f'recordMarker = "{ios.RECORD_MARKER}"' in SWIFT_RECORDS.read_text()


def test_every_stored_property_has_a_coding_key(structs):
    assert set(structs) >= {"LatencyStats", "ModelInfo", "DeviceInfo", "RuntimeInfo",
                            "BenchExtra", "BenchRecord"}
    for name, struct in structs.items():
        assert struct["properties"], name
        assert set(struct["keys"]) == set(struct["properties"]), name


def test_the_swift_fixture_follows_the_structs_field_by_field(structs):
    nested = {"model": "ModelInfo", "device": "DeviceInfo", "runtime": "RuntimeInfo",
              "extra": "BenchExtra", "latency_ms": "LatencyStats"}

    def check(obj: dict, struct_name: str):
        struct = structs[struct_name]
        json_names = set(struct["keys"].values())
        required = {struct["keys"][p] for p, t in struct["properties"].items()
                    if not t.endswith("?")}
        assert set(obj) <= json_names, (struct_name, set(obj) - json_names)
        assert set(obj) >= required, (struct_name, required - set(obj))

    data = json.loads(FIXTURE.read_text())
    assert len(data) == 2
    for record in data:
        check(record, "BenchRecord")
        for key, struct_name in nested.items():
            check(record[key], struct_name)


def test_swift_records_load_and_merge_with_android_records(tmp_path):
    swift = load_results(FIXTURE)
    assert [r.device["platform"] for r in swift] == ["ios", "ios"]
    assert [r.runtime["delegate"] for r in swift] == ["cpu_and_ne", "cpu_only"]
    assert swift[0].latency_ms == LatencyStats(runs=50, warmup=5, min=1.071, median=1.118,
                                               p90=1.164, max=1.402, mean=1.1231)
    assert swift[0].extra["ops_by_compute_device"] == {"cpu": 2, "neural_engine": 541}
    assert "ops_by_compute_device" not in swift[1].extra  # nil is omitted by JSONEncoder
    assert swift[1].op_histogram == {}

    phone = android.to_bench_result(
        android.parse_benchmark_output((DATA / "tflite_xnnpack_threads4.txt").read_text()),
        model={"name": "mobilevitv2_050"}, device={"name": "Pixel 7", "platform": "android"},
        runtime={"delegate": "xnnpack", "threads": 4},
    )
    save_results([phone], tmp_path / "pixel7.json")
    merged = load_results(FIXTURE) + load_results(tmp_path / "pixel7.json")
    save_results(merged, tmp_path / "all.json")
    again = load_results(tmp_path / "all.json")
    assert [(r.device["name"], r.runtime["delegate"]) for r in again] == [
        ("iPhone 14 Pro", "cpu_and_ne"), ("iPhone 12", "cpu_only"), ("Pixel 7", "xnnpack"),
    ]
    assert {r.model["name"] for r in again} == {"mobilevitv2_050"}
    table = android.format_table(again)
    assert "iPhone 14 Pro" in table and "cpu_and_ne" in table and "Pixel 7" in table

    # The comparison table of `mvit2 bench-report`: one column per device/runtime.
    from keras_mvit2.latency.report import compare

    report = compare(again)
    assert len(report.columns) == 3
    cells = sorted(report.cells.values())
    assert cells == pytest.approx(sorted([1.118, 12.981, 23.099]))


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        ([5, 1, 4, 2, 3], dict(min=1, median=3, p90=5, max=5, mean=3)),
        ([4, 1, 3, 2], dict(median=2.5, p90=4)),
        ([10, 11, 12, 13, 14, 15], dict(p90=14, median=12.5, mean=12.5)),
    ],
)
def test_swift_statistics_match_python(samples, expected):
    # The same samples and values as harness/ios/Tests/MViT2BenchTests/StatisticsTests.swift.
    stats = LatencyStats.from_samples(samples, warmup=0)
    assert {k: getattr(stats, k) for k in expected} == expected
    swift_tests = (SWIFT_PACKAGE / "Tests" / "MViT2BenchTests" / "StatisticsTests.swift")
    assert str(samples).replace(" ", "") in swift_tests.read_text().replace(" ", "")


def _log_with(records: list[dict]) -> str:
    lines = [
        "Test Suite 'All tests' started at 2026-11-20 10:15:30.123.",
        "Test Case '-[MViT2DeviceBenchmarks.DeviceBenchmarkTests "
        "testBenchmarkBundledModels]' started.",
    ]
    lines += [ios.RECORD_MARKER + json.dumps(r, sort_keys=True, separators=(",", ":"))
              for r in records]
    lines.append("Test Case '-[MViT2DeviceBenchmarks.DeviceBenchmarkTests "
                 "testBenchmarkBundledModels]' passed (41.210 seconds).")
    return "\n".join(lines) + "\n"


def test_extract_records_from_an_xcodebuild_log(tmp_path):
    data = json.loads(FIXTURE.read_text())
    log = tmp_path / "xcodebuild.log"
    log.write_text(_log_with(data))
    records = ios.extract_records(log.read_text())
    assert [r.to_dict() for r in records] == [BenchResult.from_dict(d).to_dict() for d in data]

    out = tmp_path / "iphone.json"
    assert ios.main(["extract", str(log), "-o", str(out)]) == 0
    assert [r.device["name"] for r in load_results(out)] == ["iPhone 14 Pro", "iPhone 12"]


def test_extract_records_errors(tmp_path):
    with pytest.raises(ValueError, match="No KERAS_MVIT2_BENCH_RECORD line"):
        ios.extract_records("Test Case skipped: No model in Models\n")
    bad = dict(json.loads(FIXTURE.read_text())[0], schema="other/1")
    with pytest.raises(ValueError, match=r"log:3: .*not a keras_mvit2.bench/1 record"):
        ios.extract_records(_log_with([bad]))
    truncated = _log_with(json.loads(FIXTURE.read_text()))[:-200]
    with pytest.raises(ValueError, match=r"not a keras_mvit2\.bench/1 record"):
        ios.extract_records(truncated)
    empty = tmp_path / "empty.log"
    empty.write_text("nothing\n")
    assert ios.main(["extract", str(empty), "-o", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()


def test_compute_unit_names_are_the_same_in_swift_and_python():
    source = (SWIFT_PACKAGE / "Sources" / "MViT2Bench" / "Options.swift").read_text()
    enum = source[source.index("enum ComputeUnitsOption"):]
    enum = enum[:enum.index("static func")]
    assert tuple(re.findall(r'case \w+ = "(\w+)"', enum)) == ios.COMPUTE_UNITS
    from keras_mvit2.latency import coreml_host

    assert set(coreml_host._COMPUTE_UNITS) == set(ios.COMPUTE_UNITS)  # mvit2 bench --compute-units
