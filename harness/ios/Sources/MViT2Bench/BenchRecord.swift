import Foundation

/// The schema tag of `keras_mvit2.latency.schema.SCHEMA`.
public let benchSchema = "keras_mvit2.bench/1"

/// Prefix of a console line that carries one JSON record (how records leave an
/// iPhone test run: `python -m keras_mvit2.latency.ios extract xcodebuild.log`).
public let recordMarker = "KERAS_MVIT2_BENCH_RECORD "

// The Swift side of `keras_mvit2.latency.schema`: field by field the JSON that
// `BenchResult.from_dict` / `load_results` read. The CodingKeys below are checked
// against the Python dataclasses by `tests/test_bench_ios.py`.

/// `LatencyStats`: latency of single-batch predictions in milliseconds.
public struct LatencyStats: Codable, Equatable, Sendable {
    public var runs: Int
    public var warmup: Int
    public var min: Double
    public var median: Double
    public var p90: Double
    public var max: Double
    public var mean: Double

    private enum CodingKeys: String, CodingKey {
        case runs, warmup, min, median, p90, max, mean
    }

    public init(runs: Int, warmup: Int, min: Double, median: Double, p90: Double,
                max: Double, mean: Double) {
        self.runs = runs
        self.warmup = warmup
        self.min = min
        self.median = median
        self.p90 = p90
        self.max = max
        self.mean = mean
    }

    /// Same definitions as `LatencyStats.from_samples` in Python: the median of an even
    /// count is the mean of the two middle runs; p90 is the sorted run at index
    /// round(0.9 * (n - 1)), rounding half to even like Python's `round`.
    public static func fromSamples(_ samplesMs: [Double], warmup: Int) throws -> LatencyStats {
        guard !samplesMs.isEmpty else {
            throw BenchError.invalid("LatencyStats needs at least one timed run. Received: 0 samples")
        }
        let ordered = samplesMs.sorted()
        let n = ordered.count
        let median = n % 2 == 1 ? ordered[n / 2] : (ordered[n / 2 - 1] + ordered[n / 2]) / 2
        let p90Index = Swift.min(
            n - 1, Swift.max(0, Int((0.9 * Double(n - 1)).rounded(.toNearestOrEven))))
        return LatencyStats(
            runs: n, warmup: warmup, min: ordered[0], median: median, p90: ordered[p90Index],
            max: ordered[n - 1], mean: ordered.reduce(0, +) / Double(n))
    }
}

/// `BenchResult.model`.
public struct ModelInfo: Codable, Equatable, Sendable {
    public var name: String
    public var path: String
    public var format: String
    public var sizeBytes: Int
    public var params: Int?
    public var macs: Int?
    public var inputShape: [Int]
    public var inputKind: String

    private enum CodingKeys: String, CodingKey {
        case name, path, format
        case sizeBytes = "size_bytes"
        case params, macs
        case inputShape = "input_shape"
        case inputKind = "input_kind"
    }

    public init(name: String, path: String, format: String, sizeBytes: Int, params: Int? = nil,
                macs: Int? = nil, inputShape: [Int], inputKind: String) {
        self.name = name
        self.path = path
        self.format = format
        self.sizeBytes = sizeBytes
        self.params = params
        self.macs = macs
        self.inputShape = inputShape
        self.inputKind = inputKind
    }
}

/// `BenchResult.device`.
public struct DeviceInfo: Codable, Equatable, Sendable {
    public var name: String
    public var platform: String
    public var machine: String
    public var os: String
    public var cpu: String

    private enum CodingKeys: String, CodingKey {
        case name, platform, machine, os, cpu
    }

    public init(name: String, platform: String, machine: String, os: String, cpu: String) {
        self.name = name
        self.platform = platform
        self.machine = machine
        self.os = os
        self.cpu = cpu
    }
}

