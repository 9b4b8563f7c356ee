import Glibc
import Testing

@testable import AsyncRunLoop

private let silencingMode: RunLoopMode = "silenced-descriptor-other"

/// Readiness sources silenced while the loop runs a mode that does not hold them: a mode switch
/// arms only the silenced ones again (`LoopDescriptors.silenced`), so it costs the same with
/// 20k descriptors on the loop as with none; nothing silenced is lost, and nothing detached stays
/// listed. All on the loop thread, in one block.
@Suite("Silenced descriptors")
struct SilencedDescriptorTests {
  /// Readable pipes whose sources, in `.default`, count their fires and drain.
  private final class Pipes: Sendable {
    let ends: [(read: Int32, write: Int32)]
    let sources: [DescriptorSource]
    let fires: Locked<[Int]>

    init(_ count: Int) {
      let ends = (0..<count).map { _ in makePipe() }
      let fires = Locked([Int](repeating: 0, count: count))
      self.ends = ends
      self.fires = fires
      sources = ends.enumerated().map { index, end in
        DescriptorSource(descriptor: end.read) { _, _ in
          _ = drainDescriptor(end.read)
          fires.withLock { $0[index] += 1 }
        }
      }
    }

    func makeReadable() { for end in ends { writeByte(end.write) } }

    func close() {
      for end in ends {
        Glibc.close(end.read)
        Glibc.close(end.write)
      }
    }
  }

  /// Runs `silencingMode` (kept alive by a far-future timer) long enough for the readable
  /// descriptors of `.default` to report there and be silenced. Loop thread of `loop`.
  private static func runTheOtherMode(_ loop: RunLoopThread) {
    loop.run(mode: silencingMode, until: .now.advanced(by: .milliseconds(30)))
  }

  private static func record(of source: DescriptorSource, on loop: RunLoopThread) -> MemberRecord? {
    source.withBinding { $0.record(on: loop.shared) }
  }

  @Test func aSourceSilencedInANestedRunFiresOnceItsModeRunsAgain() throws {
    let loop = try RunLoopThread(name: "silenced-one")
    let pipes = Pipes(1)
    let keepAlive = LoopTimer(after: .seconds(3_600)) { _ in }
    loop.add(keepAlive, to: silencingMode)
    let (firedInOtherMode, listedThere, fired, listedAfter) = try loop.performAndWait {
      try loop.add(pipes.sources[0])
      pipes.makeReadable()
      Self.runTheOtherMode(loop)
      let firedInOtherMode = pipes.fires.withLock { $0[0] }
      let listedThere = loop.core.descriptors.silenced.count
      loop.run(mode: .default, until: .now)
      return (firedInOtherMode, listedThere, pipes.fires.withLock { $0[0] }, loop.core.descriptors.silenced.count)
    }
    #expect(firedInOtherMode == 0)
    #expect(listedThere == 1)
    #expect(fired == 1)
    #expect(listedAfter == 0)
    keepAlive.invalidate()
    loop.shutdownAndWait()
    pipes.close()
  }

  /// Removing half of many silenced sources (each removal moves the list's last entry into its
  /// place) leaves the others listed: each fires exactly once when `.default` runs again, and the
  /// removed ones never.
  @Test func removingSilencedSourcesKeepsTheOthersListed() throws {
    let loop = try RunLoopThread(name: "silenced-many")
    let count = 64
    let pipes = Pipes(count)
    let keepAlive = LoopTimer(after: .seconds(3_600)) { _ in }
    loop.add(keepAlive, to: silencingMode)
    let (listedThere, listedAfterRemovals, listedAfter) = try loop.performAndWait {
      for source in pipes.sources { try loop.add(source) }
      pipes.makeReadable()
      Self.runTheOtherMode(loop)
      let listedThere = loop.core.descriptors.silenced.count
      for index in stride(from: 0, to: count, by: 2) { loop.remove(pipes.sources[index]) }
      let listedAfterRemovals = loop.core.descriptors.silenced.count
      loop.run(mode: .default, until: .now)
      return (listedThere, listedAfterRemovals, loop.core.descriptors.silenced.count)
    }
    #expect(listedThere == count)
    #expect(listedAfterRemovals == count / 2)
    #expect(listedAfter == 0)
    let fires = pipes.fires.withLock { $0 }
    #expect(fires.enumerated().allSatisfy { index, fired in fired == (index % 2 == 0 ? 0 : 1) }, "\(fires)")
    keepAlive.invalidate()
    loop.shutdownAndWait()
    pipes.close()
  }

  /// Invalidation and shutdown detach silenced sources: none stays listed, and an invalidated one
  /// never fires.
  @Test func detachingSilencedSourcesUnlistsThem() throws {
    let loop = try RunLoopThread(name: "silenced-detached")
    let pipes = Pipes(8)
    let keepAlive = LoopTimer(after: .seconds(3_600)) { _ in }
    loop.add(keepAlive, to: silencingMode)
    let (listedThere, listedAfter) = try loop.performAndWait {
      for source in pipes.sources { try loop.add(source) }
      pipes.makeReadable()
      Self.runTheOtherMode(loop)
      let listedThere = loop.core.descriptors.silenced.count
      for source in pipes.sources.prefix(4) { source.invalidate() }
      return (listedThere, loop.core.descriptors.silenced.count)
    }
    #expect(listedThere == 8)
    #expect(listedAfter == 4)
    loop.shutdownAndWait()
    #expect(loop.core.descriptors.silenced.isEmpty)
    // The invalidated ones never fire; the others may, once, in the pass after the block.
    let fires = pipes.fires.withLock { $0 }
    #expect(fires.prefix(4).allSatisfy { $0 == 0 } && fires.suffix(4).allSatisfy { $0 <= 1 }, "\(fires)")
    keepAlive.invalidate()
    pipes.close()
  }

  /// A paused registration resumed while the loop runs a mode that does not hold it stays out of
  /// the epoll set (armed there, it would only be silenced again at its next event); the next run
  /// of its own mode arms it.
  @Test func aSourceResumedInAnotherModeIsArmedByItsOwnMode() throws {
    let loop = try RunLoopThread(name: "silenced-resumed")
    let pipes = Pipes(1)
    let source = pipes.sources[0]
    let armedAfterResume = Locked<Bool?>(nil)
    let resume = LoopTimer(after: .zero) { _ in
      loop.core.setPaused(source, false)
      armedAfterResume.withLock { $0 = Self.record(of: source, on: loop)?.isArmed }
    }
    let (armedWhilePaused, firedInOtherMode, fired) = try loop.performAndWait {
      try loop.add(source)
      loop.core.setPaused(source, true)
      let armedWhilePaused = Self.record(of: source, on: loop)?.isArmed
      pipes.makeReadable()
      loop.add(resume, to: silencingMode)
      Self.runTheOtherMode(loop)
      let firedInOtherMode = pipes.fires.withLock { $0[0] }
      loop.run(mode: .default, until: .now)
      return (armedWhilePaused, firedInOtherMode, pipes.fires.withLock { $0[0] })
    }
    #expect(armedWhilePaused == false)
    #expect(armedAfterResume.withLock { $0 } == false)
    #expect(firedInOtherMode == 0)
    #expect(fired == 1)
    loop.shutdownAndWait()
    pipes.close()
  }
}
