import Glibc
import Testing

@testable import AsyncRunLoop

/// The documented way to await writability next to a reader of the same descriptor on one loop:
/// a second sequence on a `dup()` of it. Both deliver, each with its own interest.
@Suite struct ReadAndWriteReadinessOfOneDescriptorTests {
  @Test func aWriterOnADuplicateWorksBesideAReaderOnTheOriginal() async throws {
    let loop = try RunLoopThread(name: "dup-readiness")
    defer { loop.shutdownAndWait() }
    var pair: [Int32] = [-1, -1]
    #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0)
    let (socket, peer) = (pair[0], pair[1])
    #expect(fcntl(socket, F_SETFL, fcntl(socket, F_GETFL) | O_NONBLOCK) == 0)  // the duplicate shares it
    let duplicate = dup(socket)
    #expect(duplicate >= 0)
    defer {
      for descriptor in [socket, peer, duplicate] { close(descriptor) }
    }
    let readable = try loop.readiness(of: socket, events: .readable)
    let writable = try loop.readiness(of: duplicate, events: .writable)
    writeByte(peer)
    let outcome = try await withWatchdog(timeout: .seconds(30), "both directions") {
      () -> (read: DescriptorEvents?, write: DescriptorEvents?) in
      var readIterator = readable.makeAsyncIterator()
      var writeIterator = writable.makeAsyncIterator()
      let write = await writeIterator.next()
      let read = await readIterator.next()
      return (read, write)
    }
    #expect(outcome?.read?.contains(.readable) == true)
    #expect(outcome?.write?.contains(.writable) == true)
    #expect(outcome?.read?.contains(.error) == false)
    #expect(readable.registrationError == nil && writable.registrationError == nil)
    #expect(drainDescriptor(socket) == 1)
    readable.invalidate()
    writable.invalidate()
  }
}
