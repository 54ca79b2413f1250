import Foundation

/// Core ML compute units, named as in the records' `runtime.delegate`.
public enum ComputeUnitsOption: String, CaseIterable, Sendable {
    case cpuOnly = "cpu_only"
    case cpuAndGPU = "cpu_and_gpu"
    case cpuAndNeuralEngine = "cpu_and_ne"
    case all = "all"

    static func parse(_ text: String) throws -> ComputeUnitsOption {
        guard let units = ComputeUnitsOption(rawValue: text) else {
            let names = allCases.map(\.rawValue).joined(separator: ", ")
            throw BenchError.invalid("Unknown compute units '\(text)'; use one of: \(names)")
        }
        return units
    }
}

/// What to run: every model with every set of compute units.
public struct BenchmarkOptions: Equatable, Sendable {
    public var modelPaths: [String]
    public var computeUnits: [ComputeUnitsOption]
    public var runs: Int
    public var warmup: Int
    public var outputPath: String?
    public var deviceName: String?
    public var showHelp: Bool

    public init(modelPaths: [String], computeUnits: [ComputeUnitsOption] = [.all],
                runs: Int = 50, warmup: Int = 5, outputPath: String? = nil,
                deviceName: String? = nil, showHelp: Bool = false) {
        self.modelPaths = modelPaths
        self.computeUnits = computeUnits
        self.runs = runs
        self.warmup = warmup
        self.outputPath = outputPath
        self.deviceName = deviceName
        self.showHelp = showHelp
    }

    public static let usage = """
        usage: mvit2-coreml-bench MODEL.mlpackage [MODEL ...] [--compute-units UNITS ...]
                                  [--runs N] [--warmup N] [--output FILE.json]
                                  [--device-name NAME]

        Compiles each model (MLModel.compileModel(at:)), loads it with each set of compute
        units, runs --warmup untimed and --runs timed predictions on a generated input of
        the model's shape, and prints/writes keras_mvit2.bench/1 records.

          --compute-units   cpu_only, cpu_and_gpu, cpu_and_ne, all (default: all)
          --runs            timed predictions (default: 50)
          --warmup          untimed predictions before them (default: 5)
          --output          write the records as a JSON list (merge with mvit2 bench-report)
          --device-name     device name for the records (default: the model identifier)
        """

    /// Parses command-line arguments (without the program name).
    public static func parse(_ arguments: [String]) throws -> BenchmarkOptions {
        var options = BenchmarkOptions(modelPaths: [])
        var units: [ComputeUnitsOption] = []
        var index = 0
        func value(_ flag: String) throws -> String {
            index += 1
            guard index < arguments.count, !arguments[index].hasPrefix("--") else {
                throw BenchError.invalid("\(flag) needs a value")
            }
            return arguments[index]
        }
        while index < arguments.count {
            let argument = arguments[index]
            switch argument {
            case "-h", "--help":
                options.showHelp = true
            case "--model":
                options.modelPaths.append(try value(argument))
            case "--compute-units":
                let start = index
                while index + 1 < arguments.count, !arguments[index + 1].hasPrefix("--") {
                    index += 1
                    units.append(try ComputeUnitsOption.parse(arguments[index]))
                }
                if index == start { throw BenchError.invalid("--compute-units needs a value") }
            case "--runs":
                options.runs = try positive(value(argument), flag: argument, minimum: 1)
            case "--warmup":
                options.warmup = try positive(value(argument), flag: argument, minimum: 0)
            case "--output":
                options.outputPath = try value(argument)
            case "--device-name":
                options.deviceName = try value(argument)
            default:
                if argument.hasPrefix("--") {
                    throw BenchError.invalid("Unknown option \(argument)\n\(usage)")
                }
                options.modelPaths.append(argument)
            }
            index += 1
        }
        if !units.isEmpty { options.computeUnits = units }
        if options.modelPaths.isEmpty && !options.showHelp {
            throw BenchError.invalid("Pass at least one .mlpackage (or .mlmodelc)\n\(usage)")
        }
        return options
    }

    /// The options of an XCTest run on a device, where there is no command line:
    /// environment variables MVIT2_COMPUTE_UNITS (comma-separated), MVIT2_RUNS,
    /// MVIT2_WARMUP and MVIT2_DEVICE_NAME (set them as TEST_RUNNER_MVIT2_... for
    /// `xcodebuild test`, which strips the prefix).
    public static func fromEnvironment(_ environment: [String: String],
                                       modelPaths: [String]) throws -> BenchmarkOptions {
        var options = BenchmarkOptions(modelPaths: modelPaths)
        if let units = environment["MVIT2_COMPUTE_UNITS"], !units.isEmpty {
            options.computeUnits = try units.split(separator: ",").map {
                try ComputeUnitsOption.parse($0.trimmingCharacters(in: .whitespaces))
            }
        }
        if let runs = environment["MVIT2_RUNS"] {
            options.runs = try positive(runs, flag: "MVIT2_RUNS", minimum: 1)
        }
        if let warmup = environment["MVIT2_WARMUP"] {
            options.warmup = try positive(warmup, flag: "MVIT2_WARMUP", minimum: 0)
        }
        options.deviceName = environment["MVIT2_DEVICE_NAME"]
        return options
    }

    private static func positive(_ text: String, flag: String, minimum: Int) throws -> Int {
        guard let number = Int(text), number >= minimum else {
            throw BenchError.invalid("\(flag) must be an integer >= \(minimum). Received: \(text)")
        }
        return number
    }
}
