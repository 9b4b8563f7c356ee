import Dispatch
import Glibc
import Testing

@testable import AsyncRunLoop

/// "A producer on the loop's own thread never wakes it" (One pass of the loop).
@Suite struct ProducersOnTheLoopThreadTests {
  /// Also a readiness handler, which runs right after the wake-up (once observers were told
  /// afterWaiting): a command it posts to a source of its own loop, or a block it performs there,
  /// does not wake the loop again. So each readiness costs the loop one wake-up and one pass; a
  /// wake written to the loop's eventfd would end its next sleep at once, a second, spurious one.
  @Test func workHandedToItsOwnLoopByAReadinessHandlerDoesNotWakeTheLoop() throws {
    let loop = try RunLoopThread(name: "readiness-producer")
    defer { loop.shutdownAndWait() }
    var pipeEnds: [Int32] = [0, 0]
    try #require(pipe(&pipeEnds) == 0)
    let (readEnd, writeEnd) = (pipeEnds[0], pipeEnds[1])
    defer {
      close(readEnd)
      close(writeEnd)
    }
    let handled = DispatchSemaphore(value: 0)
    let commands = CommandSource<Int> { _ in handled.signal() }
    loop.add(commands.source, to: .default)
    let reader = DescriptorSource(descriptor: readEnd, interest: .readable) { _, _ in
      var byte: UInt8 = 0
      _ = read(readEnd, &byte, 1)
      // On the loop's thread, after the wake-up: a command, a block.
      commands.post(1)
      loop.perform {}
    }
    try loop.add(reader, to: .default)
    let rounds = 50
    let before = try loop.performAndWait { loop.metrics }
    for round in 0..<rounds {
      var byte: UInt8 = 1
      try #require(write(writeEnd, &byte, 1) == 1)
      try #require(handled.wait(timeout: .now() + .seconds(20 * watchdogScale)) == .success, "round \(round)")
    }
    let after = try loop.performAndWait { loop.metrics }
    reader.invalidate()
    commands.source.invalidate()
    let delta = after - before
    // One wake-up and one pass per round (the pipe), one more for the reading block; a little
    // slack for a sleep that ended early for another reason.
    #expect(delta.wakeUps <= UInt64(rounds) + 5, "\(delta.wakeUps) wake-ups for \(rounds) readiness rounds")
    #expect(delta.passes <= UInt64(rounds) + 5, "\(delta.passes) passes for \(rounds) readiness rounds")
    #expect(delta.wakeUps >= UInt64(rounds))
  }
}
