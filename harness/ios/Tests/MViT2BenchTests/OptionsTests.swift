import XCTest

import MViT2Bench

final class OptionsTests: XCTestCase {
    func testCommandLine() throws {
        let options = try BenchmarkOptions.parse([
            "a.mlpackage", "--compute-units", "cpu_only", "cpu_and_ne", "--runs", "20",
            "--warmup", "0", "--model", "b.mlpackage", "--output", "out.json",
            "--device-name", "iPhone 14 Pro",
        ])
        XCTAssertEqual(options.modelPaths, ["a.mlpackage", "b.mlpackage"])
        XCTAssertEqual(options.computeUnits, [.cpuOnly, .cpuAndNeuralEngine])
        XCTAssertEqual(options.runs, 20)
        XCTAssertEqual(options.warmup, 0)
        XCTAssertEqual(options.outputPath, "out.json")
        XCTAssertEqual(options.deviceName, "iPhone 14 Pro")
    }

    func testDefaults() throws {
        let options = try BenchmarkOptions.parse(["m.mlpackage"])
        XCTAssertEqual(options.computeUnits, [.all])
        XCTAssertEqual(options.runs, 50)
        XCTAssertEqual(options.warmup, 5)
    }

    func testBadArguments() {
        XCTAssertThrowsError(try BenchmarkOptions.parse([]))
        XCTAssertThrowsError(try BenchmarkOptions.parse(["m", "--compute-units", "ane"]))
        XCTAssertThrowsError(try BenchmarkOptions.parse(["m", "--runs", "0"]))
        XCTAssertThrowsError(try BenchmarkOptions.parse(["m", "--runs"]))
        XCTAssertThrowsError(try BenchmarkOptions.parse(["m", "--threads", "4"]))
    }

    func testEnvironmentOfAnXCTestRun() throws {
        let options = try BenchmarkOptions.fromEnvironment(
            ["MVIT2_COMPUTE_UNITS": "cpu_only, all", "MVIT2_RUNS": "100", "MVIT2_WARMUP": "10",
             "MVIT2_DEVICE_NAME": "iPhone 12"],
            modelPaths: ["m.mlpackage"])
        XCTAssertEqual(options.computeUnits, [.cpuOnly, .all])
        XCTAssertEqual(options.runs, 100)
        XCTAssertEqual(options.warmup, 10)
        XCTAssertEqual(options.deviceName, "iPhone 12")
        XCTAssertThrowsError(
            try BenchmarkOptions.fromEnvironment(["MVIT2_RUNS": "many"], modelPaths: []))
    }
}
