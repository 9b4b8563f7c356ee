import AsyncRunLoop
import CAsyncRunLoop
import Glibc

// churn's epoll floor (issue 13): what the kernel alone charges to register and deregister an
// eventfd with an epoll instance that holds n of them, measured on a loop thread the way churn
// measures a loop-thread descriptor-source add. A descriptor source's add and removal make one
// `epoll_ctl` each; whatever growth with n this floor shows is the kernel's (its interest tree and
// the cache misses of a big one), and the part of a descriptor source's cost above it is the
// loop's own.

/// The eventfds of one measurement, handed to the loop thread whole.
private struct FloorDescriptors: @unchecked Sendable {
  // Safety: created on the measuring thread before the block that uses them is sent, and used
  // only by that block afterwards (the send orders the two); closed after the block returned.
  let descriptors: [Int32]

  init(count: Int) {
    descriptors = (0..<count).map { _ in
      let descriptor = eventfd(0, Int32(EFD_CLOEXEC) | Int32(EFD_NONBLOCK))
      precondition(descriptor >= 0, "eventfd failed: \(carl_errno())")
      return descriptor
    }
  }

  func close() { for descriptor in descriptors { _ = Glibc.close(descriptor) } }
}

/// Registers (`EPOLL_CTL_ADD`, readable, level-triggered, as a descriptor source's default) and
/// deregisters (`EPOLL_CTL_DEL`) descriptors with `epoll`. Returns ns per operation.
private func epollAddEach(_ epoll: Int32, _ descriptors: FloorDescriptors) -> Int64 {
  let start = monotonicNanoseconds()
  for (index, descriptor) in descriptors.descriptors.enumerated() {
    var event = carl_epoll_event_make(UInt32(EPOLLIN.rawValue), UInt64(index))
    precondition(epoll_ctl(epoll, EPOLL_CTL_ADD, descriptor, &event) == 0, "epoll_ctl ADD: \(carl_errno())")
  }
  return monotonicNanoseconds() - start
}

private func epollRemoveEach(_ epoll: Int32, _ descriptors: FloorDescriptors) -> Int64 {
  let start = monotonicNanoseconds()
  for descriptor in descriptors.descriptors {
    precondition(epoll_ctl(epoll, EPOLL_CTL_DEL, descriptor, nil) == 0, "epoll_ctl DEL: \(carl_errno())")
  }
  return monotonicNanoseconds() - start
}

/// One count of the epoll floor, as churn's descriptor-source peers at the same n: `fill` (a
/// fresh epoll instance, `count` eventfds made first, all added then all removed, in two
/// loop-thread blocks; medians of `rounds` rounds) or `steady` (the instance holds `count`, then
/// rounds of `SteadyChurnSession.batch` fresh eventfds added and removed; median of `rounds` after
/// a warm-up round). Value: ns per add; extras `remove_ns`, `n`, `rounds`.
final class EpollFloorSession: FigureSession {
  private let count: Int
  private let rounds: Int
  private let steady: Bool
  private let cpu: Int?

  init(count: Int, rounds: Int, steady: Bool, cpu: Int?) {
    self.count = count
    self.rounds = rounds
    self.steady = steady
    self.cpu = cpu
  }

  func measure() -> Figure {
    let loop = try! RunLoopThread(name: "churn-epoll-floor", cpu: cpu)
    defer { loop.shutdownAndWait() }
    let epoll = epoll_create1(Int32(EPOLL_CLOEXEC))
    precondition(epoll >= 0, "epoll_create1 failed: \(carl_errno())")
    defer { _ = Glibc.close(epoll) }
    let held = FloorDescriptors(count: steady ? count : 0)
    defer { held.close() }
    if steady { _ = try! loop.performAndWait { epollAddEach(epoll, held) } }
    let batch = steady ? SteadyChurnSession.batch : count
    if steady || count <= 1_000 { _ = measureRound(on: loop, epoll: epoll, batch: batch) }  // warm-up
    let measured = (0..<rounds).map { _ in measureRound(on: loop, epoll: epoll, batch: batch) }
    return Figure(
      value: median(measured.map(\.add)),
      extras: [("remove_ns", median(measured.map(\.remove))), ("n", Double(count)), ("rounds", Double(rounds))])
  }

  /// `batch` fresh eventfds added to `epoll`, then removed, each in a loop-thread block: ns per
  /// descriptor each.
  private func measureRound(on loop: RunLoopThread, epoll: Int32, batch: Int) -> (add: Double, remove: Double) {
    let fresh = FloorDescriptors(count: batch)
    defer { fresh.close() }
    let add = try! loop.performAndWait { epollAddEach(epoll, fresh) }
    let remove = try! loop.performAndWait { epollRemoveEach(epoll, fresh) }
    return (Double(add) / Double(batch), Double(remove) / Double(batch))
  }

  func close() {}
}
