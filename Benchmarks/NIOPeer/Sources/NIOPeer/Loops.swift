import AsyncRunLoop
import NIOCore
import NIOPosix

// The two kinds of server loop: an AsyncRunLoop `RunLoopThread` (on the futex or the epoll path)
// and a NIO `SelectableEventLoop` (a `MultiThreadedEventLoopGroup` of one thread). NIO's loop on
// Linux always sleeps in epoll_wait (its selector holds an eventfd for wake-ups and a timerfd), so
// its matched floor is `floor-epoll`.

/// How an AsyncRunLoop loop under measurement sleeps (as AsyncRunLoopBenchmarks' `LoopPath`).
enum LoopPath: String, Sendable {
  /// No descriptor, no timer: the loop sleeps on a futex word; a producer wakes it with FUTEX_WAKE.
  case futex
  /// A timer and a descriptor registered: the loop sleeps in epoll_wait; woken by an eventfd write.
  case epoll

  var suffix: String { self == .futex ? "" : "-epoll" }
  var matchedFloor: String { self == .futex ? "floor-futex" : "floor-epoll" }
}

/// What puts a loop on the epoll path (AsyncRunLoopBenchmarks' `EpollPathMembers`): a timer an
/// hour away and a descriptor source on an eventfd nobody writes. Neither ever fires.
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

  static func place(_ loop: RunLoopThread, on path: LoopPath) -> EpollPathMembers? {
    path == .epoll ? EpollPathMembers(on: loop) : nil
  }

  func remove() {
    timer.invalidate()
    source.invalidate()
    _ = try? loop.performAndWait {}
    idle.close()
  }
}

/// A NIO event loop on its own thread, pinned to `cpu` (from inside the loop, before measuring).
final class NIOLoop: Sendable {
  let group: MultiThreadedEventLoopGroup
  let loop: any EventLoop

  init(cpu: Int?) {
    group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
    loop = group.next()
    try! loop.submit { pinCurrentThread(cpu) }.wait()
    // The actors' executor is the loop itself (`NIOSerialEventLoopExecutor`: jobs are scheduled
    // as jobs), not NIO's fallback wrapper that puts each job in an `execute` closure.
    precondition((loop.executor as AnyObject) === (loop as AnyObject), "NIO's loop is not its own executor")
  }

  func shutdown() { try! group.syncShutdownGracefully() }
}
