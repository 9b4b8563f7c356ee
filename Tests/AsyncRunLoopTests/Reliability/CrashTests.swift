import Glibc
import Testing

@testable import AsyncRunLoop

/// Preconditions that must trap with a clear message (exit tests: each body runs in a child
/// process). Not run under ThreadSanitizer.
@Suite("Crash: preconditions trap with a clear message")
struct CrashTests {
  @Test func assumeIsolatedOffTheLoopTraps() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let loop = try RunLoopThread(name: "crash-assume")
      let probe = ExecProbe(loop: loop)
      probe.touchWithoutChecking()  // assumeIsolated on the test's thread: traps
    }
    // The loop's own message (its executor role answers "unknown", so the runtime asks
    // `checkIsolated`, which names the loop and the thread).
    expectStandardError(of: result, mentions: "expected to run on loop 'crash-assume', but running on thread")
  }

  @Test func checkIsolatedOffTheLoopTrapsNamingTheLoop() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let loop = try RunLoopThread(name: "crash-check")
      loop.checkIsolated()
    }
    expectStandardError(of: result, mentions: "expected to run on loop 'crash-check'")
  }

  @Test func checkIsolatedOnAnotherLoopsThreadTraps() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let loop = try RunLoopThread(name: "crash-mine")
      let other = try RunLoopThread(name: "crash-other")
      _ = try other.performAndWait { loop.checkIsolated() }
    }
    expectStandardError(of: result, mentions: "expected to run on loop 'crash-mine'")
  }

  @Test func runOnTheWrongThreadTrapsNamingTheLoop() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let loop = try RunLoopThread(name: "crash-run")
      loop.run(mode: .default, for: .milliseconds(1))
    }
    expectStandardError(of: result, mentions: "must be called on the thread of loop 'crash-run'")
  }

  @Test func runningTheCommonPseudoModeTraps() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let loop = try RunLoopThread(name: "crash-common")
      _ = try loop.performAndWait { loop.run(mode: .common, for: .milliseconds(1)) }
    }
    expectStandardError(of: result, mentions: ".common is a set of modes")
  }

  @Test func readingCommonModesOffTheLoopTraps() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let loop = try RunLoopThread(name: "crash-modes")
      _ = loop.commonModes
    }
    expectStandardError(of: result, mentions: "must be called on the thread of loop 'crash-modes'")
  }

  @Test func schedulingOneSourceOnTwoLoopsTraps() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let first = try RunLoopThread(name: "crash-two-a")
      let second = try RunLoopThread(name: "crash-two-b")
      let source = InputSource { _ in }
      first.add(source)
      _ = try first.performAndWait { 0 }
      _ = try second.performAndWait { second.add(source) }
    }
    expectStandardError(of: result, mentions: "is on one loop at a time")
  }

  @Test func schedulingOneDescriptorSourceOnTwoLoopsTraps() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let first = try RunLoopThread(name: "crash-fd-a")
      let second = try RunLoopThread(name: "crash-fd-b")
      let descriptors = makePipe()
      let source = DescriptorSource(descriptor: descriptors.read) { _, _ in }
      try first.add(source)
      _ = try first.performAndWait { 0 }
      _ = try second.performAndWait { try second.add(source) }
    }
    expectStandardError(of: result, mentions: "is on one loop at a time")
  }
}
