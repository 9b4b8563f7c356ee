import Dispatch
import Glibc

// A TCP echo server on a loop thread, with one actor per connection pinned to that loop
// (`LoopActor`): a `DescriptorSource` on the listening socket accepts, and each connection's
// actor awaits its socket's readiness (`loop.readiness(of:events:)`) and echoes what it reads.
// The example is its own client: it opens a few connections to 127.0.0.1, sends messages on
// each in turn, checks every echo, closes them, waits for the server to see every close, shuts
// the server down and exits 0.
//
// Each connection has one message in flight at a time, so the server's writes never find a full
// send buffer. A server that must wait for writability would need a second readiness
// registration for the same descriptor next to the readable one, which a loop refuses today
// (one registration per descriptor and loop; see issue 25).
//
// Run it: swift run EchoServerExample

let connectionCount = 3
let messagesPerConnection = 5
/// How long the client waits for an echo, or for the server to see a close, before failing.
let watchdogSeconds = 10

func runExample() throws {
  let server = try EchoServer()
  print("[client] echo server listening on 127.0.0.1:\(server.port)")

  let sockets = try (1...connectionCount).map { _ in
    try connectToLoopback(port: server.port, timeoutSeconds: watchdogSeconds)
  }
  var sentBytes = 0
  for message in 1...messagesPerConnection {
    for (index, socket) in sockets.enumerated() {
      let text = "message \(message) on connection \(index + 1)\n"
      try sendAll(socket, Array(text.utf8)[...])
      let echo = try receiveExactly(socket, count: text.utf8.count)
      guard echo == Array(text.utf8) else {
        fatalError("connection \(index + 1): sent \(text.debugDescription), got \(echo)")
      }
      sentBytes += echo.count
      print("[client] echoed: \(text.dropLast())")
    }
  }
  for socket in sockets { close(socket) }

  for _ in sockets {
    guard server.log.ended.wait(timeout: .now() + .seconds(watchdogSeconds)) == .success else {
      fatalError("the server did not see every connection close within \(watchdogSeconds) seconds")
    }
  }
  let accepted = server.log.accepted.load(ordering: .relaxed)
  let echoed = server.log.echoedBytes.load(ordering: .relaxed)
  server.shutdown()
  precondition(accepted == connectionCount, "the server accepted \(accepted) connections")
  precondition(echoed == sentBytes, "the server echoed \(echoed) bytes, the client sent \(sentBytes)")
  print(
    "done: \(connectionCount) connections × \(messagesPerConnection) messages, \(echoed) bytes echoed, server shut down"
  )
}

do {
  try runExample()
} catch {
  print("FAIL: \(error)")
  exit(1)
}
