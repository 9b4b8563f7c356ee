import Glibc
import Testing

@testable import AsyncRunLoop

/// A readiness registration refused on the loop thread after an add from another thread is never a
/// bare `[.error]`: the source's (and the sequence's) `registrationError` says why, and an error
/// of the descriptor itself leaves it nil.
@Suite struct RefusedRegistrationReasonTests {
  @Test func aSecondSourceForADescriptorHearsErrorWithEEXISTAsTheReason() throws {
    let loop = try RunLoopThread(name: "refusal-source")
    defer { loop.shutdownAndWait() }
    let pipe = makePipe()
    defer {
      close(pipe.read)
      close(pipe.write)
    }
    let firstEvents = Guarded([DescriptorEvents]())
    let secondEvents = Guarded([String]())
    let first = DescriptorSource(descriptor: pipe.read) { _, events in firstEvents.withLock { $0.append(events) } }
    let second = DescriptorSource(descriptor: pipe.read) { source, events in
      let reason = source.registrationError.map { "errno \($0.errno)" } ?? "no reason"
      secondEvents.withLock { $0.append("\(events) \(reason)") }
    }
    try loop.add(first, to: .default)
    try loop.add(second, to: .default)  // from this thread: only the loop can see the clash
    try loop.performAndWait {}
    try loop.performAndWait {}
    #expect(secondEvents.withLock { $0 } == ["[error] errno \(EEXIST)"])
    #expect(second.registrationError?.errno == EEXIST)
    #expect(!second.isValid)
    #expect(first.registrationError == nil)
    #expect(first.isValid)
    #expect(firstEvents.withLock { $0 }.isEmpty)
    first.invalidate()
  }

  @Test func aSecondReadinessSequenceEndsAfterOneErrorAndSaysWhy() async throws {
    let loop = try RunLoopThread(name: "refusal-seq")
    defer { loop.shutdownAndWait() }
    let pipe = makePipe()
    defer {
      close(pipe.read)
      close(pipe.write)
    }
    let first = try loop.readiness(of: pipe.read)
    let second = try loop.readiness(of: pipe.read)  // from this thread: refused later, on the loop
    let elements = try await withWatchdog(timeout: .seconds(30), "the refused sequence") { () -> [DescriptorEvents] in
      var seen: [DescriptorEvents] = []
      for await events in second { seen.append(events) }
      return seen
    }
    #expect(elements == [.error])
    #expect(second.registrationError?.errno == EEXIST)
    #expect(first.registrationError == nil)
    first.invalidate()
  }
}
