import Dispatch
import Glibc
import Testing

@testable import AsyncRunLoop

// MARK: - Timer, readiness and activity sequences

@Suite("Timer, readiness and activity sequences", .serialized, .timeLimit(.minutes(10)))
struct MemberSequenceTests {
  /// Promised: a consumer waiting on a timer, readiness or activity sequence ends (nil) when the
  /// loop shuts down.
  @Test func waitingConsumersEndWhenTheLoopShutsDown() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "consumers at shutdown") { () async throws -> Int in
      let loop = try RunLoopThread(name: "member-end")
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let timer = loop.timer(every: .seconds(3600))
      let readiness = try loop.readiness(of: pipe.read)
      let activities = loop.activities([.entry])
      let ended = AtomicCounter()
      let t1 = Task {
        for await _ in timer {}
        ended.increment()
      }
      let t2 = Task {
        for await _ in readiness {}
        ended.increment()
      }
      let t3 = Task {
        for await _ in activities {}
        ended.increment()
      }
      try await Task.sleep(for: .milliseconds(20))
      await execShutdown(loop)
      _ = await (t1.value, t2.value, t3.value)
      return ended.current
    }
    #expect(outcome == 3)
  }

  /// Promised: `invalidate()` from another thread ends a waiting timer, readiness or activity
  /// consumer.
  @Test func invalidateEndsWaitingMemberConsumers() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "consumers at invalidate") {
      () async throws -> Int in
      let loop = try RunLoopThread(name: "member-inval")
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let timer = loop.timer(every: .seconds(3600))
      let readiness = try loop.readiness(of: pipe.read)
      let activities = loop.activities([.entry])
      let ended = AtomicCounter()
      let t1 = Task {
        for await _ in timer {}
        ended.increment()
      }
      let t2 = Task {
        for await _ in readiness {}
        ended.increment()
      }
      let t3 = Task {
        for await _ in activities {}
        ended.increment()
      }
      try await Task.sleep(for: .milliseconds(20))
      await execOnNewThread {
        timer.invalidate()
        readiness.invalidate()
        activities.invalidate()
      }
      _ = await (t1.value, t2.value, t3.value)
      await execShutdown(loop)
      return ended.current
    }
    #expect(outcome == 3)
  }

  /// Promised: cancelling the consuming task ends a waiting timer / readiness consumer (nil), and
  /// the member leaves the loop (a timer sequence's timer is invalidated).
  @Test func cancellingWaitingMemberConsumersEndsThem() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "cancelled member consumers") {
      () async throws -> (Bool, Bool) in
      let loop = try RunLoopThread(name: "member-cancel")
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let timer = loop.timer(every: .seconds(3600))
      let readiness = try loop.readiness(of: pipe.read)
      let t1 = Task { () -> Int in
        var n = 0
        for await _ in timer { n += 1 }
        return n
      }
      let t2 = Task { () -> Int in
        var n = 0
        for await _ in readiness { n += 1 }
        return n
      }
      try await Task.sleep(for: .milliseconds(20))
      t1.cancel()
      t2.cancel()
      let counts = await (t1.value, t2.value)
      let timerGone = await pollEveryMillisecond { !timer.timer.isValid }
      await execShutdown(loop)
      return (counts == (0, 0), timerGone)
    }
    #expect(outcome?.0 == true)
    #expect(outcome?.1 == true)
  }

  /// Readiness: a readable pipe yields, draining it lets the consumer wait again, the next write
  /// yields again; closing its loop then ends it.
  @Test func readinessYieldsPerWriteAfterEachDrain() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "readiness per write") { () async throws -> Int in
      let loop = try RunLoopThread(name: "ready")
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let readiness = try loop.readiness(of: pipe.read)
      let count = AtomicCounter()
      let consumer = Task {
        for await _ in readiness {
          drainDescriptor(pipe.read)
          if count.increment() == 3 { break }
        }
      }
      for round in 1...3 {
        writeByte(pipe.write)
        #expect(await pollEveryMillisecond { count.current >= round })
      }
      await consumer.value
      await execShutdown(loop)
      return count.current
    }
    #expect(outcome == 3)
  }

  /// Activities: a consumer on another executor sees `entry` and `exit` of nested runs in pairs
  /// and in order.
  @Test func activitySequenceSeesNestedRunsEntryExitInOrder() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "activities of nested runs") {
      () async throws -> [LoopActivity] in
      let loop = try RunLoopThread(name: "act")
      let hold = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(hold, to: endRaceModeA)
      let activities = loop.activities([.entry, .exit], modes: [endRaceModeA])
      let seen = Guarded<[LoopActivity]>([])
      let consumer = Task {
        for await event in activities { seen.withLock { $0.append(event.activity) } }
      }
      for _ in 0..<3 {
        _ = try loop.performAndWait { loop.run(mode: endRaceModeA, for: .milliseconds(1)) }
      }
      #expect(await pollEveryMillisecond { seen.snapshot.count >= 6 })
      activities.invalidate()
      await consumer.value
      await execShutdown(loop)
      return seen.snapshot
    }
    #expect(outcome == [.entry, .exit, .entry, .exit, .entry, .exit])
  }

  /// A one-shot timer sequence delivers exactly one tick, then ends, even when the consumer asks
  /// late.
  @Test func oneShotTimerSequenceDeliversOneTickToALateConsumer() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "one-shot late") { () async throws -> Int in
      let loop = try RunLoopThread(name: "oneshot")
      let timer = loop.timer(after: .milliseconds(1))
      #expect(await pollEveryMillisecond { !timer.timer.isValid })
      var n = 0
      for await _ in timer { n += 1 }
      await execShutdown(loop)
      return n
    }
    #expect(outcome == 1)
  }
}
