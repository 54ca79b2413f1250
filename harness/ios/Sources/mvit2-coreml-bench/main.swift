// mvit2-coreml-bench: Core ML latency of .mlpackage models on a Mac (for an iPhone,
// run the MViT2DeviceBenchmarks tests on the device: see harness/README.md).
import Foundation
import MViT2Bench

func fail(_ message: String, status: Int32) -> Never {
    FileHandle.standardError.write(Data("error: \(message)\n".utf8))
    exit(status)
}

let options: BenchmarkOptions
do {
    options = try BenchmarkOptions.parse(Array(CommandLine.arguments.dropFirst()))
} catch {
    fail("\(error)", status: 2)
}
if options.showHelp {
    print(BenchmarkOptions.usage)
    exit(0)
}

#if canImport(CoreML)
var records: [BenchRecord] = []
do {
    for path in options.modelPaths {
        for units in options.computeUnits {
            let record = try await CoreMLBenchmark(options: options)
                .run(modelPath: path, computeUnits: units)
            records.append(record)
            print(try RecordIO.markerLine(record))
            let latency = record.latencyMs
            let summary = String(
                format: "%@ %@: median %.3f ms (min %.3f, p90 %.3f, max %.3f) over %ld runs",
                record.model.name, units.rawValue, latency.median, latency.min, latency.p90,
                latency.max, latency.runs)
            FileHandle.standardError.write(Data((summary + "\n").utf8))
        }
    }
    if let output = options.outputPath {
        try RecordIO.write(records, to: output)
        FileHandle.standardError.write(Data("wrote \(records.count) record(s) to \(output)\n".utf8))
    }
} catch {
    fail("\(error)", status: 1)
}
#else
fail("mvit2-coreml-bench needs Core ML (macOS 13 or later); on an iPhone run the "
    + "MViT2DeviceBenchmarks tests with xcodebuild (harness/README.md).", status: 2)
#endif
