import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// Loops that shut each other down and wait for each other all return.
@Suite("Loops that shut each other down and wait for each other all return", .serialized, .timeLimit(.minutes(10)))
struct ShutdownAndWaitAcrossLoopsTests: PassTestModes {
  /// A's thread waits in `performAndWait` for a block on B; right after that block, B (in its next
  /// block) shuts A down and waits. A's thread is no longer blocked, so B's call must wait for A's
  /// thread (the doc: it only starts the shutdown when that thread "is itself blocked until the
  /// caller's loop is done"). A's edge in the wait-for graph outlives its wait until A's thread
  /// wakes up, so B's call often sees a cycle that is gone and returns without joining A.
  @Test
  func shutdownAndWaitRightAfterTheTargetsWaitEndedJoinsTheTarget() async throws {
    let early = try await withWatchdogOnThread(timeout: .seconds(30), "stale edge") { () -> Int in
      var early = 0
      for _ in 0..<30 {
        guard let first = try? RunLoopThread(name: "sa"), let second = try? RunLoopThread(name: "sb")
        else { continue }
        let joined = Locked<Bool?>(nil)
        let done = TestGate()
        first.perform {
          _ = try? second.performAndWait {
            second.perform {
              first.shutdownAndWait()
              joined.withLock { $0 = isReaped(first) }
              done.open()
            }
          }
        }
        #expect(done.wait(timeout: .seconds(10)))
        if joined.withLock({ $0 }) == false { early += 1 }
        first.shutdownAndWait()
        second.shutdownAndWait()
      }
      return early
    }
    #expect(
      early == 0, "shutdownAndWait returned \(early ?? -1) of 30 times without joining a loop that waited for nothing")
  }

  /// The same as `shutdownAndWaitRightAfterTheTargetsWaitEndedJoinsTheTarget`, with B's second block waiting until A's thread has
  /// left its `performAndWait` (its edge gone): then B's call waits and joins A every time. (What
  /// differs is only the wait-for graph's stale edge.)
  @Test func shutdownAndWaitOnceTheTargetsWaitHasFullyEndedJoinsTheTarget() async throws {
    let early = try await withWatchdogOnThread(timeout: .seconds(30), "no stale edge") { () -> Int in
      var early = 0
      for _ in 0..<10 {
        guard let first = try? RunLoopThread(name: "sc"), let second = try? RunLoopThread(name: "sd")
        else { continue }
        let joined = Locked<Bool?>(nil)
        let left = TestGate()
        let done = TestGate()
        first.perform {
          _ = try? second.performAndWait {
            second.perform {
              _ = left.wait(timeout: .seconds(10))
              first.shutdownAndWait()
              joined.withLock { $0 = isReaped(first) }
              done.open()
            }
          }
          left.open()
        }
        #expect(done.wait(timeout: .seconds(10)))
        if joined.withLock({ $0 }) == false { early += 1 }
        first.shutdownAndWait()
        second.shutdownAndWait()
      }
      return early
    }
    #expect(early == 0)
  }

  /// Three loops shutting each other down in a ring at once: every call returns, and the test
  /// thread then joins all three; no thread of theirs is left.
  @Test func threeLoopsShuttingEachOtherDownInARingAllReturn() async throws {
    let rounds = try await withWatchdogOnThread(timeout: .seconds(30), "ring shutdown") { () -> Int in
      repeatRounds(20, budget: .milliseconds(1500)) { _ in
        let loops = (0..<3).compactMap { _ in try? RunLoopThread(name: "ring") }
        guard loops.count == 3 else { return }
        let allIn = AtomicCounter()
        let returned = AtomicCounter()
        for index in 0..<3 {
          let next = loops[(index + 1) % 3]
          loops[index].perform {
            allIn.increment()
            while allIn.current < 3 { sched_yield() }
            next.shutdownAndWait()
            returned.increment()
          }
        }
        for loop in loops { loop.shutdownAndWait() }
        #expect(returned.current == 3)
        #expect(loops.allSatisfy(isReaped))
      }
    }
    #expect((rounds ?? 0) > 0)
    waitUntil(timeout: .seconds(5), "ring threads gone") { threadCount(named: "ring") == 0 }
  }

  /// A waits in `performAndWait` for B, whose block shuts C down and waits; C's block shuts A down
  /// and waits. The last of the three waits to be recorded closes the cycle and only starts the
  /// shutdown: everyone returns, the block's result reaches A.
  @Test func aCycleMixingPerformAndWaitAndShutdownAndWaitAllReturn() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "mixed cycle") { () -> (String?, Int) in
      let first = try RunLoopThread(name: "ma")
      let second = try RunLoopThread(name: "mb")
      let third = try RunLoopThread(name: "mc")
      let answer = Locked<String?>(nil)
      let returned = AtomicCounter()
      let inSecond = TestGate()
      let aDone = TestGate()
      // C's block first: once A's block runs, B's block may shut C down, which would refuse it.
      let thirdAccepted = third.perform {
        _ = inSecond.wait(timeout: .seconds(10))
        first.shutdownAndWait()
        returned.increment()
      }
      first.perform {
        let result = try? second.performAndWait { () -> String in
          inSecond.open()
          third.shutdownAndWait()
          returned.increment()
          return "answered"
        }
        answer.withLock { $0 = result }
        aDone.open()
      }
      #expect(thirdAccepted)
      #expect(aDone.wait(timeout: .seconds(10)))
      for loop in [first, second, third] { loop.shutdownAndWait() }
      return (answer.withLock { $0 }, returned.current)
    }
    #expect(outcome?.0 == "answered")
    #expect(outcome?.1 == 2)
  }

  /// Every loop of a group calls the group's `shutdownAndWait()` from a block at once: every call
  /// returns, and a later call from the test thread joins them all.
  @Test func everyLoopOfAGroupShuttingTheGroupDownAtOnceReturns() async throws {
    let rounds = try await withWatchdogOnThread(timeout: .seconds(30), "group shutdown") { () -> Int in
      repeatRounds(15, budget: .milliseconds(1500)) { _ in
        guard let group = try? LoopGroup(count: 3, name: "grp") else { return }
        let allIn = AtomicCounter()
        let returned = AtomicCounter()
        for loop in group.loops {
          loop.perform {
            allIn.increment()
            while allIn.current < 3 { sched_yield() }
            group.shutdownAndWait()
            returned.increment()
          }
        }
        group.shutdownAndWait()
        #expect(returned.current == 3)
        #expect(group.loops.allSatisfy(isReaped))
      }
    }
    #expect((rounds ?? 0) > 0)
  }

  /// B waits in `LoopTimer.invalidateAndWait()` for a callout of A's timer; right after that
  /// callout, A (in a block it performed from the callout) shuts B down and waits. B's thread is
  /// no longer blocked, yet B's edge may still be in the wait-for graph (same cause as the
  /// `performAndWait` case): the call must still join B.
  @Test
  func shutdownAndWaitRightAfterTheTargetsInvalidateAndWaitEndedJoinsTheTarget() async throws {
    let early = try await withWatchdogOnThread(timeout: .seconds(30), "stale timer edge") { () -> Int in
      var early = 0
      for _ in 0..<30 {
        guard let first = try? RunLoopThread(name: "ta"), let second = try? RunLoopThread(name: "tb")
        else { continue }
        let joined = Locked<Bool?>(nil)
        let inCallout = TestGate()
        let done = TestGate()
        let timer = LoopTimer(after: .zero) { _ in
          inCallout.open()
          usleep(2_000)  // B is waiting by now (or invalidated first: then nothing to wait for)
          first.perform {
            second.shutdownAndWait()
            joined.withLock { $0 = isReaped(second) }
            done.open()
          }
        }
        first.add(timer)
        second.perform {
          _ = inCallout.wait(timeout: .seconds(10))
          try? timer.invalidateAndWait()
        }
        #expect(done.wait(timeout: .seconds(10)))
        if joined.withLock({ $0 }) == false { early += 1 }
        first.shutdownAndWait()
        second.shutdownAndWait()
      }
      return early
    }
    #expect(early == 0, "shutdownAndWait returned \(early ?? -1) of 30 times without joining")
  }

  /// A run nested on the thread (in an actor's job, a performed block, a timer's or an
  /// observer's callout) while another thread shuts the loop down and tasks keep calling an actor
  /// on it: every call completes exactly once, never two of the loop's jobs at once, none waits
  /// for the thread to exit, and the nested run ends.
  @Test(arguments: CurrentLoopNestingSite.allCases)
  func aShutdownDuringANestedRunLosesNoCallAndNeverOverlaps(site: CurrentLoopNestingSite) async throws {
    let rounds = 20
    for round in 0..<rounds {
      let thread = CommandedCurrentLoopThread()
      let loop = await thread.loop()
      let overlap = JobOverlapCounter()
      let actor = OverlapRecordingActor(loop: loop, overlap: overlap)
      let nestedEntered = TestGate()
      let nestedResult = Guarded<RunLoopRunResult?>(nil)
      let outerResult = Guarded<RunLoopRunResult?>(nil)
      let mode = modeM
      // The thread runs the loop until the shutdown; the nested run happens from `site`.
      thread.send { loop in
        let keepAlive = LoopTimer(after: .seconds(3600)) { _ in }
        loop.add(keepAlive)
        loop.add(keepAlive, to: mode)
        var members: [any Sendable] = []
        switch site {
        case .job:
          break
        case .block:
          loop.perform {
            let marker = LoopTimer(after: .zero) { _ in nestedEntered.open() }
            loop.add(marker, to: mode)
            nestedResult.withLock { $0 = loop.run(mode: mode, for: .seconds(20)) }
            marker.invalidate()
          }
        case .timer:
          let timer = LoopTimer(after: .zero) { _ in
            let marker = LoopTimer(after: .zero) { _ in nestedEntered.open() }
            loop.add(marker, to: mode)
            nestedResult.withLock { $0 = loop.run(mode: mode, for: .seconds(20)) }
            marker.invalidate()
          }
          loop.add(timer)
          members.append(timer)
        case .observer:
          let observer = LoopObserver(activities: .beforeWaiting, repeats: false) { _, _ in
            let marker = LoopTimer(after: .zero) { _ in nestedEntered.open() }
            loop.add(marker, to: mode)
            nestedResult.withLock { $0 = loop.run(mode: mode, for: .seconds(20)) }
            marker.invalidate()
          }
          loop.add(observer)
          members.append(observer)
        }
        outerResult.withLock { $0 = loop.run(for: .seconds(20) * watchdogScale) }
        keepAlive.invalidate()
        withExtendedLifetime(members) {}
      }
      let (tasks, calls) = (3, 30)
      let isolated = Locked(0)
      let outcome: Void? = try await withWatchdog(timeout: .seconds(20), "\(site) round \(round)") {
        await withTaskGroup(of: Void.self) { group in
          if site == .job {
            group.addTask {
              let result = await actor.nestedRun(mode, entered: nestedEntered)
              nestedResult.withLock { $0 = result }
            }
          }
          for _ in 0..<tasks {
            group.addTask {
              for _ in 0..<calls {
                if await actor.call() { isolated.withLock { $0 += 1 } }
              }
            }
          }
          group.addTask {
            await execOnNewThread {
              _ = nestedEntered.wait(timeout: .seconds(20) * watchdogScale)
              usleep(UInt32(100 * (round % 6)))
              loop.shutdown()
            }
          }
        }
      }
      #expect(outcome != nil)
      #expect(await actor.calls == tasks * calls + (site == .job ? 1 : 0))
      #expect(isolated.withLock { $0 } == tasks * calls)
      #expect(overlap.maximum == 1, "\(site) round \(round): two of the loop's jobs or callouts overlapped")
      #expect(nestedResult.snapshot == .stopped)
      _ = await execOnNewThread { waitUntil("the outer run to end") { outerResult.snapshot != nil } }
      #expect(outerResult.snapshot == .stopped)
      #expect(!thread.bodyEnded.opened)
      thread.quit()
    }
  }
}
