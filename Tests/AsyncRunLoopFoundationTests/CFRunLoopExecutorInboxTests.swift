import Testing

@testable import AsyncRunLoopFoundation

/// `CFRunLoopExecutorInbox`, the executor's state machine, as plain values (jobs are integers, the
/// run loop a string).
@Suite struct CFRunLoopExecutorInboxTests {
  typealias Inbox = CFRunLoopExecutorInbox<Int, String>

  /// One drain block per burst: only the first enqueue schedules one, on the thread's loop.
  @Test func onlyTheFirstJobOfABurstSchedulesADrain() {
    var inbox = Inbox(runLoop: "loop")
    guard case .scheduleDrain("loop") = inbox.enqueue(1) else {
      Issue.record("the first job did not schedule a drain")
      return
    }
    guard case .none = inbox.enqueue(2) else {
      Issue.record("a second drain was scheduled")
      return
    }
    let jobs = inbox.takeJobs()
    #expect(jobs == [1, 2])
    let drainsAgain = inbox.finishDrain()
    #expect(drainsAgain == nil)
    guard case .scheduleDrain = inbox.enqueue(3) else {
      Issue.record("a job after the drain ended did not schedule one")
      return
    }
  }

  /// A drain that finds more jobs after its batch schedules the next one on the thread's loop;
  /// once the thread has exited, none (the fallback queue's final drain takes them).
  @Test func aDrainWithMoreJobsSchedulesTheNextOnTheThreadsLoopUntilTheThreadExits() {
    var inbox = Inbox(runLoop: "loop")
    _ = inbox.enqueue(1)
    _ = inbox.takeJobs()
    _ = inbox.enqueue(2)
    let next = inbox.finishDrain()
    #expect(next == "loop")
    _ = inbox.threadExited()
    let afterTheExit = inbox.finishDrain()
    #expect(afterTheExit == nil)
  }

  /// The thread exits with jobs queued: the final drain moves to the fallback, no drain block goes
  /// to the loop any more, the loop is let go of, and `shutdown()` has nothing left to begin.
  @Test func aThreadExitWithJobsQueuedDrainsThemOnTheFallbackAndLetsGoOfTheLoop() {
    var inbox = Inbox(runLoop: "loop")
    _ = inbox.enqueue(1)
    let exit = inbox.threadExited()
    #expect(exit.drainsOnFallback)
    #expect(exit.releasedLoop == "loop")
    #expect(inbox.runLoop == nil)
    #expect(!inbox.jobsRunOnTheThread)
    guard case .none = inbox.enqueue(2) else {
      Issue.record("a job enqueued after the exit did not wait for the fallback's drain")
      return
    }
    let shutdown = inbox.beginShutdown()
    #expect(shutdown == nil)
    let terminatedWithJobsQueued = inbox.terminateIfIdle()
    #expect(!terminatedWithJobsQueued)
    let jobs = inbox.takeJobs()
    #expect(jobs == [1, 2])
    let terminated = inbox.terminateIfIdle()
    #expect(terminated)
    guard case .runElsewhere = inbox.enqueue(3) else {
      Issue.record("a job after the termination did not go to the fallback")
      return
    }
  }

  /// The thread exits after `shutdown()` began but before its final drain ran: the fallback runs
  /// the final drain instead.
  @Test func aThreadExitAfterTheShutdownBeganStillDrainsOnTheFallback() {
    var inbox = Inbox(runLoop: "loop")
    let shutdown = inbox.beginShutdown()
    #expect(shutdown == "loop")
    let exit = inbox.threadExited()
    #expect(exit.drainsOnFallback)
    #expect(inbox.lifecycle == .shuttingDown)
  }

  /// The thread exits after the termination (a `startThread` thread always does): nothing to
  /// drain, but the loop is let go of. A second exit changes nothing.
  @Test func aThreadExitAfterTheTerminationOnlyLetsGoOfTheLoop() {
    var inbox = Inbox(runLoop: "loop")
    let shutdown = inbox.beginShutdown()
    #expect(shutdown == "loop")
    let terminated = inbox.terminateIfIdle()
    #expect(terminated)
    let exit = inbox.threadExited()
    #expect(!exit.drainsOnFallback)
    #expect(exit.releasedLoop == "loop")
    #expect(inbox.lifecycle == .terminated)
    let again = inbox.threadExited()
    #expect(!again.drainsOnFallback)
    #expect(again.releasedLoop == nil)
  }

  /// Only the first `shutdown()` begins one.
  @Test func onlyTheFirstShutdownBeginsOne() {
    var inbox = Inbox(runLoop: "loop")
    let first = inbox.beginShutdown()
    let second = inbox.beginShutdown()
    #expect(first == "loop")
    #expect(second == nil)
    #expect(inbox.jobsRunOnTheThread)
  }
}
