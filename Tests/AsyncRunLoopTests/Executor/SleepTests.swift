import Glibc
import Testing

@testable import AsyncRunLoop

/// How a loop sleeps (SPEC §6 steps 6–8): in `epoll_wait` when it watches descriptors or a timer,
/// on a futex word when only another thread can wake it; a change made by a beforeWaiting
/// callout is watched in the very sleep that follows it. Runs have no time limit (a limit arms
/// the timerfd, which makes the loop sleep in epoll); a watchdog thread ends a run that sleeps
/// through what should have woken it.
@Suite("Sleep: futex and epoll sleeps, and what beforeWaiting changes")
struct SleepTests {
  /// A guard far beyond anything these runs wait for; reaching it means a lost wake-up.
  static let guardLimit = Duration.seconds(20)

  /// Runs `loop` (the calling thread's) in the default mode with no time limit until the test
  /// stops it or the mode empties. Returns nil when the watchdog had to stop it after
  /// `guardLimit` (a lost wake-up).
  static func runWatched(_ loop: RunLoopThread) -> RunLoopRunResult? {
    let finished = Locked(false)
    let watchdogFired = Locked(false)
    let watchdog = EngineTestThread.start {
      let start = LoopClock.Instant.now
      while !finished.withLock({ $0 }) {
        if start.duration(to: .now) > guardLimit {
          watchdogFired.withLock { $0 = true }
          loop.stop()
          return
        }
        usleep(5_000)
      }
    }
    let result = loop.run(mode: .default)
    finished.withLock { $0 = true }
    watchdog.join()
    return watchdogFired.withLock { $0 } ? nil : result
  }

  /// An input source that is never signalled: it keeps the mode alive without a descriptor or a
  /// timer, so the loop sleeps on its futex.
  static func keepAlive() -> InputSource { InputSource { _ in } }

  @Test func aTimerAddedByABeforeWaitingCalloutWakesTheSleepThatFollows() {
    let result = EngineTestThread.run { () -> RunLoopRunResult? in
      let loop = RunLoopThread.current
      let keeper = Self.keepAlive()
      loop.add(keeper, to: .default)
      let observer = LoopObserver(activities: .beforeWaiting, repeats: false) { _, _ in
        RunLoopThread.current.add(LoopTimer(after: .milliseconds(5)) { _ in RunLoopThread.current.stop() })
      }
      loop.add(observer, to: .default)
      defer { keeper.invalidate() }
      return Self.runWatched(loop)
    }
    #expect(result == .stopped)
  }

  @Test func aDescriptorAddedByABeforeWaitingCalloutWakesTheSleepThatFollows() throws {
    let (readEnd, writeEnd) = makePipe()
    defer {
      close(readEnd)
      close(writeEnd)
    }
    writeByte(writeEnd)  // readable before the loop sleeps
    let result = EngineTestThread.run { () -> RunLoopRunResult? in
      let loop = RunLoopThread.current
      let keeper = Self.keepAlive()
      loop.add(keeper, to: .default)
      let readable = DescriptorSource(descriptor: readEnd, interest: .readable) { source, _ in
        drainDescriptor(readEnd)
        source.invalidate()
        RunLoopThread.current.stop()
      }
      let observer = LoopObserver(activities: .beforeWaiting, repeats: false) { _, _ in
        try? RunLoopThread.current.add(readable, to: .default)
      }
      loop.add(observer, to: .default)
      defer { keeper.invalidate() }
      return Self.runWatched(loop)
    }
    #expect(result == .stopped)
  }

  @Test func aLoopWhoseCalloutRemovedItsOnlyTimerIsStillWokenByOtherThreads() {
    // The loop announces an epoll sleep (its timer is armed), then the beforeWaiting callout
    // removes the timer: it must not sleep on the futex while producers write the eventfd.
    let result = EngineTestThread.run { () -> RunLoopRunResult? in
      let loop = RunLoopThread.current
      let keeper = Self.keepAlive()
      loop.add(keeper, to: .default)
      let timer = LoopTimer(after: .seconds(3_600)) { _ in }
      loop.add(timer, to: .default)
      let producer = Locked<EngineTestThread?>(nil)
      let observer = LoopObserver(activities: .beforeWaiting, repeats: false) { _, _ in
        timer.invalidate()
        let thread = EngineTestThread.start {
          usleep(20_000)  // the loop is asleep by then (if it is not, the test proves less, not wrong)
          loop.perform { RunLoopThread.current.stop() }
        }
        producer.withLock { $0 = thread }
      }
      loop.add(observer, to: .default)
      let result = Self.runWatched(loop)
      producer.withLock { $0 }?.join()
      keeper.invalidate()
      return result
    }
    #expect(result == .stopped)
  }

