import Glibc
import Testing

@testable import AsyncRunLoop

// Review round 11: the chunked inbox (blocks and changes in chunks of 1,024, blocks adopted after
// the lock is released, the change barrier and bounded passes), timers deferred as busy, exact
// delivery counts of command sources, and what members leave behind. Blocking work runs on threads
// of the tests' own; results are checked after the watchdog returns.

private let modeA: RunLoopMode = "r11-a"
private let modeB: RunLoopMode = "r11-b"

/// An object to watch with a weak reference (captured by a member's closure).
private final class R11Token: Sendable {}

@Suite("ReviewRound11: timers deferred as busy", .serialized, .timeLimit(.minutes(2)))
struct ReviewRound11TimerTests {
  /// A repeating timer (one hour) due now fires on loop A; its callout moves it to loop B (both
  /// loops on one CPU, so waking B lets B run at once). Its grid point fired once: promised, it
  /// moves to the next point of its grid, an hour later, and does not fire again for this one.
  /// Between the callout's return (which clears "a callout is running" and re-times B's deferred
  /// entry) and `afterFire` (which advances the date) B can find the old date still due.
  @Test(.disabled("bug: a timer moved to another loop in its callout fires there again for the date just fired"))
  func aRepeatingTimerMovedToAnotherLoopInItsCalloutFiresOnceForItsDate() async throws {
    let doubled = try await Self.moveInCallout(repeating: true)
    #expect(doubled == [], "the timer fired again for the date it had just fired for")
  }

  /// The same with a one-shot timer: "a one-shot timer is done" after its fire (invalidated), yet
  /// B runs its handler a second time.
  @Test(.disabled("bug: a one-shot timer moved to another loop in its callout fires twice"))
  func aOneShotTimerMovedToAnotherLoopInItsCalloutFiresOnce() async throws {
    let doubled = try await Self.moveInCallout(repeating: false)
    #expect(doubled == [], "the one-shot timer fired twice")
  }

  /// Rounds of: a timer due now fires on A, its callout moves it to B (and, every other round,
  /// lets B make passes first, so B defers it as busy). Returns the rounds where it fired more
  /// than once.
  private static func moveInCallout(repeating: Bool) async throws -> [String]? {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "moved timer, one date") {
      () throws -> (rounds: Int, doubled: [String]) in
      var doubled: [String] = []
      let rounds = try repeatRounds(30, budget: .milliseconds(1500)) { round in
        let loopA = try RunLoopThread(name: "r11-move-a", cpu: 0)
        let loopB = try RunLoopThread(name: "r11-move-b", cpu: 0)
        defer {
          loopA.shutdownAndWait()
          loopB.shutdownAndWait()
        }
        let fires = Locked<[String]>([])
        let calloutDone = TestGate()
        let timer = LoopTimer(fireAt: .now, repeatingEvery: repeating ? .seconds(3600) : nil) { timer in
          let count = fires.withLock {
            $0.append(RunLoopThread.current.name)
            return $0.count
          }
          guard count == 1 else { return }
          loopA.remove(timer)  // its only mode here: unbound
          loopB.add(timer)  // due there at once: B finds its callout running (busy)
          if round % 2 == 0 {
            for _ in 0..<2 { _ = try? loopB.performAndWait {} }  // B made passes meanwhile
          }
          calloutDone.open()
        }
        loopA.add(timer)
        _ = calloutDone.wait(timeout: .seconds(10))
        for _ in 0..<3 {  // both loops settle: several passes each
          _ = try? loopA.performAndWait {}
          _ = try? loopB.performAndWait {}
          usleep(1_000)
        }
        let fired = fires.withLock { $0 }
        if fired.count != 1 { doubled.append("round \(round): fired on \(fired)") }
        timer.invalidate()
      }
      return (rounds, doubled)
    }
    print("moved timer (repeating: \(repeating)): \(outcome?.rounds ?? 0) rounds, \(outcome?.doubled ?? [])")
    return outcome?.doubled
  }
}
