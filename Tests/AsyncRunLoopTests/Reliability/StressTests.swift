import Dispatch
import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// Many threads at once against one loop, repeated: exact counts, right threads, no hang.
/// `ASYNC_RUN_LOOP_STRESS=N` multiplies every count.
@Suite("Stress: many threads, repeated races", .timeLimit(.minutes(5)))
struct StressTests {
  @Test func shutdownRacingProducersRepeatedlyLosesNoCall() async throws {
    for round in 0..<(30 * stressFactor) {
      let loop = try RunLoopThread(name: "stress-sd")
      let counter = try ExecCounter(loop: loop)
      let perTask = 300
      let total = try await withWatchdog(timeout: .seconds(60), "round \(round)") {
        await execConcurrently(tasks: 3, times: perTask) {
          await counter.incrementChecked()
        } alongside: {
          usleep(UInt32((round * 37) % 300))
          loop.shutdownAndWait()
        }
        return await counter.count
      }
      #expect(total == 3 * perTask, "round \(round)")
    }
  }

  @Test func commandsPostedFromFourThreadsArriveOnceEachInPerThreadOrder() async throws {
    let loop = try RunLoopThread(name: "stress-cmd")
    let perThread = 10_000 * stressFactor
    let log = Locked<(next: [Int], outOfOrder: Int, offLoop: Int, total: Int)>(([0, 0, 0, 0], 0, 0, 0))
    let commands = CommandSource<(thread: Int, sequence: Int)> { command in
      let onLoop = loop.isOnLoopThread
      log.withLock { state in
        if state.next[command.thread] != command.sequence { state.outOfOrder += 1 }
        state.next[command.thread] = command.sequence + 1
        if !onLoop { state.offLoop += 1 }
        state.total += 1
      }
    }
    loop.add(commands.source)
    let rejected = Locked(0)
    let posters = (0..<4).map { thread in
      ExecThread {
        for sequence in 0..<perThread where !commands.post((thread, sequence)) {
          rejected.withLock { $0 += 1 }
        }
      }
    }
    await execOnNewThread { posters.forEach { $0.join() } }
    waitUntil("every command delivered") { log.withLock { $0.total } >= 4 * perThread }
    let state = log.withLock { $0 }
    #expect(rejected.withLock { $0 } == 0)
    #expect(state.total == 4 * perThread)
    #expect(state.outOfOrder == 0)
    #expect(state.offLoop == 0)
    #expect(state.next == [perThread, perThread, perThread, perThread])
    commands.source.invalidate()
    await execShutdown(loop)
  }

  /// Four threads add short timers and invalidate half of them at once: every timer that was not
  /// invalidated fires exactly once, none fires twice, all on the loop thread.
  @Test func timersAddedAndInvalidatedFromManyThreadsFireAtMostOnce() async throws {
    let loop = try RunLoopThread(name: "stress-timers")
    let perThread = 2_000 * stressFactor
    let fires = ExecFireCounts(count: 4 * perThread)
    let offLoop = Locked(0)
    let kept = Locked<[Int]>([])
    let adders = (0..<4).map { thread in
      ExecThread {
        var keptHere: [Int] = []
        for item in 0..<perThread {
          let index = thread * perThread + item
          let timer = LoopTimer(after: .microseconds((index * 13) % 200)) { _ in
            if !loop.isOnLoopThread { offLoop.withLock { $0 += 1 } }
            fires.fire(index)
          }
          loop.add(timer, to: .common)
          if item % 2 == 0 { timer.invalidate() } else { keptHere.append(index) }
        }
        kept.withLock { $0.append(contentsOf: keptHere) }
      }
    }
    await execOnNewThread { adders.forEach { $0.join() } }
    let keptIndices = kept.withLock { $0 }
    waitUntil("every kept timer fired") { fires.total(of: keptIndices) == keptIndices.count }
    _ = try loop.performAndWait { 0 }
    let counts = fires.snapshot()
    #expect(keptIndices.count == 2 * perThread)
    #expect(keptIndices.allSatisfy { counts[$0] == 1 })
    #expect(counts.allSatisfy { $0 <= 1 })
    #expect(offLoop.withLock { $0 } == 0)
    await execShutdown(loop)
  }

