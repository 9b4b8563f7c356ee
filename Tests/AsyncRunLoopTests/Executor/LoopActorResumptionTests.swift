import Glibc
import Testing

@testable import AsyncRunLoop

/// LoopActor's doc: a task started with the loop as its executor preference that suspends inside
/// the actor "then queues on the loop directly and never waits for the pool"; one without a
/// preference resumes through the global pool first.
///
/// Blocks every thread of the global pool, so it runs only when the cooperative pool is on
/// (`SWIFT_DEBUG_CONCURRENCY_ENABLE_COOPERATIVE_QUEUES=true swift test --filter LoopActorResumptionTests`):
/// the suite's harness widens the pool otherwise, and a blocked pool would starve other tests.
/// Every wait happens on raw threads (the test's own task resumes only once the pool is free).
@Suite("Loop actor resumption", .serialized, .timeLimit(.minutes(10)))
struct LoopActorResumptionTests {
  @Test(.enabled(if: runsOnTheFixedWidthCooperativePool, "needs the fixed-width cooperative pool"))
  func aTaskPreferringTheLoopResumesInsideItsActorWhileThePoolIsBlocked() async throws {
    let loop = try RunLoopThread(name: "actor")
    let waiter = ResumptionCheckingActor(loop: loop)
    let otherLoop = try RunLoopThread(name: "actor2")
    let otherWaiter = ResumptionCheckingActor(loop: otherLoop)
    let result = try await withWatchdogOnThread(timeout: .seconds(30), "blocked-pool probe") {
      () -> (preferredOnLoop: Bool, unpreferredWhileBlocked: Bool, unpreferredAfter: Bool?) in
      let width = max(Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))), 1)
      // An unpreferred task parks in the actor before the pool is blocked.
      let unpreferredParked = Guarded<CheckedContinuation<Void, Never>?>(nil)
      let unpreferredDone = TestGate()
      let unpreferredOnLoop = Guarded<Bool?>(nil)
      Task.detached {
        let onLoop = await waiter.suspend { continuation in unpreferredParked.withLock { $0 = continuation } }
        unpreferredOnLoop.withLock { $0 = onLoop }
        unpreferredDone.open()
      }
      waitUntil { unpreferredParked.snapshot != nil }
      // Block every pool thread.
      let blocked = AtomicCounter()
      let hold = TestGate()
      for _ in 0..<width {
        Task.detached {
          blocked.increment()
          _ = hold.wait(timeout: .seconds(20))
        }
      }
      waitUntil { blocked.current == width }
      // A task preferring the loop: starts on the loop, parks in the actor, is resumed by a raw
      // thread.
      let preferredDone = TestGate()
      let preferredOnLoop = Guarded<Bool?>(nil)
      Task(executorPreference: loop) {
        let onLoop = await waiter.suspend { continuation in
          startThread(detached: true) {
            usleep(1000)
            continuation.resume()
          }
        }
        preferredOnLoop.withLock { $0 = onLoop }
        preferredDone.open()
      }
      _ = preferredDone.wait(timeout: .seconds(10))
      let preferred = preferredOnLoop.snapshot
      // The same task form sleeping inside the actor, then waiting on a source sequence.
      let napped = Guarded<(Bool, Int?)?>(nil)
      let sequence = loop.sourceSequence(of: Int.self)
      Task(executorPreference: loop) {
        let onLoop = await waiter.nap()
        let element = await waiter.next(of: sequence)
        napped.withLock { $0 = (onLoop, element) }
      }
      startThread(detached: true) {
        usleep(20_000)
        _ = sequence.post(7)
      }
      waitUntil(timeout: .seconds(10), "the preferred sleeper") { napped.snapshot != nil }
      let sleeper = napped.snapshot
      // A task preferring this loop that waits inside an actor on another loop.
      let elsewhere = Guarded<Bool?>(nil)
      Task(executorPreference: loop) {
        let onOtherLoop = await otherWaiter.suspend { continuation in
          startThread(detached: true) {
            usleep(1000)
            continuation.resume()
          }
        }
        elsewhere.withLock { $0 = onOtherLoop }
      }
      waitUntil(timeout: .seconds(10), "the task waiting on another loop's actor") { elsewhere.snapshot != nil }
      // The unpreferred one is resumed while the pool is still blocked.
      unpreferredParked.snapshot?.resume()
      let whileBlocked = unpreferredDone.wait(timeout: .milliseconds(500))
      hold.open()
      _ = unpreferredDone.wait(timeout: .seconds(10))
      let allPreferred = preferred == true && sleeper?.0 == true && sleeper?.1 == 7 && elsewhere.snapshot == true
      return (allPreferred, whileBlocked, unpreferredOnLoop.snapshot)
    }
    await execShutdown(loop)
    await execShutdown(otherLoop)
    guard let result else { return }
    #expect(result.preferredOnLoop == true, "a preferred task did not resume inside its actor")
    #expect(result.unpreferredAfter == true, "the unpreferred task never came back to its actor")
    print(
      "cooperative-pool probe: unpreferred task resumed while the pool was blocked: \(result.unpreferredWhileBlocked)")
  }
}
