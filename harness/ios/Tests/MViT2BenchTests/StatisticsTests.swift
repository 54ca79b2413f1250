import XCTest

import MViT2Bench

/// The same samples and expected values as test_swift_statistics_match_python in
/// tests/test_bench_ios.py, which checks them against LatencyStats.from_samples.
final class StatisticsTests: XCTestCase {
    func testOddCount() throws {
        let stats = try LatencyStats.fromSamples([5, 1, 4, 2, 3], warmup: 2)
        XCTAssertEqual(stats, LatencyStats(runs: 5, warmup: 2, min: 1, median: 3, p90: 5,
                                           max: 5, mean: 3))
    }

    func testEvenCountAveragesTheMiddleRuns() throws {
        let stats = try LatencyStats.fromSamples([4, 1, 3, 2], warmup: 0)
        XCTAssertEqual(stats.median, 2.5)
        XCTAssertEqual(stats.p90, 4)  // index round(2.7) = 3
    }

    func testP90IndexRoundsHalfToEvenLikePython() throws {
        // n = 6: 0.9 * 5 = 4.5 rounds to 4 (Python's round), not 5.
        let stats = try LatencyStats.fromSamples([10, 11, 12, 13, 14, 15], warmup: 1)
        XCTAssertEqual(stats.p90, 14)
        XCTAssertEqual(stats.median, 12.5)
        XCTAssertEqual(stats.mean, 12.5)
    }

    func testNoSamplesIsAnError() {
        XCTAssertThrowsError(try LatencyStats.fromSamples([], warmup: 0))
    }
}
