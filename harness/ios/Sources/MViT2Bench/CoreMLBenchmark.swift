#if canImport(CoreML)
import CoreML
import CoreVideo
import Foundation

extension ComputeUnitsOption {
    public var mlComputeUnits: MLComputeUnits {
        switch self {
        case .cpuOnly: return .cpuOnly
        case .cpuAndGPU: return .cpuAndGPU
        case .cpuAndNeuralEngine: return .cpuAndNeuralEngine
        case .all: return .all
        }
    }
}

/// Times Core ML predictions of one model with one set of compute units.
public struct CoreMLBenchmark: Sendable {
    public static let harness = "mvit2-coreml-bench 0.1 (Swift, Core ML)"
    public let options: BenchmarkOptions

    public init(options: BenchmarkOptions) {
        self.options = options
    }

    /// Compiles (unless already an .mlmodelc), loads, warms up and times the model.
    public func run(modelPath: String, computeUnits: ComputeUnitsOption) async throws
        -> BenchRecord
    {
        let sourceURL = URL(fileURLWithPath: modelPath)
        guard FileManager.default.fileExists(atPath: sourceURL.path) else {
            throw BenchError.invalid("Model not found: \(modelPath)")
        }
        let clock = ContinuousClock()
        var compileMs: Double? = nil
        let compiledURL: URL
        if sourceURL.pathExtension == "mlmodelc" {
            compiledURL = sourceURL
        } else {
            let start = clock.now
            compiledURL = try await MLModel.compileModel(at: sourceURL)
            compileMs = start.duration(to: clock.now).milliseconds
        }

        let configuration = MLModelConfiguration()
        configuration.computeUnits = computeUnits.mlComputeUnits
        let loadStart = clock.now
        let model = try MLModel(contentsOf: compiledURL, configuration: configuration)
        let loadMs = loadStart.duration(to: clock.now).milliseconds
        let input = try Self.makeInput(for: model.modelDescription)

        var firstPredictionMs: Double? = nil
        for index in 0..<options.warmup {
            let start = clock.now
            try autoreleasepool { _ = try model.prediction(from: input.provider) }
            if index == 0 { firstPredictionMs = start.duration(to: clock.now).milliseconds }
        }
        var samples: [Double] = []
        samples.reserveCapacity(options.runs)
        for _ in 0..<options.runs {
            let start = clock.now
            try autoreleasepool { _ = try model.prediction(from: input.provider) }
            samples.append(start.duration(to: clock.now).milliseconds)
        }
        let memory = SystemInfo.residentMemory()
        let plan = await Self.computePlanSummary(compiledURL: compiledURL,
                                                 configuration: configuration)

        let device = SystemInfo.device(name: options.deviceName)
        let name = sourceURL.deletingPathExtension().lastPathComponent
        return BenchRecord(
            model: ModelInfo(
                name: name, path: modelPath, format: sourceURL.pathExtension,
                sizeBytes: SystemInfo.diskSize(of: sourceURL), inputShape: input.shape,
                inputKind: input.kind),
            device: device,
            runtime: RuntimeInfo(name: "coreml", version: device.os,
                                 delegate: computeUnits.rawValue, batchSize: 1),
            latencyMs: try LatencyStats.fromSamples(samples, warmup: options.warmup),
            peakMemoryMb: memory.map { Double($0.peak) / 1_048_576 },
            opHistogram: plan?.histogram ?? [:],
            extra: BenchExtra(
                harness: Self.harness, compileMs: compileMs, loadMs: loadMs,
                firstPredictionMs: firstPredictionMs,
                residentMemoryMb: memory.map { Double($0.current) / 1_048_576 },
                peakMemorySource: "task_info(MACH_TASK_BASIC_INFO).resident_size_max of the "
                    + "whole process (harness included)",
                opsByComputeDevice: plan?.devices),
            timestamp: ISO8601DateFormatter().string(from: Date()))
    }

