import Dispatch
import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("Extreme deadlines", .serialized, .timeLimit(.minutes(10)))
struct ExtremeDeadlineTests {
  /// Deadlines in the past fire at once; deadlines at the end of time never fire and end on
  /// cancellation or invalidation; the loop keeps working meanwhile.
  @Test func pastAndEndOfTimeDeadlinesBehave() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "extreme deadlines") { () async throws -> [String] in
      let loop = try RunLoopThread(name: "extreme")
      var problems: [String] = []
      // Past: one tick at once.
      var pastTicks = 0
      for await _ in loop.timer(after: .seconds(-10)) { pastTicks += 1 }
      if pastTicks != 1 { problems.append("past timer ticks \(pastTicks)") }
      var minTicks = 0
      for await _ in loop.timer(at: LoopClock.Instant(nanoseconds: Int64.min)) { minTicks += 1 }
      if minTicks != 1 { problems.append("Int64.min timer ticks \(minTicks)") }
      let pastSleep = await Task(executorPreference: loop) { () -> Bool in
        (try? await Task.sleep(for: .seconds(-1))) != nil
      }.value
      if !pastSleep { problems.append("negative Task.sleep threw") }
      let pastClock = await Task { () -> Bool in
        (try? await loop.clock.sleep(until: LoopClock.Instant(nanoseconds: Int64.min))) != nil
      }.value
      if !pastClock { problems.append("past clock sleep threw") }
      // End of time: never fires; cancellation ends it.
      let forever = Task(executorPreference: loop) { () -> Bool in
        do {
          try await Task.sleep(for: .seconds(Int64.max))
          return false
        } catch { return error is CancellationError }
      }
      let foreverClock = Task { () -> Bool in
        do {
          try await loop.clock.sleep(until: .distantFuture)
          return false
        } catch { return error is CancellationError }
      }
      let farTimer = loop.timer(at: .distantFuture)
      let farConsumer = Task { () -> Int in
        var n = 0
        for await _ in farTimer { n += 1 }
        return n
      }
      let hugeInterval = loop.timer(every: .seconds(Int64.max))
      let hugeConsumer = Task { () -> Int in
        var n = 0
        for await _ in hugeInterval { n += 1 }
        return n
      }
      try await Task.sleep(for: .milliseconds(10))
      if (try? loop.performAndWait { 7 }) != 7 { problems.append("loop unresponsive") }
      forever.cancel()
      foreverClock.cancel()
      farTimer.invalidate()
      hugeInterval.invalidate()
      if !(await forever.value) { problems.append("forever sleep") }
      if !(await foreverClock.value) { problems.append("forever clock sleep") }
      if await farConsumer.value != 0 { problems.append("far timer ticked") }
      if await hugeConsumer.value != 0 { problems.append("huge interval ticked") }
      await execShutdown(loop)
      return problems
    }
    #expect(outcome == [])
  }
}
