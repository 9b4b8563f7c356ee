import Glibc
import Testing

@testable import AsyncRunLoop

/// Bursts of registration changes from other threads, larger than one inbox chunk
/// (`LoopInbox.controlChunkCapacity`): still applied in the order each thread made them, with
/// one `cancel` for every `schedule`.
@Suite("Bursts of cross-thread changes")
struct ControlBurstTests {
  /// A source that counts its schedule and cancel routines.
  final class CountedSource: Sendable {
    let schedules = AtomicCounter()
    let cancels = AtomicCounter()
    let source: InputSource

    init() {
      let schedules = self.schedules
      let cancels = self.cancels
      source = InputSource(
        schedule: { _, _, _ in schedules.increment() }, cancel: { _, _ in cancels.increment() }, perform: { _ in })
    }
  }

  /// Three threads add and remove their own sources 1,000 times each while the loop is blocked,
  /// so that about 24,000 changes wait in the inbox at once (some two dozen chunks). Each add
  /// after a removal is a new stay on the loop: its schedule runs, and the removal's cancel.
  @Test func aBurstAcrossManyChunksKeepsEachThreadsOrder() async throws {
    let loop = try RunLoopThread(name: "burst")
    defer { loop.shutdown() }
    let rounds = 1_000
    let perThread = 4
    let sources = (0..<3).map { _ in (0..<perThread).map { _ in CountedSource() } }
    let outcome = await execOnNewThread { () -> [[(schedules: Int, cancels: Int, modes: Int)]] in
      let release = blockLoop(loop)
      race(
        sources.map { own in
          {
            for round in 0..<rounds {
              for counted in own { loop.add(counted.source) }
              // The last round leaves the even-numbered sources in the mode.
              for (index, counted) in own.enumerated() where round < rounds - 1 || index % 2 == 1 {
                loop.remove(counted.source)
              }
            }
          }
        })
      release.open()
      let modes = try! loop.performAndWait {
        sources.map { own in own.map { loop.core.modeCount(of: $0.source) } }
      }
      return sources.enumerated().map { thread, own in
        own.enumerated().map { index, counted in
          (counted.schedules.current, counted.cancels.current, modes[thread][index])
        }
      }
    }
    for (thread, own) in outcome.enumerated() {
      for (index, counts) in own.enumerated() {
        let stays = index % 2 == 0 ? 1 : 0
        #expect(counts.schedules == rounds, "thread \(thread) source \(index)")
        #expect(counts.cancels == rounds - stays, "thread \(thread) source \(index)")
        #expect(counts.modes == stays, "thread \(thread) source \(index)")
      }
    }
    for own in sources { for counted in own { counted.source.invalidate() } }
  }
}
