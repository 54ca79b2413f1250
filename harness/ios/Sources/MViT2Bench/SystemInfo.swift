import Foundation

#if canImport(Darwin)
import Darwin
#endif

/// Device name, OS and memory of the running process.
public enum SystemInfo {
    /// A string `sysctlbyname` value, e.g. "hw.machine" ("iPhone15,2" on an iPhone) or
    /// "machdep.cpu.brand_string" ("Apple M2" on a Mac); nil where it does not exist.
    public static func sysctlString(_ name: String) -> String? {
        #if canImport(Darwin)
        var size = 0
        guard sysctlbyname(name, nil, &size, nil, 0) == 0, size > 0 else { return nil }
        var buffer = [CChar](repeating: 0, count: size)
        guard sysctlbyname(name, &buffer, &size, nil, 0) == 0 else { return nil }
        return buffer.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
        #else
        return nil
        #endif
    }

    /// `uname().machine`: the model identifier on iOS ("iPhone15,2"), the CPU
    /// architecture on macOS and Linux ("arm64", "x86_64").
    public static func machine() -> String {
        var info = utsname()
        _ = uname(&info)
        return withUnsafePointer(to: info.machine) {
            $0.withMemoryRebound(to: CChar.self, capacity: MemoryLayout.size(ofValue: info.machine)) {
                String(cString: $0)
            }
        }
    }

    /// The record's `device`: iOS reports the model identifier (pass `name` for a
    /// readable one such as "iPhone 14 Pro"), macOS the Mac model and CPU brand.
    public static func device(name: String? = nil) -> DeviceInfo {
        let version = ProcessInfo.processInfo.operatingSystemVersion
        let release = "\(version.majorVersion).\(version.minorVersion).\(version.patchVersion)"
        #if os(iOS)
        let identifier = machine()
        return DeviceInfo(name: name ?? identifier, platform: "ios", machine: identifier,
                          os: "iOS \(release)", cpu: identifier)
        #elseif os(macOS)
        let model = sysctlString("hw.model") ?? "Mac"
        return DeviceInfo(name: name ?? model, platform: "macos", machine: machine(),
                          os: "macOS \(release)",
                          cpu: sysctlString("machdep.cpu.brand_string") ?? machine())
        #else
        return DeviceInfo(name: name ?? "unknown", platform: "other", machine: machine(),
                          os: ProcessInfo.processInfo.operatingSystemVersionString,
                          cpu: machine())
        #endif
    }

    /// Resident memory of this process in bytes, now and at its peak
    /// (`task_info(MACH_TASK_BASIC_INFO)`: `resident_size`, `resident_size_max`).
    public static func residentMemory() -> (current: UInt64, peak: UInt64)? {
        #if canImport(Darwin)
        var info = mach_task_basic_info()
        var count = mach_msg_type_number_t(
            MemoryLayout<mach_task_basic_info>.size / MemoryLayout<natural_t>.size)
        let status = withUnsafeMutablePointer(to: &info) {
            $0.withMemoryRebound(to: integer_t.self, capacity: Int(count)) {
                task_info(mach_task_self_, task_flavor_t(MACH_TASK_BASIC_INFO), $0, &count)
            }
        }
        guard status == KERN_SUCCESS else { return nil }
        return (UInt64(info.resident_size), UInt64(info.resident_size_max))
        #else
        return nil
        #endif
    }

    /// Size of a file or of a folder's files (an .mlpackage is a folder).
    public static func diskSize(of url: URL) -> Int {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: url.path, isDirectory: &isDirectory) else {
            return 0
        }
        if !isDirectory.boolValue {
            let attributes = try? FileManager.default.attributesOfItem(atPath: url.path)
            return (attributes?[.size] as? NSNumber)?.intValue ?? 0
        }
        var total = 0
        let keys: [URLResourceKey] = [.fileSizeKey, .isRegularFileKey]
        if let files = FileManager.default.enumerator(at: url, includingPropertiesForKeys: keys) {
            for case let file as URL in files {
                let values = try? file.resourceValues(forKeys: Set(keys))
                if values?.isRegularFile == true { total += values?.fileSize ?? 0 }
            }
        }
        return total
    }
}

extension Duration {
    /// The duration in milliseconds.
    public var milliseconds: Double {
        let parts = components
        return Double(parts.seconds) * 1_000 + Double(parts.attoseconds) / 1e15
    }
}
