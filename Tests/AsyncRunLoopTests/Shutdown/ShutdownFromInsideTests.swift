import Dispatch
import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("Shutdown from inside, waits across loops", .serialized, .timeLimit(.minutes(10)))
struct ShutdownFromInsideTests {
  /// An actor that shuts down its own loop from one of its methods: the call returns, calls
  /// already queued behind it and later ones all complete, once, in order. (In the full parallel
  /// suite the 210 hops, most of them through the fallback queue and back to the starved
  /// cooperative pool, took 10–13 s: hence the watchdog.)
  @Test func anActorShuttingDownItsOwnLoopLeavesNoCallHanging() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(40), "own shutdown") { () async throws -> [Int] in
      let loop = try RunLoopThread(name: "own-shutdown")
      let actor = CallLoggingActor(loop: loop)
      let early = Task {
        for value in 0..<200 { _ = await actor.append(value) }
      }
      await actor.shutDownOwnLoop()
      await early.value
      for value in 200..<210 { _ = await actor.append(value) }
      let entries = await actor.entries
      await execShutdown(loop)
      return entries
    }
    guard let outcome else { return }
    #expect(outcome.filter { $0 >= 0 } == Array(0..<210))
    #expect(outcome.filter { $0 < 0 }.count == 1)
  }

  /// An actor on one loop waiting (`performAndWait`) for a block on another loop that shuts down
  /// meanwhile gets the result or `RunLoopError.shutDown`, never hangs.
  @Test func performAndWaitFromAnActorRacingTheOtherLoopsShutdownEnds() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(20), "cross-loop wait at shutdown") {
      () async throws -> [String] in
      let home = try RunLoopThread(name: "home")
      let actor = CallLoggingActor(loop: home)
      var answers: [String] = []
      for _ in 0..<30 {
        let other = try RunLoopThread(name: "other")
        async let answer = actor.waitFor(other)
        await execOnNewThread { other.shutdownAndWait() }
        answers.append(await answer)
      }
      await execShutdown(home)
      return answers.filter { $0 != "ran" && $0 != "shutDown" }
    }
    #expect(outcome == [])
  }

  /// README: `assumeIsolated` of an actor on the loop works in source handlers, timer and observer
  /// callouts, performed blocks and tasks that prefer the loop.
  @Test func assumeIsolatedHoldsInEveryKindOfLoopCallout() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "assumeIsolated everywhere") {
      () async throws -> Int in
      let loop = try RunLoopThread(name: "iso-all")
      let actor = CallLoggingActor(loop: loop)
      let done = AtomicCounter()
      let check: @Sendable () -> Void = {
        actor.assumeIsolated { isolated in _ = isolated.append(0) }
        done.increment()
      }
      let commands = CommandSource<Int> { _ in check() }
      loop.add(commands.source, to: .common)
      commands.post(1)
      let timer = LoopTimer(after: .zero) { _ in check() }
      loop.add(timer, to: .common)
      let observer = LoopObserver(activities: [.beforeWaiting], repeats: false) { _, _ in check() }
      loop.add(observer, to: .common)
      loop.perform(check)
      await Task(executorPreference: loop) { check() }.value
      #expect(await pollEveryMillisecond { done.current == 5 })
      commands.source.invalidate()
      await execShutdown(loop)
      return await actor.entries.count
    }
    #expect(outcome == 5)
  }
}
