import Glibc
import Synchronization
import Testing

@testable import AsyncRunLoop

/// runModal ends with its run, with shutdown, or at once when cancelled.
@Suite("runModal ends with its run, with shutdown, or at once when cancelled", .timeLimit(.minutes(10)))
struct ModalRunEndsTests {
  /// Shutting the loop down during a modal run ends it (`.stopped`, every run stops during
  /// shutdown); it does not hang and does not throw (the run was not refused).
  @Test func shutdownDuringAModalRunEndsIt() async throws {
    let loop = try RunLoopThread(name: "modal-shutdown")
    loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: "modal")
    let outcome = try await withWatchdog(timeout: .seconds(20), "modal run at shutdown") {
      () async -> Result<RunLoopRunResult, RunLoopError> in
      let modal = Task { () async -> Result<RunLoopRunResult, RunLoopError> in
        do throws(RunLoopError) {
          return .success(try await loop.runModal(mode: "modal"))
        } catch {
          return .failure(error)
        }
      }
      try? await Task.sleep(for: .milliseconds(20))
      await execOnNewThread { loop.shutdownAndWait() }
      return await modal.value
    }
    #expect(outcome == .success(.stopped))
  }

  /// A modal run accepted before shutdown whose block only gets to run in the drain returns (no
  /// hang, no throw).
  @Test func aModalRunAcceptedBeforeShutdownReturnsFromTheDrain() async throws {
    let loop = try RunLoopThread(name: "modal-drain")
    loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: "modal")
    let release = TestGate()
    let busy = TestGate()
    loop.perform {
      busy.open()
      release.wait(timeout: .seconds(20))
    }
    busy.wait(timeout: .seconds(20))
    let outcome = try await withWatchdog(timeout: .seconds(20), "modal run drained") {
      () async -> Result<RunLoopRunResult, RunLoopError> in
      let modal = Task { () async -> Result<RunLoopRunResult, RunLoopError> in
        do throws(RunLoopError) {
          return .success(try await loop.runModal(mode: "modal"))
        } catch {
          return .failure(error)
        }
      }
      try? await Task.sleep(for: .milliseconds(20))  // the modal block is queued behind the busy one
      loop.shutdown()
      release.open()
      return await modal.value
    }
    switch outcome {
    case .success(let result)?: #expect(result == .stopped || result == .finished, "\(result)")
    case .failure(let error)?: Issue.record("a modal run accepted before the shutdown threw \(error)")
    case nil: break
    }
    await execShutdown(loop)
  }

  /// A task already cancelled when it calls `runModal` (no deadline) gets `.stopped` at once.
  @Test func runModalFromACancelledTaskEndsAtOnce() async throws {
    let loop = try RunLoopThread(name: "modal-precancelled")
    loop.add(LoopTimer(after: .seconds(3600)) { _ in }, to: "modal")
    let outcome = try await withWatchdog(timeout: .seconds(20), "pre-cancelled modal run") {
      let task = Task { () async throws -> RunLoopRunResult in
        withUnsafeCurrentTask { $0?.cancel() }
        return try await loop.runModal(mode: "modal")
      }
      return try await task.value
    }
    #expect(outcome == .stopped)
    await execShutdown(loop)
  }

  /// Promise (runModal): it runs the mode while the caller is suspended, or throws
  /// `RunLoopError.shutDown` when the loop refused the run; a shutdown ends every run. Modal runs
  /// requested from a plain task and from an actor on the loop race the shutdown: each returns
  /// `.stopped` (or another result) or throws `shutDown`, and none hangs.
  @Test func runModalRacingTheShutdownNeverHangs() async throws {
    let outcomes = try await withWatchdog(timeout: .seconds(60), "runModal vs shutdown") { () -> [String: Int] in
      var outcomes: [String: Int] = [:]
      for round in 0..<100 {
        let loop = try RunLoopThread(name: "modal")
        let mode = RunLoopMode("modal-mode")
        let keep = LoopTimer(after: .seconds(3_600)) { _ in }
        loop.add(keep, to: mode)
        let actor = ClosureNestingActor(loop: loop) {}
        let plain = Task { () -> String in
          do { return "\(try await loop.runModal(mode: mode))" } catch { return "threw" }
        }
        let pinned = Task(executorPreference: loop) { () -> String in
          await actor.nestOnce()
          do { return "\(try await loop.runModal(mode: mode, for: .seconds(30)))" } catch { return "threw" }
        }
        if round % 2 == 0 { await Task.yield() }
        await execOnNewThread { loop.shutdownAndWait() }
        for outcome in [await plain.value, await pinned.value] { outcomes[outcome, default: 0] += 1 }
        keep.invalidate()
      }
      return outcomes
    }
    guard let outcomes else { return }
    // Never a hang, and never "finished": a modal run the drain starts after emptying the mode
    // ends stopped too (`aRunEnteredDuringTheShutdownDrainEndsStopped`).
    #expect(Set(outcomes.keys).isSubset(of: ["stopped", "threw"]), "\(outcomes)")
  }
}
