import Glibc
import Testing

@testable import AsyncRunLoop

/// Whether `descriptor` is readable within `milliseconds` (0: now, without waiting).
private func isReadable(_ descriptor: Int32, within milliseconds: Int32) -> Bool {
  var entry = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
  return poll(&entry, 1, milliseconds) == 1 && entry.revents & Int16(POLLIN) != 0
}

/// Generous: how long a test waits for the descriptor to become readable after work was sent.
private var readableWithin: Int32 { Int32(20_000 * watchdogScale) }

/// What one hosting step saw: whether the host had to wait, whether the descriptor was readable
/// before the work was sent (it must not be), and whether it became readable after.
private struct HostStep: Equatable {
  var waitedBefore = false
  var readableBeforeWork = true
  var readableAfterWork = false
}

/// On a thread of its own whose `RunLoopThread.current` loop is embedded (as a host would):
/// `setUp` adds members, then the host prepares to wait, `send` sends work from another thread,
/// and the host polls the descriptor and makes one pass. Returns the step and what `result`
/// reads after the pass.
private func hostOneStep<T: Sendable>(
  setUp: @escaping @Sendable (RunLoopThread) throws -> Void = { _ in },
  send: @escaping @Sendable (RunLoopThread) -> Void,
  result: @escaping @Sendable () -> T
) throws -> (HostStep, T, RunLoopRunResult)? {
  try withWatchdogSync("hosting an embedded loop") {
    let loop = RunLoopThread.current
    loop.beginEmbedding()
    defer { loop.endEmbedding() }
    try setUp(loop)
    loop.runEmbeddedPass()  // applies what setUp sent (an add is applied in place anyway)
    var step = HostStep()
    if case .wait = loop.prepareForHostWait() { step.waitedBefore = true }
    step.readableBeforeWork = isReadable(loop.embeddingDescriptor, within: 0)
    let sender = startThread { send(loop) }
    step.readableAfterWork = isReadable(loop.embeddingDescriptor, within: readableWithin)
    joinThread(sender)
    let ran = loop.runEmbeddedPass()
    return (step, result(), ran)
  }
}

private let expectedStep = HostStep(waitedBefore: true, readableBeforeWork: false, readableAfterWork: true)

/// A host loop (a foreign event loop on the loop's thread) sees every kind of work through one
/// descriptor, and a non-blocking pass runs it.
@Suite struct EmbeddedLoopTests {
  @Test func signalledSourceMakesTheDescriptorReadableAndAPassFiresIt() throws {
    let fired = Guarded(0)
    let source = InputSource { _ in fired.withLock { $0 += 1 } }
    let outcome = try hostOneStep(setUp: { $0.add(source) }, send: { _ in source.signal() }, result: { fired.snapshot })
    #expect(outcome?.0 == expectedStep)
    #expect(outcome?.1 == 1)
    source.invalidate()
  }

  @Test func performFromAnotherThreadMakesTheDescriptorReadable() throws {
    let ran = Guarded(0)
    let keepAlive = InputSource { _ in }
    let outcome = try hostOneStep(
      setUp: { $0.add(keepAlive) },
      send: { loop in _ = loop.perform(inModes: [.default]) { ran.withLock { $0 += 1 } } },
      result: { ran.snapshot })
    #expect(outcome?.0 == expectedStep)
    #expect(outcome?.1 == 1)
    keepAlive.invalidate()
  }

  @Test func executorJobMakesTheDescriptorReadable() throws {
    let ran = Guarded<[Bool]>([])
    let outcome = try hostOneStep(
      send: { loop in
        // A task that prefers the loop: its first job runs in the loop's pass.
        Task(executorPreference: loop) { ran.withLock { $0.append(loop.isOnLoopThread) } }
      },
      result: { ran.snapshot })
    #expect(outcome?.0 == expectedStep)
    #expect(outcome?.1 == [true])
  }

  @Test func wakeUpAndStopMakeTheDescriptorReadable() throws {
    // (A source per step: each step's thread drains its loop when it exits, detaching it.)
    let woken = try hostOneStep(setUp: { $0.add(InputSource { _ in }) }, send: { $0.wakeUp() }, result: { 0 })
    #expect(woken?.0 == expectedStep)
    #expect(woken?.2 == .timedOut)  // an ordinary pass
    let stopped = try hostOneStep(setUp: { $0.add(InputSource { _ in }) }, send: { $0.stop() }, result: { 0 })
    #expect(stopped?.0 == expectedStep)
    #expect(stopped?.2 == .stopped)
  }

  @Test func readyDescriptorMakesTheDescriptorReadable() throws {
    var ends: [Int32] = [0, 0]
    #expect(pipe(&ends) == 0)
    let (readEnd, writeEnd) = (ends[0], ends[1])
    defer {
      close(readEnd)
      close(writeEnd)
    }
    let handled = Guarded(0)
    let source = DescriptorSource(descriptor: readEnd) { _, _ in
      var byte: UInt8 = 0
      _ = read(readEnd, &byte, 1)
      handled.withLock { $0 += 1 }
    }
    let outcome = try hostOneStep(
      setUp: { try $0.add(source) },
      send: { _ in
        var byte: UInt8 = 7
        _ = write(writeEnd, &byte, 1)
      }, result: { handled.snapshot })
    #expect(outcome?.0 == expectedStep)
    #expect(outcome?.1 == 1)
    source.invalidate()
  }

