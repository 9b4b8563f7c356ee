import Glibc
import Testing

@testable import AsyncRunLoop

/// A loop is released once the last thing that holds it lets go.
@Suite("A loop is released once the last thing that holds it lets go", .serialized, .timeLimit(.minutes(10)))
struct LoopReleaseTests {
  /// Two loops shut each other down (one of the calls only starts the shutdown); nobody else calls
  /// `shutdownAndWait`. Once the handles are dropped, both threads are gone: the one not joined
  /// by the refused call is joined or detached by its handle's release.
  @Test func aLoopWhoseShutdownAndWaitWasRefusedIsReapedWhenDropped() async throws {
    let gone = try await withWatchdogOnThread(timeout: .seconds(20), "reaped after a refused wait") { () -> Bool in
      let returned = AtomicCounter()
      do {
        let first = try RunLoopThread(name: "drop")
        let second = try RunLoopThread(name: "drop")
        let bothIn = AtomicCounter()
        for (loop, other) in [(first, second), (second, first)] {
          loop.perform {
            bothIn.increment()
            while bothIn.current < 2 { sched_yield() }
            other.shutdownAndWait()
            returned.increment()
          }
        }
        waitUntil(timeout: .seconds(10), "both calls returned") { returned.current == 2 }
      }
      return waitUntil(timeout: .seconds(10), "threads gone") { threadCount(named: "drop") == 0 }
    }
    #expect(gone == true)
  }

  /// An actor pinned to a loop keeps the loop alive after the test drops its own reference: its
  /// calls still run on the loop's thread; once the actor goes too, the loop is released (its
  /// poller with it) and what a member captured is let go of.
  @Test func aLoopKeptOnlyByAPinnedActorGoesWithTheActor() async throws {
    var loop: RunLoopThread? = try RunLoopThread(name: "actor")
    weak let weakPoller = loop?.shared.poller
    let deaths = AtomicCounter()
    var actor: LoopCheckingActor? = LoopCheckingActor(loop: loop!)
    do {
      let canary = ReleaseCanary(deaths)
      loop!.add(LoopTimer(after: .seconds(3600)) { _ in canary.touch() }, to: .default)
    }
    loop = nil
    for round in 0..<3 {
      let onLoop = try await withWatchdog(timeout: .seconds(20), "pinned actor call \(round)") { [actor] in
        await actor!.isOnItsLoop()
      }
      #expect(onLoop == true)
    }
    #expect(deaths.current == 0, "a member of a loop still alive was released")
    actor = nil
    #expect(await eventuallyWithin { deaths.current == 1 }, "the loop's member was never released")
    #expect(await eventuallyWithin { weakPoller == nil }, "the loop outlived its last actor")
  }

