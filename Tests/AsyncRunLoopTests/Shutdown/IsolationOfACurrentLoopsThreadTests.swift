import Glibc
import Testing

@testable import AsyncRunLoop

/// A `RunLoopThread.current` loop's thread counts as isolated to the loop only while it is inside
/// one of the loop's runs (or its exit drain). Out of a run, a shutdown from another thread hands
/// the loop's jobs to the fallback executor at once (no awaiting task waits for the thread), so
/// code the thread runs there must not count as isolated: an actor's job on the fallback would run
/// while that code assumes the actor's isolation.
@Suite(.timeLimit(.minutes(5)))
struct IsolationOfACurrentLoopsThreadTests {
  /// The interleaving: the thread, out of a run, checks its isolation and stays in that region;
  /// a job of the loop's actor is queued; another thread shuts the loop down; the job runs on the
  /// fallback while the region is still open. The region must not have counted as isolated.
  @Test func noLoopJobRunsElsewhereWhileItsThreadCountsAsIsolated() async throws {
    let thread = CommandedCurrentLoopThread()
    defer { thread.quit() }
    let loop = await thread.loop()
    let actor = OverlapRecordingActor(loop: loop)
    let regionEntered = TestGate()
    let jobRan = TestGate()
    let region = Task {
      await thread.exec { loop -> (isolated: Bool, jobRanMeanwhile: Bool, isolatedAtEnd: Bool) in
        let isolated = loop.isIsolatingCurrentContext() == true
        regionEntered.open()
        let ran = jobRan.wait(timeout: .seconds(10) * watchdogScale)
        return (isolated, ran, loop.isIsolatingCurrentContext() == true)
      }
    }
    #expect(await execOnNewThread { regionEntered.wait(timeout: .seconds(20) * watchdogScale) })
    let call = Task { () -> Bool in
      let isolated = await actor.call()  // isolated where it ran
      jobRan.open()
      return isolated
    }
    await execOnNewThread { loop.shutdown() }
    let outcome = await region.value
    let jobWasIsolated = await call.value
    // The job did not wait for the thread: it ran on the fallback, isolated there...
    #expect(outcome.jobRanMeanwhile, "the actor's job waited for the thread (or never ran)")
    #expect(jobWasIsolated)
    // ...so the thread's code, which it ran meanwhile, never counted as isolated to the loop.
    #expect(!(outcome.isolated && outcome.jobRanMeanwhile), "the thread and the fallback both were isolated")
    #expect(!outcome.isolated && !outcome.isolatedAtEnd)
  }

  /// Inside a run the thread counts as isolated (callouts may `assumeIsolated`); out of one it
  /// does not, before any shutdown too.
  @Test func aCurrentLoopsThreadIsIsolatedOnlyInsideARun() async throws {
    let thread = CommandedCurrentLoopThread()
    defer { thread.quit() }
    let outcome = await thread.exec { loop -> (outside: Bool, inCallout: Bool?, afterRun: Bool) in
      let outside = loop.isIsolatingCurrentContext() == true
      let inCallout = Guarded<Bool?>(nil)
      let timer = LoopTimer(after: .milliseconds(1)) { _ in
        inCallout.withLock { $0 = loop.isIsolatingCurrentContext() == true }
        loop.stop()
      }
      loop.add(timer)
      _ = loop.run(for: .seconds(20))
      timer.invalidate()
      return (outside, inCallout.snapshot, loop.isIsolatingCurrentContext() == true)
    }
    #expect(!outcome.outside)
    #expect(outcome.inCallout == true)
    #expect(!outcome.afterRun)
  }
}
