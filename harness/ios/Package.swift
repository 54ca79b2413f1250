// swift-tools-version:5.9
// Core ML benchmark harness of keras_mvit2: a command-line tool for Macs and an XCTest
// target for iPhones, both writing keras_mvit2.bench/1 records (harness/README.md).
import PackageDescription

let package = Package(
    name: "MViT2Bench",
    platforms: [.macOS(.v13), .iOS(.v16)],
    products: [
        .library(name: "MViT2Bench", targets: ["MViT2Bench"]),
        .executable(name: "mvit2-coreml-bench", targets: ["mvit2-coreml-bench"]),
    ],
    targets: [
        .target(name: "MViT2Bench"),
        .executableTarget(name: "mvit2-coreml-bench", dependencies: ["MViT2Bench"]),
        // Records, statistics and options: no Core ML needed (runs with `swift test`).
        .testTarget(
            name: "MViT2BenchTests", dependencies: ["MViT2Bench"],
            resources: [.copy("Fixtures")]),
        // The on-device benchmark: put .mlpackage files into its Models folder.
        .testTarget(
            name: "MViT2DeviceBenchmarks", dependencies: ["MViT2Bench"],
            resources: [.copy("Models")]),
    ]
)