  /// A task running under `withTaskExecutorPreference(loop)` keeps the loop alive after the test
  /// dropped it, keeps running on its thread, and once it ends the loop goes.
  @Test func aLoopKeptOnlyByAPreferringTaskGoesWhenTheTaskEnds() async throws {
    var loop: RunLoopThread? = try RunLoopThread(name: "pref")
    weak let weakPoller = loop?.shared.poller
    let proceed = TestGate()
    let entered = TestGate()
    let task = Task { [loop] () -> Bool in
      await withTaskExecutorPreference(loop!) {
        entered.open()
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
          startThread(detached: true) {
            _ = proceed.wait(timeout: .seconds(20))
            continuation.resume()
          }
        }
        return loop!.isOnLoopThread
      }
    }
    _ = await execOnNewThread { entered.wait(timeout: .seconds(10)) }
    loop = nil
    proceed.open()
    let onLoop = try await withWatchdog(timeout: .seconds(20), "the preferring task") { await task.value }
    #expect(onLoop == true)
    #expect(await eventuallyWithin { weakPoller == nil }, "the loop outlived the task that preferred it")
  }

  /// The test drops its last reference to a loop while a timer's callout is in a nested run: the
  /// nested run goes on (deliveries continue), and once it returns the loop is released as any
  /// dropped loop: the timers' closures are let go of, the handle and (once the probe source the
  /// test kept is gone too) the poller released.
  @Test func aLoopDroppedDuringANestedRunIsReleasedAfterItReturns() async throws {
    var loop: RunLoopThread? = try RunLoopThread(name: "drop-nested")
    weak let weakLoop = loop
    weak let weakPoller = loop?.shared.poller
    let deaths = AtomicCounter()
    let delivered = AtomicCounter()
    let nestedResult = Guarded<RunLoopRunResult?>(nil)
    var probe: CommandSource<Int>? = CommandSource<Int> { _ in delivered.increment() }
    let limit = LoopClock.Instant.now.advanced(by: .seconds(60 * watchdogScale))
    do {
      let canary = ReleaseCanary(deaths)
      let timer = LoopTimer(after: .zero) { _ in
        canary.touch()
        let result = RunLoopThread.current.run(mode: releaseNestMode, until: limit, returnAfterSourceHandled: true)
        nestedResult.withLock { $0 = result }
      }
      loop!.add(probe!.source, to: releaseNestMode)
      loop!.add(timer, to: .default)
    }
    // The nested run has started once the probe's first command is delivered there.
    #expect(probe?.post(1) == true)
    #expect(await eventuallyWithin { nestedResult.snapshot != nil })
    #expect(nestedResult.snapshot == .handledSource)
    // Second round: the callout is a one-shot timer's; use a new one for the drop.
    let secondResult = Guarded<RunLoopRunResult?>(nil)
    let inNested = TestGate()
    do {
      let canary = ReleaseCanary(deaths)
      let timer = LoopTimer(after: .zero) { _ in
        canary.touch()
        inNested.open()
        let result = RunLoopThread.current.run(mode: releaseNestMode, until: limit, returnAfterSourceHandled: true)
        secondResult.withLock { $0 = result }
      }
      loop!.add(timer, to: .default)
    }
    _ = await execOnNewThread { inNested.wait(timeout: .seconds(10)) }
    loop = nil
    #expect(probe?.post(2) == true)
    #expect(await eventuallyWithin { secondResult.snapshot != nil }, "the nested run never returned")
    #expect(secondResult.snapshot == .handledSource)
    #expect(delivered.current == 2)
    #expect(await eventuallyWithin { deaths.current == 2 }, "released \(deaths.current) of 2 timer closures")
    #expect(await eventuallyWithin { weakLoop == nil }, "the loop dropped during a nested run was kept")
    // (The probe, a member kept by the test, keeps the loop's poller: see
    // `aMemberThatOutlivesItsLoopLetsGoOfTheLoopsDescriptors`.)
    probe = nil
    #expect(await eventuallyWithin { weakPoller == nil }, "the loop dropped during a nested run was kept")
  }

  /// Promise (Shutdown, and dropping a loop): releasing the last reference to a loop drains it
  /// and lets its thread exit, also when that last reference is dropped on the loop's own thread
  /// (held only by a performed block, a timer's handler or a command handler, released there).
  @Test(arguments: ["block", "timer", "command"])
  func theLastReferenceDroppedOnTheLoopsOwnThread(kind: String) async throws {
    let leaked = try await withWatchdogOnThread(timeout: .seconds(40), "last reference on its thread (\(kind))") {
      () throws -> Int in
      var leaked = 0
      for round in 0..<40 {
        weak var weakLoop: RunLoopThread?
        let ran = TestGate()
        var keep: AnyObject?
        do {
          let loop = try RunLoopThread(name: "self\(round % 4)")
          weakLoop = loop
          switch kind {
          case "block":
            loop.perform {
              _ = loop.name
              ran.open()
            }
          case "timer":
            // The handler captures the loop; invalidating the timer from its own callout breaks
            // the cycle, so the loop's last reference goes when the handler is released.
            let timer = LoopTimer(after: .zero) { timer in
              _ = loop.name
              timer.invalidate()
              ran.open()
            }
            loop.add(timer, to: .common)
            keep = timer
          default:
            let holder = Guarded<CommandSource<Int>?>(nil)
            let commands = CommandSource<Int> { _ in
              _ = loop.name
              holder.snapshot?.source.invalidate()
              holder.withLock { $0 = nil }
              ran.open()
            }
            holder.withLock { $0 = commands }
            loop.add(commands.source, to: .common)
            commands.post(1)
          }
        }
        _ = ran.wait(timeout: .seconds(10))
        for _ in 0..<5_000 where weakLoop != nil { usleep(1000) }
        if weakLoop != nil { leaked += 1 }
        keep = nil
        _ = keep
      }
      return leaked
    }
    #expect(leaked == 0)
  }
}
