import CAsyncRunLoop
import Glibc

/// Which CPUs a loop thread may be pinned to: `0 ..< CPU_SETSIZE`, and in the process's affinity
/// mask (`sched_getaffinity` of the process: what `taskset` or a cpuset allows). Any thread.
enum CPUAffinity {
  /// The CPUs in the process's affinity mask, lowest first.
  /// - Throws: `SystemCallError` when the mask cannot be read.
  static func allowedCPUs() throws(SystemCallError) -> [Int] {
    var cpus = [Int32](repeating: 0, count: Int(carl_cpu_set_size()))
    let count = carl_process_allowed_cpus(&cpus, Int32(cpus.count))
    guard count >= 0 else { throw SystemCallError(call: "sched_getaffinity", errno: -count) }
    return cpus.prefix(Int(count)).map(Int.init)
  }

  /// `cpu` as the kernel's CPU number, once it is known to be one the process may pin to.
  /// - Parameter loop: The loop's name, for the error.
  /// - Throws: `SystemCallError` with `EINVAL` (naming the loop, the CPU and the rule) for a CPU
  ///   outside `0 ..< CPU_SETSIZE` or outside the process's affinity mask.
  static func validatedCPU(_ cpu: Int, loop: String) throws(SystemCallError) -> Int32 {
    let setSize = Int(carl_cpu_set_size())
    let allowed = try allowedCPUs()
    guard cpu >= 0, cpu < setSize, allowed.contains(cpu) else {
      throw SystemCallError(
        call: "pinning loop '\(loop)' to cpu \(cpu)", errno: EINVAL,
        reason: "a loop's cpu must be in 0..<\(setSize) and in the process's affinity mask, which allows cpus "
          + describe(allowed))
    }
    return Int32(cpu)  // below CPU_SETSIZE (1024): fits
  }

  /// `[0, 1, 2, 5]` as `"0-2,5"`.
  static func describe(_ cpus: [Int]) -> String {
    var ranges: [String] = []
    var index = cpus.startIndex
    while index < cpus.endIndex {
      var end = index
      while end + 1 < cpus.endIndex, cpus[end + 1] == cpus[end] + 1 { end += 1 }
      ranges.append(end == index ? "\(cpus[index])" : "\(cpus[index])-\(cpus[end])")
      index = end + 1
    }
    return ranges.isEmpty ? "none" : ranges.joined(separator: ",")
  }
}