/// `BenchResult.runtime`: Core ML with one set of compute units (`delegate`).
public struct RuntimeInfo: Codable, Equatable, Sendable {
    public var name: String
    public var version: String
    public var threads: Int?
    public var delegate: String
    public var batchSize: Int

    private enum CodingKeys: String, CodingKey {
        case name, version, threads, delegate
        case batchSize = "batch_size"
    }

    public init(name: String, version: String, threads: Int? = nil, delegate: String,
                batchSize: Int) {
        self.name = name
        self.version = version
        self.threads = threads
        self.delegate = delegate
        self.batchSize = batchSize
    }
}

/// `BenchResult.extra` of a Core ML run.
public struct BenchExtra: Codable, Equatable, Sendable {
    public var harness: String
    public var compileMs: Double?
    public var loadMs: Double
    public var firstPredictionMs: Double?
    public var residentMemoryMb: Double?
    public var peakMemorySource: String
    public var opsByComputeDevice: [String: Int]?

    private enum CodingKeys: String, CodingKey {
        case harness
        case compileMs = "compile_ms"
        case loadMs = "load_ms"
        case firstPredictionMs = "first_prediction_ms"
        case residentMemoryMb = "resident_memory_mb"
        case peakMemorySource = "peak_memory_source"
        case opsByComputeDevice = "ops_by_compute_device"
    }

    public init(harness: String, compileMs: Double?, loadMs: Double, firstPredictionMs: Double?,
                residentMemoryMb: Double?, peakMemorySource: String,
                opsByComputeDevice: [String: Int]?) {
        self.harness = harness
        self.compileMs = compileMs
        self.loadMs = loadMs
        self.firstPredictionMs = firstPredictionMs
        self.residentMemoryMb = residentMemoryMb
        self.peakMemorySource = peakMemorySource
        self.opsByComputeDevice = opsByComputeDevice
    }
}

/// `BenchResult`: one model measured on one device with one set of compute units.
public struct BenchRecord: Codable, Equatable, Sendable {
    public var model: ModelInfo
    public var device: DeviceInfo
    public var runtime: RuntimeInfo
    public var latencyMs: LatencyStats
    public var peakMemoryMb: Double?
    public var opHistogram: [String: Int]
    public var extra: BenchExtra
    public var timestamp: String
    public var schema: String

    private enum CodingKeys: String, CodingKey {
        case model, device, runtime
        case latencyMs = "latency_ms"
        case peakMemoryMb = "peak_memory_mb"
        case opHistogram = "op_histogram"
        case extra, timestamp, schema
    }

    public init(model: ModelInfo, device: DeviceInfo, runtime: RuntimeInfo,
                latencyMs: LatencyStats, peakMemoryMb: Double?, opHistogram: [String: Int],
                extra: BenchExtra, timestamp: String, schema: String = benchSchema) {
        self.model = model
        self.device = device
        self.runtime = runtime
        self.latencyMs = latencyMs
        self.peakMemoryMb = peakMemoryMb
        self.opHistogram = opHistogram
        self.extra = extra
        self.timestamp = timestamp
        self.schema = schema
    }
}

public enum BenchError: Error, CustomStringConvertible, Equatable {
    case invalid(String)

    public var description: String {
        switch self {
        case .invalid(let message): return message
        }
    }
}

/// JSON in and out: a list of records (what `save_results` writes), one record per
/// marker line for console logs.
public enum RecordIO {
    public static func encode(_ records: [BenchRecord]) throws -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        return try encoder.encode(records)
    }

    public static func decode(_ data: Data) throws -> [BenchRecord] {
        try JSONDecoder().decode([BenchRecord].self, from: data)
    }

    public static func markerLine(_ record: BenchRecord) throws -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return recordMarker + String(decoding: try encoder.encode(record), as: UTF8.self)
    }

    /// Writes `records` as a JSON list, atomically.
    public static func write(_ records: [BenchRecord], to path: String) throws {
        try encode(records).write(to: URL(fileURLWithPath: path), options: .atomic)
    }
}
