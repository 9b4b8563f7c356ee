import Glibc
import Testing

@testable import AsyncRunLoop

private struct BlockError: Error, Equatable {}

/// Asks `loop` for a value through the non-throwing `performAndWait`: this compiles only because
/// that overload throws `RunLoopError` (typed).
private func isOnLoopThread(asking loop: RunLoopThread) throws(RunLoopError) -> Bool {
  try loop.performAndWait { loop.isOnLoopThread }
}

/// `performAndWait` with a block that cannot throw throws only `RunLoopError`, typed, on every
/// path (inline on the loop thread, across threads, refused at shutdown); with a throwing block
/// it still rethrows the block's own error.
@Suite struct TypedPerformAndWaitTests {
  @Test func aNonThrowingBlockRunsOnTheLoopAndThrowsOnlyRunLoopError() throws {
    let loop = try RunLoopThread(name: "typed-paw")
    #expect(try isOnLoopThread(asking: loop))
    // Inline: on the loop's own thread the typed call runs the block at once.
    let inline = try loop.performAndWait { () -> Bool in (try? isOnLoopThread(asking: loop)) ?? false }
    #expect(inline)
    loop.shutdownAndWait()
    do {
      _ = try isOnLoopThread(asking: loop)
      Issue.record("performAndWait ran on a shut-down loop")
    } catch {
      #expect(error == .shutDown(loop: "typed-paw"))  // `error` is a RunLoopError: no cast
    }
  }

  @Test func aThrowingBlockStillRethrowsItsOwnError() throws {
    let loop = try RunLoopThread(name: "typed-paw-rethrow")
    defer { loop.shutdownAndWait() }
    #expect(throws: BlockError()) { try loop.performAndWait { () throws -> Int in throw BlockError() } }
    #expect(try loop.performAndWait { () throws -> Int in 7 } == 7)
  }
}
