import Glibc
import Testing

@testable import AsyncRunLoop

// A readiness add that is refused throws, and leaves the source valid for a retry, on every
// thread (review round 23 found the loop-thread add invalidating it; written by its reviewer).

@Suite("Refused descriptor adds", .timeLimit(.minutes(10)))
struct RefusedDescriptorAddTests {}

/// What a refused readiness add and its retry did (`refusedAddAndRetry`).
private struct RefusedAddOutcome: Sendable {
  var firstError: String
  var validAfterRefusal: Bool
  var retryError: String
  var fired: Bool
}

/// A source on a regular file is added (from this thread, or on the loop thread): refused with
/// `EPERM`. Then its number is made to name a pipe (dup2) and the same source is added again the
/// same way, and the pipe is written.
private func refusedAddAndRetry(onLoopThread: Bool) throws -> RefusedAddOutcome {
  let loop = try RunLoopThread(name: "refused-retry")
  defer { loop.shutdownAndWait() }
  var template = Array("/tmp/refused-retry-XXXXXX".utf8CString)
  let number = template.withUnsafeMutableBufferPointer { mkstemp($0.baseAddress!) }
  precondition(number >= 0, "mkstemp failed: \(errno)")
  template.withUnsafeBufferPointer { _ = unlink($0.baseAddress!) }
  let pipe = makePipe()
  defer {
    for descriptor in [number, pipe.read, pipe.write] { close(descriptor) }
  }
  let fired = AtomicCounter()
  let source = DescriptorSource(descriptor: number) { _, _ in
    fired.increment()
    _ = drainDescriptor(number)
  }
  let attempt: @Sendable () -> String = {
    do {
      try loop.add(source, to: .default)
      return "accepted"
    } catch let error as SystemCallError {
      return error.errno == EPERM ? "EPERM" : "\(error)"
    } catch {
      return "\(error)"
    }
  }
  let firstError = onLoopThread ? try loop.performAndWait(attempt) : attempt()
  try loop.performAndWait {}
  let valid = source.isValid
  precondition(dup2(pipe.read, number) == number)  // the number names a pipe now
  let retryError = onLoopThread ? try loop.performAndWait(attempt) : attempt()
  writeByte(pipe.write)
  // (A round trip per millisecond for a while: no timing is asserted, only whether it fired.)
  var didFire = false
  for _ in 0..<(500 * watchdogScale) where !didFire {
    try loop.performAndWait {}
    didFire = fired.current > 0
    if !didFire { usleep(1_000) }
  }
  source.invalidate()
  try loop.performAndWait {}
  return RefusedAddOutcome(firstError: firstError, validAfterRefusal: valid, retryError: retryError, fired: didFire)
}

extension RefusedDescriptorAddTests {
  /// `RunLoopThread.add(_:to:)` for a readiness source: "Throws `SystemCallError` with ... `EPERM`
  /// when it cannot be polled (a regular file or directory) ... From other threads, a failure that
  /// only epoll can detect invalidates the source" — a thrown error is the whole answer (only the
  /// failure reported later, as `[.error]`, invalidates), and `DescriptorSource.isValid`: "False
  /// once `invalidate()` was called". From another thread: a source on a regular file is refused
  /// with `EPERM` and stays valid; once its number names a pipe (dup2) the same source is added
  /// again, accepted, and the pipe's data reaches its handler.
  @Test func aRefusedAddFromAnotherThreadLeavesTheSourceValidForARetry() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "refused add") {
      try refusedAddAndRetry(onLoopThread: false)
    }
    #expect(outcome?.firstError == "EPERM")
    #expect(outcome?.validAfterRefusal == true, "a refused add invalidated the source")
    #expect(outcome?.retryError == "accepted")
    #expect(outcome?.fired == true, "the retried add was dropped: the source never fired")
  }

  /// The same promises on the loop thread (the add doc: "Throws `SystemCallError` with ... `EPERM`
  /// ... or what epoll reports when called on the loop thread"; only a failure reported later to
  /// the handler invalidates; `isValid`: "False once `invalidate()` was called"). The same calls as
  /// above, each made on the loop thread (in `performAndWait`). (It found that the refused add
  /// invalidated the source, so that the retry once the number names a pipe was silently ignored.)
  @Test func aRefusedAddOnTheLoopThreadLeavesTheSourceValidForARetry() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "refused add on the loop thread") {
      try refusedAddAndRetry(onLoopThread: true)
    }
    #expect(outcome?.firstError == "EPERM")
    #expect(outcome?.validAfterRefusal == true, "a refused add invalidated the source")
    #expect(outcome?.retryError == "accepted")
    #expect(outcome?.fired == true, "the retried add was dropped: the source never fired")
  }
}

// MARK: - Leaks
