import AsyncRunLoop
import Dispatch
import Glibc
import Synchronization

/// One accepted connection, pinned to the server's loop: every isolated method runs on the loop's
/// thread, next to the listener's source, and no two at once.
actor EchoConnection: LoopActor {
  nonisolated let loop: RunLoopThread
  let id: Int
  private let socket: Int32

  init(id: Int, socket: Int32, loop: RunLoopThread) {
    self.id = id
    self.socket = socket
    self.loop = loop
  }

  /// Echoes what the peer sends until it closes the connection (or an error), then closes the
  /// socket. Runs on the loop's thread.
  /// - Returns: The number of bytes echoed.
  func serve() async -> Int {
    precondition(loop.isOnLoopThread, "the connection actor ran off its loop")
    defer { close(socket) }
    let readiness: ReadinessSequence
    do {
      readiness = try loop.readiness(of: socket, events: .readable)
    } catch {
      print("[server] connection \(id): cannot watch the socket: \(error)")
      return 0
    }
    // Deregister before the deferred close (declared later, so it runs first).
    defer { readiness.invalidate() }
    var echoed = 0
    var buffer = [UInt8](repeating: 0, count: 4096)
    for await _ in readiness {
      // Level-triggered: read until EAGAIN, then wait for the next element.
      while true {
        let count = buffer.withUnsafeMutableBytes { read(socket, $0.baseAddress, $0.count) }
        if count > 0 {
          do {
            try sendAll(socket, buffer[..<count])
          } catch {
            print("[server] connection \(id): \(error)")
            return echoed
          }
          echoed += count
        } else if count == 0 {
          print("[server] connection \(id): peer closed after \(echoed) bytes echoed")
          return echoed
        } else if errno == EAGAIN || errno == EWOULDBLOCK {
          break  // drained: wait for readiness
        } else if errno != EINTR {
          print("[server] connection \(id): \(SocketError("read"))")
          return echoed
        }
      }
    }
    return echoed  // the loop shut down
  }
}

/// What the connections report back: shared by the accept handler (loop thread) and the
/// connection tasks, read by the main thread.
final class ConnectionLog: Sendable {
  /// Connections accepted. Only the accept handler (loop thread) adds; relaxed is enough for a
  /// count that `ended` orders for the reader.
  let accepted = Atomic<Int>(0)
  /// Bytes echoed by connections that ended. Relaxed: each add happens before its `ended` signal,
  /// which orders it for the main thread's read.
  let echoedBytes = Atomic<Int>(0)
  /// Signalled once per connection that ended.
  let ended = DispatchSemaphore(value: 0)
}

/// A TCP echo server on a loop thread of its own: a readiness source on the listening socket
/// accepts connections, and each connection gets an `EchoConnection` actor on the same loop.
final class EchoServer: Sendable {
  let loop: RunLoopThread
  let port: UInt16
  let log = ConnectionLog()
  private let listener: Int32
  private let acceptSource: DescriptorSource

  /// Starts listening on 127.0.0.1 at a port the kernel picks. Any thread.
  init() throws {
    loop = try RunLoopThread(name: "echo-server")
    (listener, port) = try listenOnLoopback()
    acceptSource = DescriptorSource(descriptor: listener, interest: .readable) {
      [loop, listener, log] _, events in
      // Loop thread: accept every pending connection, each served by an actor on this loop.
      guard !events.contains(.error) else { return print("[server] the listening socket failed: \(events)") }
      do {
        while let socket = try acceptConnection(on: listener) {
          let id = log.accepted.add(1, ordering: .relaxed).newValue
          print("[server] accepted connection \(id)")
          let connection = EchoConnection(id: id, socket: socket, loop: loop)
          // The loop as the task's preference: its resumptions queue on the loop directly.
          Task(executorPreference: loop) {
            let echoed = await connection.serve()
            log.echoedBytes.add(echoed, ordering: .relaxed)
            log.ended.signal()
          }
        }
      } catch {
        print("[server] \(error)")
      }
    }
    // Added on the loop thread, where a failure to register throws (to this caller).
    try loop.performAndWait { [loop, acceptSource] in try loop.add(acceptSource) }
  }

  /// Stops accepting, closes the listener and shuts the loop down. Any thread but the loop's.
  func shutdown() {
    _ = try? loop.performAndWait { [acceptSource] in acceptSource.invalidate() }
    close(listener)
    loop.shutdownAndWait()
  }
}