    /// A generated input for every model input: a CVPixelBuffer of the declared size and
    /// pixel format for an image input (filled with pseudo-random bytes), an MLMultiArray
    /// of the declared shape and data type otherwise.
    static func makeInput(for description: MLModelDescription) throws
        -> (provider: MLFeatureProvider, shape: [Int], kind: String)
    {
        var features: [String: Any] = [:]
        var shape: [Int] = []
        var kind = ""
        let inputs = description.inputDescriptionsByName.sorted { $0.key < $1.key }
        for (name, feature) in inputs {
            switch feature.type {
            case .image:
                guard let constraint = feature.imageConstraint else {
                    throw BenchError.invalid("Input '\(name)' is an image without a size.")
                }
                let format = constraint.pixelFormatType
                let buffer = try makePixelBuffer(
                    width: constraint.pixelsWide, height: constraint.pixelsHigh, format: format)
                features[name] = MLFeatureValue(pixelBuffer: buffer)
                let channels = format == kCVPixelFormatType_OneComponent8 ? 1 : 3
                if shape.isEmpty {
                    shape = [1, constraint.pixelsHigh, constraint.pixelsWide, channels]
                    kind = "image"
                }
            case .multiArray:
                guard let constraint = feature.multiArrayConstraint else {
                    throw BenchError.invalid("Input '\(name)' is a multi-array without a shape.")
                }
                let dims = try arrayShape(constraint, name: name)
                let array = try MLMultiArray(shape: dims.map { NSNumber(value: $0) },
                                             dataType: constraint.dataType)
                for index in 0..<array.count {
                    array[index] = NSNumber(value: Float(index % 251) / 251)
                }
                features[name] = MLFeatureValue(multiArray: array)
                if shape.isEmpty {
                    shape = dims
                    kind = "multiArray"
                }
            default:
                throw BenchError.invalid(
                    "Input '\(name)' has feature type \(feature.type.rawValue); the harness "
                        + "feeds image and multi-array inputs only.")
            }
        }
        return (try MLDictionaryFeatureProvider(dictionary: features), shape, kind)
    }

    static func arrayShape(_ constraint: MLMultiArrayConstraint, name: String) throws -> [Int] {
        let shape = constraint.shape.map(\.intValue)
        if !shape.isEmpty && shape.allSatisfy({ $0 > 0 }) { return shape }
        let flexible = constraint.shapeConstraint
        if flexible.type == .enumerated, let first = flexible.enumeratedShapes.first {
            return first.map(\.intValue)
        }
        if flexible.type == .range {
            return flexible.sizeRangeForDimension.map { Swift.max(1, $0.rangeValue.location) }
        }
        throw BenchError.invalid("Input '\(name)' has no usable shape: \(shape)")
    }

    static func makePixelBuffer(width: Int, height: Int, format: OSType) throws -> CVPixelBuffer {
        var created: CVPixelBuffer?
        let attributes: [CFString: Any] = [
            kCVPixelBufferIOSurfacePropertiesKey: [CFString: Any](),
        ]
        let status = CVPixelBufferCreate(
            kCFAllocatorDefault, width, height, format, attributes as CFDictionary, &created)
        guard status == kCVReturnSuccess, let buffer = created else {
            throw BenchError.invalid(
                "CVPixelBufferCreate failed (\(status)) for \(width)x\(height), format \(format)")
        }
        CVPixelBufferLockBaseAddress(buffer, [])
        defer { CVPixelBufferUnlockBaseAddress(buffer, []) }
        if let base = CVPixelBufferGetBaseAddress(buffer) {
            let count = CVPixelBufferGetBytesPerRow(buffer) * height
            let bytes = base.bindMemory(to: UInt8.self, capacity: count)
            var state: UInt32 = 0x2545_F491
            for index in 0..<count {
                state = state &* 1_664_525 &+ 1_013_904_223
                bytes[index] = UInt8(truncatingIfNeeded: state >> 24)
            }
        }
        return buffer
    }

    /// Op histogram and the compute device Core ML prefers for each op
    /// (MLComputePlan, iOS 17.4 / macOS 14.4 and later; nil before or on failure).
    static func computePlanSummary(compiledURL: URL, configuration: MLModelConfiguration) async
        -> (histogram: [String: Int], devices: [String: Int])?
    {
        guard #available(macOS 14.4, iOS 17.4, *) else { return nil }
        guard let plan = try? await MLComputePlan.load(contentsOf: compiledURL,
                                                       configuration: configuration),
            case let .program(program) = plan.modelStructure
        else { return nil }
        var histogram: [String: Int] = [:]
        var devices: [String: Int] = [:]
        var blocks = program.functions.values.map(\.block)
        while let block = blocks.popLast() {
            for operation in block.operations {
                histogram[operation.operatorName, default: 0] += 1
                if let usage = plan.deviceUsage(for: operation) {
                    devices[deviceName(usage.preferred), default: 0] += 1
                }
                blocks.append(contentsOf: operation.blocks)
            }
        }
        return (histogram, devices)
    }

    @available(macOS 14.4, iOS 17.4, *)
    static func deviceName(_ device: MLComputeDevice) -> String {
        switch device {
        case .cpu: return "cpu"
        case .gpu: return "gpu"
        case .neuralEngine: return "neural_engine"
        @unknown default: return "other"
        }
    }
}
#endif
