import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// One clock of events across threads, to order "a callout claimed isolation" against "a job of
/// the loop ran elsewhere" without reading time.
private final class EventOrder: Sendable {
  private let next = Atomic<Int>(0)
  /// The first event at which a job of the loop ran off its thread (Int.max: none).
  let firstJobElsewhere = Atomic<Int>(Int.max)
  /// The last event at which a callout on the loop's thread counted as isolated (-1: none).
  let lastIsolatedCallout = Atomic<Int>(-1)
  let isolatedCallouts = Atomic<Int>(0)

  func jobRanElsewhere() {
    let now = next.add(1, ordering: .sequentiallyConsistent).newValue
    _ = firstJobElsewhere.min(now, ordering: .sequentiallyConsistent)
  }

  func calloutClaimedIsolation() {
    let now = next.add(1, ordering: .sequentiallyConsistent).newValue
    _ = lastIsolatedCallout.max(now, ordering: .sequentiallyConsistent)
    isolatedCallouts.add(1, ordering: .relaxed)
  }
}

/// An actor on the loop that keeps yielding (so the drain always finds a job: it reaches its cap)
/// and notes every step that runs off the loop's thread.
private actor YieldingActor: LoopActor {
  nonisolated let loop: RunLoopThread
  nonisolated let order: EventOrder
  private var steps = 0

  init(loop: RunLoopThread, order: EventOrder) {
    self.loop = loop
    self.order = order
  }

  func spin(while keepGoing: @Sendable () -> Bool) async -> Int {
    while true {
      if !loop.isOnLoopThread { order.jobRanElsewhere() }  // noted before it may stop
      guard keepGoing() else { return steps }
      steps += 1
      await Task.yield()
    }
  }
}

/// Isolation is exact at every moment of shutdown: a loop's jobs run in one place at a time. An
/// owned loop whose drain is cut short by its cap (an actor that always has a job waiting, adds
/// still arriving) applies the changes it accepted and detaches what they added — callouts — and
/// hands its leftover jobs to the fallback only after the last of them, so no callout on the
/// loop's thread counts as isolated once a job of the loop has run elsewhere.
@Suite(.timeLimit(.minutes(5)))
struct IsolationDuringShutdownTests {
  @Test func noCalloutCountsAsIsolatedOnceTheLoopsJobsRunElsewhere() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(60), "capped drain with a yielding actor and adds") {
      () -> (firstElsewhere: Int, lastIsolated: Int, isolatedCallouts: Int, steps: Int) in
      let loop = try RunLoopThread(name: "isolation-drain")
      let order = EventOrder()
      let actor = YieldingActor(loop: loop, order: order)
      let spinning = Atomic<Bool>(true)
      let spinner = Task { await actor.spin { spinning.load(ordering: .relaxed) } }
      let adding = Atomic<Bool>(true)
      // Another thread keeps adding command sources with one command each, through the drain.
      let adder = ExecThread {
        var kept: [CommandSource<Int>] = []
        while adding.load(ordering: .relaxed) {
          // A cancel routine that takes a while (2 ms) and claims isolation before and after:
          // a job of the loop that runs elsewhere meanwhile is seen.
          let commands = CommandSource<Int>(
            cancel: { _, loop in
              guard loop.isIsolatingCurrentContext() == true else { return }
              order.calloutClaimedIsolation()
              usleep(2000)
              if loop.isIsolatingCurrentContext() == true { order.calloutClaimedIsolation() }
            }
          ) { _ in
            if loop.isIsolatingCurrentContext() == true { order.calloutClaimedIsolation() }
          }
          loop.add(commands.source, to: .default)
          commands.post(1)
          kept.append(commands)
          if kept.count > 4096 { kept.removeFirst(2048) }
          usleep(300)  // steady adds: some always arrive during the drain's last round
        }
      }
      // Let the actor and the adds run, then shut down: the drain meets the cap (the actor
      // always has a job waiting) with changes still arriving.
      try await Task.sleep(for: .milliseconds(50))
      await execOnNewThread { loop.shutdownAndWait() }
      adding.store(false, ordering: .relaxed)
      await execOnNewThread { adder.join() }
      // The leftover jobs were handed over: the actor's next step runs on the fallback queue (it
      // may take a while under a sanitizer); stop it only once one has.
      let deadline = ContinuousClock.now.advanced(by: .seconds(20) * watchdogScale)
      while order.firstJobElsewhere.load(ordering: .sequentiallyConsistent) == Int.max,
        ContinuousClock.now < deadline
      {
        try await Task.sleep(for: .milliseconds(5))
      }
      spinning.store(false, ordering: .relaxed)
      let steps = await spinner.value
      return (
        order.firstJobElsewhere.load(ordering: .sequentiallyConsistent),
        order.lastIsolatedCallout.load(ordering: .sequentiallyConsistent),
        order.isolatedCallouts.load(ordering: .sequentiallyConsistent), steps
      )
    }
    guard let outcome else { return }
    // The drain was cut short and handed the actor's jobs over (the case under test)...
    #expect(outcome.firstElsewhere != Int.max, "the actor never ran on the fallback: the drain was not capped")
    // ...callouts ran and claimed isolation before that...
    #expect(outcome.isolatedCallouts > 0)
    // ...and none did after a job of the loop had run elsewhere.
    #expect(outcome.lastIsolated < outcome.firstElsewhere)
    #expect(outcome.steps > 0)
  }
}