  @Test func deadlineIsTheTimersFireDateAndTheDescriptorBecomesReadableThen() throws {
    let fired = Guarded(0)
    let fireDate = LoopClock.Instant.now.advanced(by: .milliseconds(50))
    let timer = LoopTimer(fireAt: fireDate) { _ in fired.withLock { $0 += 1 } }
    let outcome = try withWatchdogSync("hosting a timer") { () -> (Bool, Bool, Int, Int) in
      let loop = RunLoopThread.current
      loop.beginEmbedding()
      defer { loop.endEmbedding() }
      loop.add(timer)
      let wait = loop.prepareForHostWait()
      let deadlineMatches = wait == .wait(deadline: fireDate)
      // Readable by the timer's date with no other work: the timerfd is in the set.
      let readable = isReadable(loop.embeddingDescriptor, within: readableWithin)
      let firedBeforePass = fired.snapshot
      loop.runEmbeddedPass()
      return (deadlineMatches, readable, firedBeforePass, fired.snapshot)
    }
    #expect(outcome?.0 == true)
    #expect(outcome?.1 == true)
    #expect(outcome?.2 == 0)
    #expect(outcome?.3 == 1)
  }

  @Test func idleLoopWithAFarTimerIsNotReadable() throws {
    let timer = LoopTimer(after: .seconds(3600)) { _ in }
    let outcome = try withWatchdogSync("an idle embedded loop") { () -> (Bool, Bool) in
      let loop = RunLoopThread.current
      loop.beginEmbedding()
      defer { loop.endEmbedding() }
      loop.add(timer)
      loop.runEmbeddedPass()
      let waits = if case .wait(let deadline?) = loop.prepareForHostWait() { deadline == timer.fireDate } else { false }
      return (waits, isReadable(loop.embeddingDescriptor, within: 200))
    }
    #expect(outcome?.0 == true)
    #expect(outcome?.1 == false)
    timer.invalidate()
  }

  @Test func workSentBeforeTheHostPreparesIsAPassNowNotASleep() throws {
    let ran = Guarded(0)
    let outcome = try withWatchdogSync("work waiting before the wait") { () -> (Bool, Int) in
      let loop = RunLoopThread.current
      loop.beginEmbedding()
      defer { loop.endEmbedding() }
      let keepAlive = InputSource { _ in }
      loop.add(keepAlive)
      loop.runEmbeddedPass()
      joinThread(startThread { _ = loop.perform(inModes: [.default]) { ran.withLock { $0 += 1 } } })
      let passNow = loop.prepareForHostWait() == .passNow
      loop.runEmbeddedPass()
      keepAlive.invalidate()
      return (passNow, ran.snapshot)
    }
    #expect(outcome?.0 == true)
    #expect(outcome?.1 == 1)
  }

  @Test func shutdownWakesTheHostAndEndsHosting() throws {
    let outcome = try withWatchdogSync("shutting down an embedded loop") {
      () -> (Bool, RunLoopRunResult, RunLoopThread.EmbeddedWait) in
      let loop = RunLoopThread.current
      loop.beginEmbedding()
      defer { loop.endEmbedding() }
      let keepAlive = InputSource { _ in }
      loop.add(keepAlive)
      loop.runEmbeddedPass()
      _ = loop.prepareForHostWait()
      joinThread(startThread { loop.shutdown() })
      let readable = isReadable(loop.embeddingDescriptor, within: readableWithin)
      let pass = loop.runEmbeddedPass()
      return (readable, pass, loop.prepareForHostWait())
    }
    #expect(outcome?.0 == true)
    #expect(outcome?.1 == .stopped)
    #expect(outcome?.2 == .shutDown)
  }

  @Test func aPassFromInsideACalloutIsANestedRunThatServesTheLoop() throws {
    let order = Guarded<[String]>([])
    let outcome = try withWatchdogSync("a pass nested in a callout") { () -> [String] in
      let loop = RunLoopThread.current
      loop.beginEmbedding()
      defer { loop.endEmbedding() }
      let inner = InputSource { _ in order.withLock { $0.append("inner") } }
      let outer = InputSource { _ in
        order.withLock { $0.append("outer-begins") }
        inner.signal()
        // A host callback running inside this handler makes a pass: a nested run.
        loop.runEmbeddedPass()
        order.withLock { $0.append("outer-ends") }
      }
      loop.add(inner)
      loop.add(outer)
      outer.signal()
      loop.runEmbeddedPass()
      inner.invalidate()
      outer.invalidate()
      return order.snapshot
    }
    #expect(outcome == ["outer-begins", "inner", "outer-ends"])
  }
}
