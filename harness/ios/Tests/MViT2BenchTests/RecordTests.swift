import Foundation
import XCTest

import MViT2Bench

final class RecordTests: XCTestCase {
    private func fixture() throws -> Data {
        let url = try XCTUnwrap(
            Bundle.module.url(forResource: "sample_records", withExtension: "json",
                              subdirectory: "Fixtures"))
        return try Data(contentsOf: url)
    }

    /// The fixture (also read by tests/test_bench_ios.py with load_results) decodes
    /// into the structs and encodes back to the same JSON keys.
    func testFixtureRoundTrip() throws {
        let records = try RecordIO.decode(try fixture())
        XCTAssertEqual(records.count, 2)
        XCTAssertEqual(records[0].runtime.delegate, ComputeUnitsOption.cpuAndNeuralEngine.rawValue)
        XCTAssertEqual(records[0].extra.opsByComputeDevice?["neural_engine"], 541)
        XCTAssertNil(records[1].extra.opsByComputeDevice)
        XCTAssertEqual(try RecordIO.decode(try RecordIO.encode(records)), records)

        let object = try XCTUnwrap(
            try JSONSerialization.jsonObject(with: try RecordIO.encode(records)) as? [[String: Any]])
        XCTAssertEqual(
            Set(object[0].keys),
            ["model", "device", "runtime", "latency_ms", "peak_memory_mb", "op_histogram",
             "extra", "timestamp", "schema"])
        let latency = try XCTUnwrap(object[0]["latency_ms"] as? [String: Any])
        XCTAssertEqual(Set(latency.keys), ["runs", "warmup", "min", "median", "p90", "max", "mean"])
    }

    func testMarkerLineIsOneCompactRecord() throws {
        let record = try RecordIO.decode(try fixture())[0]
        let line = try RecordIO.markerLine(record)
        XCTAssertTrue(line.hasPrefix(recordMarker))
        XCTAssertFalse(line.contains("\n"))
        let json = Data(line.dropFirst(recordMarker.count).utf8)
        XCTAssertEqual(try JSONDecoder().decode(BenchRecord.self, from: json), record)
    }
}
