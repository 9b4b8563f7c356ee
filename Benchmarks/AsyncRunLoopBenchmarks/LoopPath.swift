import AsyncRunLoop
import Glibc

// Issue 26: a loop sleeps one of two ways, and a scenario must say which it measured.
// - futex path: the loop watches no descriptor and no timer (only sources and jobs), so it sleeps
//   on a futex word and a producer wakes it with FUTEX_WAKE;
// - epoll path: a timer and a descriptor are registered (a realistic service loop), so it sleeps
//   in epoll_wait and a producer wakes it with an eventfd write.
// Each path has its matched floor: two plain threads that wait the same way (`floor-futex`,
// `floor-epoll`); `floor-eventfd` (a blocking read()) is the bare floor of both.

/// How a loop under measurement sleeps.
enum LoopPath: String, CaseIterable, Sendable {
  case futex
  case epoll

  /// Appended to a peer's name: `asyncrunloop` is the futex path, `asyncrunloop-epoll` the epoll path.
  var peerSuffix: String { self == .futex ? "" : "-epoll" }

  /// The floor whose two ends wait the way this path's loop does.
  var matchedFloor: String { self == .futex ? "floor-futex" : "floor-epoll" }
}

/// What puts a loop on the epoll path: a timer an hour away (the timerfd stays armed) and a
/// descriptor source on an eventfd nobody writes (never ready). Neither ever fires, so the only
/// difference from the futex path is how the loop sleeps and how a producer wakes it.
final class EpollPathMembers: Sendable {
  private let loop: RunLoopThread
  private let timer: LoopTimer
  private let source: DescriptorSource
  private let idle: EventDoorbell

  init(on loop: RunLoopThread) {
    self.loop = loop
    idle = EventDoorbell(nonBlocking: true)
    timer = LoopTimer(after: .seconds(3_600)) { _ in }
    source = DescriptorSource(descriptor: idle.descriptor) { _, _ in }
    loop.add(timer, to: .default)
    try! loop.add(source, to: .default)
  }

  /// Puts `loop` on `path`: nil for the futex path (nothing to add).
  static func place(_ loop: RunLoopThread, on path: LoopPath) -> EpollPathMembers? {
    path == .epoll ? EpollPathMembers(on: loop) : nil
  }

  /// Takes the members off the loop (before it shuts down) and closes the eventfd.
  func remove() {
    timer.invalidate()
    source.invalidate()
    // The source leaves on the loop thread; wait for that before closing its descriptor.
    _ = try? loop.performAndWait {}
    idle.close()
  }
}
