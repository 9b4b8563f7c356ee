import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// `runModal` (a modal run requested from async code) and `LoopTimer.invalidateAndWait()` (the
/// explicit wait that refuses to deadlock).
@Suite("Modal runs from async code, and waiting for a running callout")
struct ModalRunAndWaitTests {
  // MARK: invalidateAndWait

  @Test func invalidateAndWaitFromTheTimersOwnCalloutThrowsInsteadOfWaiting() async throws {
    let loop = try RunLoopThread(name: "wait-own")
    defer { loop.shutdownAndWait() }
    let outcome = Guarded<String?>(nil)
    let timer = LoopTimer(after: .zero) { timer in
      do {
        try timer.invalidateAndWait()
        outcome.withLock { $0 = "returned" }
      } catch {
        outcome.withLock { $0 = "\(error)" }
      }
    }
    loop.add(timer)
    #expect(await eventually("the callout ran") { outcome.snapshot != nil })
    #expect(outcome.snapshot?.contains("would wait for itself") == true, "\(outcome.snapshot ?? "nil")")
    #expect(!timer.isValid)
  }

  @Test func invalidateAndWaitFromAnotherThreadReturnsOnlyAfterTheRunningCalloutEnded() async throws {
    let loop = try RunLoopThread(name: "wait-other")
    defer { loop.shutdownAndWait() }
    let entered = TestGate()
    let release = TestGate()
    let calloutEnded = Atomic<Bool>(false)
    let timer = LoopTimer(after: .zero, repeatingEvery: .milliseconds(1)) { _ in
      entered.open()
      release.wait(timeout: .seconds(30))
      calloutEnded.store(true, ordering: .releasing)
    }
    loop.add(timer)
    let endedWhenReturned = try await withWatchdogOnThread(timeout: .seconds(30), "invalidateAndWait") {
      () throws -> Bool in
      #expect(entered.wait(timeout: .seconds(30)))
      startThread(detached: true) {
        usleep(20_000)
        release.open()
      }
      try timer.invalidateAndWait()
      return calloutEnded.load(ordering: .acquiring)
    }
    #expect(endedWhenReturned == true)
  }

  @Test func twoLoopsWaitingForEachOthersCalloutsRefuseInsteadOfDeadlocking() async throws {
    let rounds = 20 * stressFactor
    let outcome = try await withWatchdogOnThread(timeout: .seconds(60), "cross-waiting timers") {
      () throws -> [String] in
      var problems: [String] = []
      let first = try RunLoopThread(name: "wait-cycle-a")
      let second = try RunLoopThread(name: "wait-cycle-b")
      defer {
        first.shutdownAndWait()
        second.shutdownAndWait()
      }
      for round in 0..<rounds {
        let arrived = AtomicCounter()
        let refused = AtomicCounter()
        let returned = AtomicCounter()
        let timers = Guarded<[LoopTimer]>([])
        func callout(waitingFor index: Int) -> @Sendable (LoopTimer) -> Void {
          { _ in
            // Both callouts are running from here on (bounded: a broken cycle check still ends).
            _ = arrived.increment()
            let deadline = ContinuousClock.now.advanced(by: .seconds(10))
            while arrived.current < 2 && ContinuousClock.now < deadline { sched_yield() }
            guard let other = timers.snapshot.dropFirst(index).first else { return }
            do {
              try other.invalidateAndWait()
              returned.increment()
            } catch {
              refused.increment()
            }
          }
        }
        let onFirst = LoopTimer(after: .zero, handler: callout(waitingFor: 1))
        let onSecond = LoopTimer(after: .zero, handler: callout(waitingFor: 0))
        timers.withLock { $0 = [onFirst, onSecond] }
        first.add(onFirst)
        second.add(onSecond)
        if !poll(timeout: .seconds(20), { refused.current + returned.current == 2 }) {
          problems.append("round \(round): \(refused.current) refused, \(returned.current) returned")
          break
        }
        // One of them waits for the other, which must refuse (or both refuse); never both wait.
        if refused.current < 1 { problems.append("round \(round): nobody refused the cycle") }
      }
      return problems
    }
    guard let outcome else { return }
    #expect(outcome.isEmpty, "\(outcome)")
  }

  // MARK: runModal