  @Test func manySleepsWithRandomCancellationAllResumeOnce() async throws {
    let loop = try RunLoopThread(name: "stress-sleep")
    let sleepers = 2_000 * stressFactor
    let outcome = try await withWatchdog(timeout: .seconds(120), "\(sleepers) sleepers") {
      await withTaskGroup(of: Bool?.self) { group in
        var tasks: [Task<Bool, Never>] = []
        for index in 0..<sleepers {
          let task = Task { () -> Bool in
            do {
              try await loop.clock.sleep(for: .microseconds((index * 31) % 300))
              return true
            } catch {
              return false
            }
          }
          tasks.append(task)
          if index % 3 == 0 { task.cancel() }
          if index % 7 == 0 { tasks[index / 2].cancel() }
        }
        for task in tasks { group.addTask { await task.value } }
        var resumed = 0
        var completed = 0
        for await value in group where value != nil {
          resumed += 1
          if value == true { completed += 1 }
        }
        return (resumed, completed)
      }
    }
    #expect(outcome?.0 == sleepers)
    #expect((outcome?.1 ?? 0) > 0)
    await execShutdown(loop)
  }

  @Test func actorsOnAGroupCallEachOtherInARing() async throws {
    let group = try LoopGroup(count: 4, name: "stress-ring")
    let counters = try (0..<8).map { _ in try ExecCounter(loop: group.next()) }
    let relays = (0..<8).map { ExecRelay(loop: counters[$0].loop, target: counters[($0 + 1) % 8]) }
    let calls = 2_000 * stressFactor
    let result = try await withWatchdog(timeout: .seconds(120), "ring calls") {
      await withTaskGroup(of: Void.self) { tasks in
        for relay in relays { tasks.addTask { await relay.relay(calls) } }
      }
      var counts: [Int] = []
      var offLoop = 0
      for counter in counters {
        counts.append(await counter.count)
        offLoop += await counter.offLoop
      }
      for relay in relays { offLoop += await relay.offLoop }
      return (counts, offLoop)
    }
    #expect(result?.0 == Array(repeating: calls, count: 8))
    #expect(result?.1 == 0)
    await execOnNewThread { group.shutdownAndWait() }
  }

  @Test func performAndWaitFromManyThreadsAtOnce() async throws {
    let loop = try RunLoopThread(name: "stress-paw")
    let perThread = 2_000 * stressFactor
    let sum = Locked(0)
    let wrong = Locked(0)
    let callers = (0..<4).map { thread in
      ExecThread {
        for item in 0..<perThread {
          let value = try? loop.performAndWait { () -> Int in
            loop.isOnLoopThread ? thread * perThread + item : -1
          }
          if value != thread * perThread + item { wrong.withLock { $0 += 1 } }
          sum.withLock { $0 += 1 }
        }
      }
    }
    await execOnNewThread { callers.forEach { $0.join() } }
    #expect(sum.withLock { $0 } == 4 * perThread)
    #expect(wrong.withLock { $0 } == 0)
    await execShutdown(loop)
  }
}

/// Per-timer fire counts.
final class ExecFireCounts: @unchecked Sendable {
  // Safety: `counts` is only touched with `lock` held.
  private let lock = PthreadLock.make()
  private var counts: [Int]
  init(count: Int) { counts = Array(repeating: 0, count: count) }
  func fire(_ index: Int) { lock.withLock { counts[index] += 1 } }
  func total(of indices: [Int]) -> Int { lock.withLock { indices.reduce(0) { $0 + min(counts[$1], 1) } } }
  func snapshot() -> [Int] { lock.withLock { counts } }
}
