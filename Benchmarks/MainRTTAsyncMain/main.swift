@_spi(ExperimentalCustomExecutors) import AsyncRunLoop
import Dispatch
import Glibc

// main-rtt's factory route, as its own program (the executor factory is a per-program choice):
// an `async` main on AsyncRunLoopExecutorFactory, so the main actor runs on the main loop on the
// main thread. The benchmark launches it and drives it through stdin/stdout: for each line "N"
// a plain thread takes N round trips — start a task that awaits `MainActor.run { value }` and
// wait for it, the shape of the Foundation peer — and writes the N samples (µs) on one line.

@main
struct MainRTTAsyncMain {
  typealias DefaultExecutorFactory = AsyncRunLoopExecutorFactory

  static func main() async {
    let measurer = pthreadStart { serveRequests() }
    withExtendedLifetime(measurer) {}
    await runMainLoop()  // stopMainLoop() at end of input
  }
}

/// The measuring thread: reads "N" lines from stdin until EOF, answers each with N samples.
func serveRequests() {
  while let line = readLine(strippingNewline: true), let count = Int(line) {
    var total = 0
    var samples: [String] = []
    samples.reserveCapacity(count)
    for _ in 0..<count {
      let start = monotonicNanoseconds()
      total &+= blockingAwait { await MainActor.run { 1 } }
      samples.append(String(Double(monotonicNanoseconds() - start) / 1000))
    }
    writeLine(samples.joined(separator: " "))
    withExtendedLifetime(total) {}
  }
  stopMainLoop()
}

/// Writes `line` and a newline to stdout, unbuffered (the benchmark waits for it).
func writeLine(_ line: String) {
  var bytes = Array((line + "\n").utf8)
  var offset = 0
  while offset < bytes.count {
    let written = bytes.withUnsafeMutableBytes { write(1, $0.baseAddress! + offset, $0.count - offset) }
    if written <= 0 { return }
    offset += written
  }
}

func monotonicNanoseconds() -> Int64 {
  var spec = timespec()
  clock_gettime(CLOCK_MONOTONIC, &spec)
  return Int64(spec.tv_sec) * 1_000_000_000 + Int64(spec.tv_nsec)
}

/// Starts a task running `body` and blocks the calling thread until it returns.
func blockingAwait<Value: Sendable>(_ body: @escaping @Sendable () async -> Value) -> Value {
  let result = ResultSlot<Value>()
  Task.detached { result.put(await body()) }
  return result.take()
}

/// A value handed from a task to a blocked thread.
final class ResultSlot<Value: Sendable>: @unchecked Sendable {
  // Safety: `value` is written once by the task before `ready.signal()` and read by the waiting
  // thread after `ready.wait()`; the semaphore orders the two.
  private var value: Value?
  private let ready = DispatchSemaphore(value: 0)

  func put(_ value: Value) {
    self.value = value
    ready.signal()
  }

  func take() -> Value {
    ready.wait()
    return value!
  }
}

/// Starts a plain POSIX thread running `body`.
func pthreadStart(_ body: @escaping @Sendable () -> Void) -> pthread_t {
  final class Box: Sendable {
    let body: @Sendable () -> Void
    init(_ body: @escaping @Sendable () -> Void) { self.body = body }
  }
  var thread = pthread_t()
  let box = Unmanaged.passRetained(Box(body)).toOpaque()
  let rc = pthread_create(
    &thread, nil,
    { raw in
      Unmanaged<Box>.fromOpaque(raw!).takeRetainedValue().body()
      return nil
    }, box)
  precondition(rc == 0, "pthread_create failed: \(rc)")
  return thread
}