  actor ModalWorker: LoopActor {
    nonisolated let loop: RunLoopThread
    private(set) var calls = 0
    init(loop: RunLoopThread) { self.loop = loop }

    func bump() -> Int {
      calls += 1
      return calls
    }

    /// Runs `mode` modally for a while; returns why it ended and how many other calls of this
    /// actor ran meanwhile.
    func modal(_ mode: RunLoopMode, for duration: Duration) async throws -> (RunLoopRunResult, Int) {
      let before = calls
      let result = try await loop.runModal(mode: mode, for: duration)
      return (result, calls - before)
    }
  }

  @Test func aModalRunFromAnActorOnTheLoopLetsTheActorsOtherCallsRun() async throws {
    let loop = try RunLoopThread(name: "modal-actor")
    defer { loop.shutdownAndWait() }
    let fires = AtomicCounter()
    let timer = LoopTimer(after: .zero, repeatingEvery: .milliseconds(2)) { _ in fires.increment() }
    loop.add(timer, to: "modal")
    defer { timer.invalidate() }
    let worker = ModalWorker(loop: loop)
    let outcome = try await withWatchdog(timeout: .seconds(30), "modal run") {
      () async throws -> (RunLoopRunResult, Int) in
      async let modal = worker.modal("modal", for: .milliseconds(300))
      // Other calls to the same actor while its modal run goes on: they are not blocked.
      for _ in 0..<5 {
        _ = await worker.bump()
        try? await Task.sleep(for: .milliseconds(5))
      }
      return try await modal
    }
    #expect(outcome?.0 == .timedOut)
    #expect((outcome?.1 ?? 0) >= 1, "no other call of the actor ran during its modal run")
    #expect(fires.current > 0, "the modal mode's timer never fired")
  }

  @Test func cancellingTheTaskEndsItsModalRun() async throws {
    let loop = try RunLoopThread(name: "modal-cancel")
    defer { loop.shutdownAndWait() }
    let timer = LoopTimer(after: .seconds(3600)) { _ in }
    loop.add(timer, to: "modal")
    defer { timer.invalidate() }
    let result = try await withWatchdog(timeout: .seconds(30), "cancelled modal run") {
      () async throws -> RunLoopRunResult in
      let task = Task { try await loop.runModal(mode: "modal") }  // no limit: only cancellation ends it
      try? await Task.sleep(for: .milliseconds(20))
      task.cancel()
      return try await task.value
    }
    #expect(result == .stopped)
  }

  @Test func aModalRunOnAShutDownLoopThrows() async throws {
    let loop = try RunLoopThread(name: "modal-down")
    loop.shutdownAndWait()
    await #expect(throws: RunLoopError.shutDown(loop: "modal-down")) {
      try await loop.runModal(mode: "modal", for: .milliseconds(10))
    }
  }
}

/// A burst of registration changes from another thread is applied over several passes (at most
/// `LoopChangeQueue.perPass` each), and a block sent after the burst still runs after all of it.
@Suite("Registration bursts: spread over passes, still in order")
struct RegistrationBurstTests {
  @Test func aBlockSentAfterABurstOfAddsRunsAfterEveryOneOfThem() async throws {
    let loop = try RunLoopThread(name: "burst")
    defer { loop.shutdownAndWait() }
    let count = 8 * LoopChangeQueue.perPass + 17
    let scheduled = AtomicCounter()
    let passes = AtomicCounter()
    let observer = LoopObserver(activities: .beforeTimers) { _, _ in _ = passes.increment() }
    loop.add(observer, to: .common)
    defer { observer.invalidate() }
    _ = try loop.performAndWait { 0 }
    let passesBefore = passes.current
    let sources = (0..<count).map { _ in InputSource(schedule: { _, _, _ in _ = scheduled.increment() }) { _ in } }
    let seen = try await withWatchdogOnThread(timeout: .seconds(30), "the burst") { () throws -> Int in
      for source in sources { loop.add(source) }
      return try loop.performAndWait { scheduled.current }
    }
    #expect(seen == count)
    // Spread: more than one pass applied them (each applies at most `LoopChangeQueue.perPass`).
    #expect(passes.current - passesBefore >= 2)
    for source in sources { source.invalidate() }
  }
}
