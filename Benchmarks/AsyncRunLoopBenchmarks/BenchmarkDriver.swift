import Glibc

/// Runs the selected scenarios on the calling (background) thread and writes the reports.
enum BenchmarkDriver {
  /// Returns the process exit code.
  static func run(options: Options, mainDriver: MainThreadDriver) -> Int32 {
    let pin = PinPlan(options.pin, cpus: onlineCPUs)
    let context = BenchmarkContext(options: options, pin: pin, mainDriver: mainDriver)
    // The measuring thread is the client side of the round-trip scenarios.
    pinCurrentThread(pin.clientCPU)
    let loadBefore = loadAverage()
    print(
      "AsyncRunLoopBenchmarks — mode \(options.mode.rawValue), pin \(pin.name), \(onlineCPUs) CPUs, "
        + "\(options.mode.repetitions) interleaved repetitions; latency in µs, medians over repetitions")
    print("load average (1 min) at start: \(loadBefore.map { formatFixed($0, decimals: 2) } ?? "?")")
    #if DEBUG
      print("warning: debug build; the numbers mean nothing (build with -c release)")
    #endif
    if let loadBefore, loadBefore > 0.5 * Double(onlineCPUs) {
      print("warning: other processes are using the CPUs; latency figures will be noisy")
    }
    let started = monotonicNanoseconds()
    let results = Scenario.runSelected(context)
    let seconds = Double(monotonicNanoseconds() - started) / 1e9
    let loadAfter = loadAverage()
    let verdicts = TargetReport.evaluate(results)
    print(options.details ? TargetReport.render(verdicts) : TargetReport.summary(results, verdicts))
    print(
      "total time: \(String(format1: seconds)) s; load average (1 min) at the end: "
        + "\(loadAfter.map { formatFixed($0, decimals: 2) } ?? "?")")
    if let path = options.jsonPath {
      let json = JSONReport.render(
        results, targets: verdicts, mode: options.mode, pin: pin.name, cpus: onlineCPUs,
        load: (loadBefore, loadAfter))
      guard writeFile(path, json) else { return 1 }
      progress("wrote \(path)")
    }
    if let path = options.plotPath {
      guard writeFile(path, CDFPlot.render(results, mode: options.mode, pin: pin.name)) else { return 1 }
      progress("wrote \(path)")
      if let scaling = ScalingPlot.render(results, mode: options.mode, pin: pin.name) {
        guard writeFile(ScalingPlot.path(nextTo: path), scaling) else { return 1 }
        progress("wrote \(ScalingPlot.path(nextTo: path))")
      }
    }
    return options.check && TargetReport.missedCount(verdicts) > 0 ? 1 : 0
  }

  private static func writeFile(_ path: String, _ contents: String) -> Bool {
    guard let file = fopen(path, "w") else {
      writeStandardError("AsyncRunLoopBenchmarks: cannot write \(path): \(String(cString: strerror(errno)))\n")
      return false
    }
    defer { fclose(file) }
    return fputs(contents, file) >= 0
  }
}
