#if canImport(CoreML)
import Foundation
import MViT2Bench
import XCTest

/// Benchmarks every model in the bundled Models folder on the device the tests run on
/// (an iPhone through `xcodebuild test -destination 'platform=iOS,name=...'`, or the
/// Mac with `swift test`). Settings come from TEST_RUNNER_MVIT2_COMPUTE_UNITS,
/// TEST_RUNNER_MVIT2_RUNS, TEST_RUNNER_MVIT2_WARMUP and TEST_RUNNER_MVIT2_DEVICE_NAME.
/// Each record is printed on one line after `recordMarker` (collect them with
/// `python -m keras_mvit2.latency.ios extract xcodebuild.log -o iphone.json`) and
/// attached to the result bundle as keras_mvit2_bench.json.
final class DeviceBenchmarkTests: XCTestCase {
    func testBenchmarkBundledModels() async throws {
        let folder = try XCTUnwrap(Bundle.module.url(forResource: "Models", withExtension: nil))
        let models = try FileManager.default
            .contentsOfDirectory(at: folder, includingPropertiesForKeys: nil)
            .filter { ["mlpackage", "mlmodelc"].contains($0.pathExtension) }
            .map(\.path)
            .sorted()
        if models.isEmpty {
            throw XCTSkip("No model in \(folder.path): copy .mlpackage files into "
                + "harness/ios/Tests/MViT2DeviceBenchmarks/Models/ and build again.")
        }
        let options = try BenchmarkOptions.fromEnvironment(
            ProcessInfo.processInfo.environment, modelPaths: models)
        var records: [BenchRecord] = []
        for path in options.modelPaths {
            for units in options.computeUnits {
                let record = try await CoreMLBenchmark(options: options)
                    .run(modelPath: path, computeUnits: units)
                print(try RecordIO.markerLine(record))
                records.append(record)
            }
        }
        let attachment = XCTAttachment(
            data: try RecordIO.encode(records), uniformTypeIdentifier: "public.json")
        attachment.name = "keras_mvit2_bench.json"
        attachment.lifetime = .keepAlways
        add(attachment)

        XCTAssertEqual(records.count, options.modelPaths.count * options.computeUnits.count)
        for record in records {
            XCTAssertEqual(record.latencyMs.runs, options.runs)
            XCTAssertGreaterThan(record.latencyMs.min, 0)
            XCTAssertLessThanOrEqual(record.latencyMs.median, record.latencyMs.max)
        }
    }
}
#endif