  /// Runs a loop thread whose default mode holds only a never-signalled source (futex sleep), or
  /// also an idle descriptor (epoll sleep), and whose "modal" mode holds another such source, with
  /// `callout` as a one-shot beforeWaiting observer (on the loop thread, given the loop).
  /// `afterRun` runs on the loop thread once the run has ended. Returns `runWatched`'s result.
  static func runWithOneBeforeWaitingCallout(
    watchingADescriptor: Bool, _ callout: @escaping @Sendable (RunLoopThread) -> Void,
    afterRun: @escaping @Sendable () -> Void = {}
  ) -> RunLoopRunResult? {
    let (readEnd, writeEnd) = makePipe()
    defer {
      close(readEnd)
      close(writeEnd)
    }
    return EngineTestThread.run { () -> RunLoopRunResult? in
      let loop = RunLoopThread.current
      let keepers = [Self.keepAlive(), Self.keepAlive()]
      loop.add(keepers[0], to: .default)
      loop.add(keepers[1], to: "modal")
      let idle = DescriptorSource(descriptor: readEnd, interest: .readable) { _, _ in }  // never written
      if watchingADescriptor { try? loop.add(idle, to: .default) }
      loop.add(LoopObserver(activities: .beforeWaiting, repeats: false) { _, _ in callout(loop) }, to: .default)
      let result = Self.runWatched(loop)
      afterRun()
      for source in keepers { source.invalidate() }
      idle.invalidate()
      return result
    }
  }

  /// A beforeWaiting callout that runs the loop nested (the nested pass marks the loop awake in
  /// the inbox) must not leave the outer sleep deaf to producers; futex sleep, then epoll sleep.
  @Test(arguments: [false, true])
  func aNestedRunInABeforeWaitingCalloutLeavesTheSleepWakeable(watchingADescriptor: Bool) {
    let producer = Locked<EngineTestThread?>(nil)
    let result = Self.runWithOneBeforeWaitingCallout(watchingADescriptor: watchingADescriptor) { loop in
      _ = loop.run(mode: "modal", until: .now)  // one pass that polls
      let thread = EngineTestThread.start {
        usleep(20_000)  // the outer run is asleep by then
        loop.perform { RunLoopThread.current.stop() }
      }
      producer.withLock { $0 = thread }
    } afterRun: {
      producer.withLock { $0 }?.join()  // the loop thread started it
    }
    #expect(result == .stopped)
  }

  /// A beforeWaiting callout sends a block for this mode and runs the loop nested in another
  /// mode, which collects the block but cannot run it: the outer run must not sleep over it.
  @Test(arguments: [false, true])
  func aBlockANestedRunCollectedDuringBeforeWaitingStillRuns(watchingADescriptor: Bool) {
    let result = Self.runWithOneBeforeWaitingCallout(watchingADescriptor: watchingADescriptor) { loop in
      loop.perform(inModes: [.default]) { RunLoopThread.current.stop() }
      _ = loop.run(mode: "modal", until: .now)
    }
    #expect(result == .stopped)
  }

  @Test func aSignalANestedRunDeferredDuringBeforeWaitingStillFires() {
    let result = EngineTestThread.run { () -> RunLoopRunResult? in
      let loop = RunLoopThread.current
      let source = InputSource { _ in RunLoopThread.current.stop() }
      loop.add(source, to: .default)
      let modalKeeper = Self.keepAlive()
      loop.add(modalKeeper, to: "modal")
      let observer = LoopObserver(activities: .beforeWaiting, repeats: false) { _, _ in
        source.signal()  // only in .default: the nested run defers it
        _ = RunLoopThread.current.run(mode: "modal", until: .now)
      }
      loop.add(observer, to: .default)
      let result = Self.runWatched(loop)
      source.invalidate()
      modalKeeper.invalidate()
      return result
    }
    #expect(result == .stopped)
  }

  @Test func aBeforeWaitingCalloutThatEmptiesTheModeEndsTheRunAsFinished() {
    let result = EngineTestThread.run { () -> RunLoopRunResult? in
      let loop = RunLoopThread.current
      let onlyMember = Self.keepAlive()
      loop.add(onlyMember, to: .default)
      let observer = LoopObserver(activities: .beforeWaiting, repeats: false) { _, _ in onlyMember.invalidate() }
      loop.add(observer, to: .default)
      return Self.runWatched(loop)
    }
    #expect(result == .finished)
  }

  @Test func aDescriptorAddedFromAnotherThreadWhileTheLoopSleepsOnTheFutexIsWatched() throws {
    let loop = try RunLoopThread(name: "futex-to-epoll")
    defer { loop.shutdownAndWait() }
    let (readEnd, writeEnd) = makePipe()
    defer {
      close(readEnd)
      close(writeEnd)
    }
    // An executor-only loop watches nothing: it sleeps on its futex.
    let asleep = Locked(false)
    let watcher = LoopObserver(activities: [.beforeWaiting, .afterWaiting]) { _, activity in
      asleep.withLock { $0 = activity == .beforeWaiting }
    }
    loop.add(watcher, to: .default)
    loop.wakeUp()
    #expect(waitUntil("the loop to sleep") { asleep.withLock { $0 } })
    let fired = Locked(0)
    let source = DescriptorSource(descriptor: readEnd, interest: .readable) { _, _ in
      drainDescriptor(readEnd)
      fired.withLock { $0 += 1 }
    }
    try loop.add(source, to: .default)  // wakes the futex sleep; the next sleep is in epoll
    // Only the descriptor can wake the loop now: the write must reach it through epoll.
    #expect(waitUntil("the loop to sleep again") { asleep.withLock { $0 } })
    writeByte(writeEnd)
    #expect(waitUntil("the readable descriptor to fire") { fired.withLock { $0 } == 1 })
    source.invalidate()
    watcher.invalidate()
  }
}
