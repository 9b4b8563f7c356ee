import Foundation
import Glibc

// hop-allocations counts every heap allocation (malloc, calloc, realloc, memalign, … from Swift,
// libdispatch and C code alike, on every thread) with glibc's own allocation tracer, mtrace(3).
// Since glibc 2.34 mtrace lives in libc_malloc_debug.so, which only takes effect when preloaded,
// so the count is taken in a child process of this executable started with
// `LD_PRELOAD=libc_malloc_debug.so.0 MALLOC_TRACE=<file>`; the child brackets the measured round
// trips with mtrace()/muntrace() and the parent counts the allocation records in the file.
//
// Two in-process alternatives were tried and rejected: defining `malloc` in Swift (the compiler
// reserves that symbol name: a warning, and warnings are errors here), and the runtime's
// `_swift_allocObject` hook (the Swift 6.3 Linux runtime faults once its swizzling path is on:
// `_swift_retain_adapterImpl` over-masks tagged pointers, swiftlang/swift#88924).

/// glibc's mtrace(3). Declared here because Glibc's module does not export <mcheck.h>. The
/// link-time reference is versioned (GLIBC_2.2.5), so at run time it binds to the preloaded
/// libc_malloc_debug's implementation (libc's own is a no-op stub).
@_silgen_name("mtrace") private func glibcMtrace()
@_silgen_name("muntrace") private func glibcMuntrace()

/// Allocation tracing for hop-allocations.
enum AllocationTrace {
  /// The preloadable library that implements mtrace.
  static let library = "libc_malloc_debug.so.0"
  /// The hidden option that makes this executable the tracing child.
  static let childFlag = "--hop-allocations-child"

  /// Starts tracing (a no-op unless libc_malloc_debug is preloaded and MALLOC_TRACE is set).
  static func start() { glibcMtrace() }
  /// Stops tracing and closes the trace file.
  static func stop() { glibcMuntrace() }

  /// Counts allocation records in an mtrace file: `+` (malloc, calloc, memalign) and `>`
  /// (the new block of a realloc).
  static func countAllocations(inTraceFile path: String) -> Int? {
    guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return nil }
    var count = 0
    for line in text.split(separator: "\n") {
      // "@ caller + 0xADDR 0xSIZE" or "+ 0xADDR 0xSIZE"; the marker is the first one-character
      // token after the optional "@ caller".
      let tokens = line.split(separator: " ", maxSplits: 3)
      let marker = tokens.first == "@" ? (tokens.count > 2 ? tokens[2] : "") : (tokens.first ?? "")
      if marker == "+" || marker == ">" { count += 1 }
    }
    return count
  }

  /// Runs `count` actor-rtt round trips in a tracing child process; returns allocations per round
  /// trip, or nil (with the reason) when tracing is not possible here.
  static func allocationsPerRoundTrip(count: Int, pin: String) -> Result<Double, TraceError> {
    let tracePath = "/tmp/asyncrunloop-bench-mtrace-\(getpid())-\(monotonicNanoseconds()).txt"
    defer { unlink(tracePath) }
    let child = Process()
    child.executableURL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
    child.arguments = [childFlag, String(count), "--pin", pin]
    var environment = ProcessInfo.processInfo.environment
    environment["LD_PRELOAD"] = library
    environment["MALLOC_TRACE"] = tracePath
    child.environment = environment
    do {
      try child.run()
    } catch {
      return .failure(TraceError(reason: "cannot start the tracing child: \(error)"))
    }
    child.waitUntilExit()
    guard child.terminationStatus == 0 else {
      return .failure(TraceError(reason: "tracing child exited with status \(child.terminationStatus)"))
    }
    guard let allocations = countAllocations(inTraceFile: tracePath) else {
      return .failure(TraceError(reason: "no mtrace output (is \(library) installed?)"))
    }
    return .success(Double(allocations) / Double(count))
  }

  struct TraceError: Error {
    let reason: String
  }

  /// The child's side: warm up, then trace `count` round trips. Returns the exit code.
  static func runChild(arguments: [String]) -> Int32 {
    guard arguments.count >= 2, let count = Int(arguments[1]) else { return 2 }
    let options = Options.parse(Array(arguments.dropFirst(2)))
    let session = AsyncRunLoopActorRTT(pin: PinPlan(options.pin, cpus: onlineCPUs))
    _ = session.measure(2_000)
    session.traceAllocations(count)
    session.close()
    return 0
  }
}
