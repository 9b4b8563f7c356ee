import Glibc

/// A failed socket call: which call, and the errno it left.
struct SocketError: Error, CustomStringConvertible {
  var call: String
  var code: Int32

  init(_ call: String, code: Int32 = errno) {
    self.call = call
    self.code = code
  }

  var description: String { "\(call): \(String(cString: strerror(code)))" }
}

/// 127.0.0.1:`port` (`port` 0: let the kernel pick one).
func loopbackAddress(port: UInt16) -> sockaddr_in {
  var address = sockaddr_in()
  address.sin_family = sa_family_t(AF_INET)
  address.sin_port = port.bigEndian
  address.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian  // INADDR_LOOPBACK
  return address
}

/// A non-blocking TCP socket listening on 127.0.0.1 at a port the kernel picks.
/// - Returns: The descriptor and the port.
func listenOnLoopback() throws(SocketError) -> (descriptor: Int32, port: UInt16) {
  let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
  guard descriptor >= 0 else { throw SocketError("socket") }
  var address = loopbackAddress(port: 0)
  var length = socklen_t(MemoryLayout<sockaddr_in>.size)
  let bound = withUnsafeMutablePointer(to: &address) {
    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
      bind(descriptor, pointer, length) == 0 && getsockname(descriptor, pointer, &length) == 0
    }
  }
  guard bound, listen(descriptor, 16) == 0 else {
    let error = SocketError("bind/listen")
    close(descriptor)
    throw error
  }
  return (descriptor, UInt16(bigEndian: address.sin_port))
}

/// Accepts one pending connection as a non-blocking socket; nil when none is pending (EAGAIN).
/// (`accept4` would take `SOCK_NONBLOCK` in the same call, but Swift's Glibc module does not
/// export it: it is declared only under `_GNU_SOURCE`. So `accept`, then `fcntl`.)
func acceptConnection(on listener: Int32) throws(SocketError) -> Int32? {
  while true {
    let descriptor = accept(listener, nil, nil)
    if descriptor >= 0 {
      guard fcntl(descriptor, F_SETFL, fcntl(descriptor, F_GETFL) | O_NONBLOCK) == 0 else {
        let error = SocketError("fcntl(O_NONBLOCK)")
        close(descriptor)
        throw error
      }
      return descriptor
    }
    switch errno {
    case EAGAIN, EWOULDBLOCK: return nil
    case EINTR, ECONNABORTED: continue  // interrupted, or the peer gave up first: try the next one
    default: throw SocketError("accept4")
    }
  }
}

/// A blocking TCP connection to 127.0.0.1:`port` whose reads give up after `timeoutSeconds`
/// (the client's watchdog: a lost echo fails instead of hanging).
func connectToLoopback(port: UInt16, timeoutSeconds: Int) throws(SocketError) -> Int32 {
  let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
  guard descriptor >= 0 else { throw SocketError("socket") }
  var timeout = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
  var address = loopbackAddress(port: port)
  let connected = withUnsafePointer(to: &address) {
    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
      connect(descriptor, pointer, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
    }
  }
  guard connected, setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size)) == 0
  else {
    let error = SocketError("connect")
    close(descriptor)
    throw error
  }
  return descriptor
}

/// Writes all of `bytes` to a socket (no SIGPIPE). On a non-blocking socket whose send buffer is
/// full this throws EAGAIN: the echo server keeps one short message in flight per connection, so
/// its buffer never fills (see the example's comment).
func sendAll(_ descriptor: Int32, _ bytes: ArraySlice<UInt8>) throws(SocketError) {
  var sent = 0
  while sent < bytes.count {
    let count = bytes.withUnsafeBytes { buffer in
      send(descriptor, buffer.baseAddress! + sent, buffer.count - sent, Int32(MSG_NOSIGNAL))
    }
    if count >= 0 {
      sent += count
    } else if errno != EINTR {
      throw SocketError("send")
    }
  }
}

/// Reads exactly `count` bytes from a blocking socket.
func receiveExactly(_ descriptor: Int32, count: Int) throws(SocketError) -> [UInt8] {
  var bytes = [UInt8](repeating: 0, count: count)
  var received = 0
  while received < count {
    let result = bytes.withUnsafeMutableBytes { buffer in
      recv(descriptor, buffer.baseAddress! + received, count - received, 0)
    }
    if result > 0 {
      received += result
    } else if result == 0 {
      throw SocketError("recv (the server closed the connection)", code: ECONNRESET)
    } else if errno != EINTR {
      throw SocketError("recv")  // EAGAIN here: the read timeout passed
    }
  }
  return bytes
}
