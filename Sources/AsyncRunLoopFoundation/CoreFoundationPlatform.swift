import CoreFoundation

#if canImport(Glibc)
  import Glibc
#endif

/// Everything that differs between swift-corelibs-foundation's CoreFoundation (Linux) and
/// Darwin's: mode names, strings, and how CF watches a descriptor. The rest of the bridge is the
/// same on both. Verified on Linux (Swift 6.3.1); the Darwin branches follow Darwin's headers and
/// are not built here (the AsyncRunLoop core is Linux-only: epoll, eventfd, timerfd).
enum CFPlatform {
  #if canImport(Darwin)
    static var defaultMode: CFRunLoopMode { CFRunLoopMode.defaultMode }
    static var commonModes: CFRunLoopMode { CFRunLoopMode.commonModes }
    /// The mode argument `CFRunLoopPerformBlock` takes (a `CFTypeRef` on both platforms).
    static func performMode(_ mode: CFRunLoopMode) -> CFTypeRef { mode.rawValue }
    static func mode(named name: String) -> CFRunLoopMode { CFRunLoopMode(rawValue: cfString(name)) }
    static func name(of mode: CFRunLoopMode) -> String { string(mode.rawValue) }
  #else
    static var defaultMode: CFRunLoopMode { kCFRunLoopDefaultMode }
    static var commonModes: CFRunLoopMode { kCFRunLoopCommonModes }
    static func performMode(_ mode: CFRunLoopMode) -> CFTypeRef { mode }
    static func mode(named name: String) -> CFRunLoopMode { cfString(name) }
    static func name(of mode: CFRunLoopMode) -> String { string(mode) }
  #endif

  /// A CFString holding `text` (no toll-free bridging on Linux).
  static func cfString(_ text: String) -> CFString {
    guard let string = CFStringCreateWithCString(nil, text, CFStringBuiltInEncodings.UTF8.rawValue) else {
      preconditionFailure("AsyncRunLoopFoundation: cannot make a CFString of \(text)")
    }
    return string
  }

  /// The text of a CFString.
  static func string(_ string: CFString) -> String {
    let capacity =
      CFStringGetMaximumSizeForEncoding(CFStringGetLength(string), CFStringBuiltInEncodings.UTF8.rawValue) + 1
    var buffer = [CChar](repeating: 0, count: capacity)
    guard CFStringGetCString(string, &buffer, capacity, CFStringBuiltInEncodings.UTF8.rawValue) else { return "" }
    return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
  }

  /// Seconds from now until the CLOCK_MONOTONIC time `nanoseconds` (CF's run and timer APIs take
  /// intervals and absolute times, not monotonic instants).
  static func secondsUntil(monotonicNanoseconds nanoseconds: Int64) -> Double {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    let current = Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec)
    return max(0, Double(nanoseconds - current) / 1e9)
  }

  #if canImport(Darwin)
    /// Darwin: CF watches a descriptor with a `CFFileDescriptor` source (a version-1 source's port
    /// is a Mach port there). Not built here.
    static func makeDescriptorSource(
      descriptor: Int32, order: CFIndex, fired: @convention(c) (UnsafeMutableRawPointer?) -> Void
    ) -> CFRunLoopSource {
      preconditionFailure("AsyncRunLoopFoundation: hosting a loop in CFRunLoop needs the Linux core")
    }
  #else
    /// Linux: a version-1 source whose port is `descriptor`, which CF adds to the epoll set of
    /// each mode it is in and reports when it is readable; `fired` runs on the run loop's thread.
    ///
    /// CF acknowledges a wake-up by reading 8 bytes from the port. Measured with Swift 6.3.1: for
    /// an epoll descriptor that read fails (`EINVAL`), CF's check of it is an assertion compiled
    /// out of release builds, and the source fires; for an eventfd the read consumes its counter.
    /// The descriptor is only reported on a new readiness edge, so the host checks it itself
    /// before sleeping (`MainLoopBridge`).
    static func makeDescriptorSource(
      descriptor: Int32, order: CFIndex, fired: @convention(c) (UnsafeMutableRawPointer?) -> Void
    ) -> CFRunLoopSource {
      var context = CFRunLoopSourceContext1()
      context.version = 1
      // The port travels in `info` (+1: descriptor 0 must not read as a null pointer).
      context.info = UnsafeMutableRawPointer(bitPattern: Int(descriptor) + 1)
      context.getPort = { info in Int32(Int(bitPattern: info) - 1) }
      context.perform = fired
      let source = withUnsafeMutablePointer(to: &context) { pointer in
        pointer.withMemoryRebound(to: CFRunLoopSourceContext.self, capacity: 1) {
          CFRunLoopSourceCreate(nil, order, $0)
        }
      }
      guard let source else { preconditionFailure("AsyncRunLoopFoundation: CFRunLoopSourceCreate failed") }
      return source
    }
  #endif

  /// Whether `descriptor` is readable now (a zero-timeout poll).
  static func isReadable(_ descriptor: Int32) -> Bool {
    var entry = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
    return poll(&entry, 1, 0) == 1 && entry.revents & Int16(POLLIN) != 0
  }
}
