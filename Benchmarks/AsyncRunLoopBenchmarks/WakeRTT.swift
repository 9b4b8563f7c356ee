import AsyncRunLoop
import CoreFoundation
import Dispatch
import Foundation
import Synchronization

// wake-rtt: the measuring thread (pinned to the client CPU) wakes a sleeping server, the server
// replies; one sample is one round trip. The client side is the same in every peer: it signals
// the server its own way, then blocks in read() on a reply eventfd, which every server rings.
// Before each round trip (untimed) the client waits until the thread that rang the reply is
// asleep again: without that, a server that is preempted right after replying is still awake
// when the next request comes (a run loop then takes it without sleeping, measured at ~2% of
// round trips sleeping), and the scenario would not measure waking a sleeping loop.

/// Takes `count` round trips of `roundTrip`, in microseconds; `settle` runs before each one,
/// outside the timed part.
@inline(__always)
func sampleRoundTrips(_ count: Int, settle: () -> Void = {}, _ roundTrip: () -> Void) -> [Double] {
  var samples: [Double] = []
  samples.reserveCapacity(count)
  for _ in 0..<count {
    settle()
    let start = monotonicNanoseconds()
    roundTrip()
    samples.append(microseconds(from: start, to: monotonicNanoseconds()))
  }
  return samples
}

/// Takes `count` round trips of an awaited `roundTrip`, in microseconds. Runs in the caller's
/// isolation, so an actor that measures stays on its own executor between round trips exactly as
/// if it had written the loop itself.
@inline(__always)
func sampleRoundTrips(
  _ count: Int, isolation: isolated (any Actor)? = #isolation, _ roundTrip: () async -> Void
) async -> [Double] {
  var samples: [Double] = []
  samples.reserveCapacity(count)
  for _ in 0..<count {
    let start = monotonicNanoseconds()
    await roundTrip()
    samples.append(microseconds(from: start, to: monotonicNanoseconds()))
  }
  return samples
}

/// A stop flag shared with a server thread.
final class StopFlag: Sendable {
  private let flag = Atomic<Bool>(false)
  /// Release/acquire: the server must see everything written before the stop.
  func set() { flag.store(true, ordering: .releasing) }
  var isSet: Bool { flag.load(ordering: .acquiring) }
}

/// The floors: a server thread that sleeps until the client signals it and writes the reply. The
/// client side and the shutdown are the same for all three; only where the server sleeps (and so
/// how the client signals it) differs.
final class FloorWake: LatencySession {
  /// Where the server thread sleeps.
  enum Sleep {
    /// floor-eventfd: blocks in read() on its (blocking) request eventfd — the bare floor.
    case read
    /// floor-epoll: sleeps in epoll_wait on its (non-blocking) request eventfd, as a loop on the
    /// epoll path does, then reads it.
    case epoll
    /// floor-futex: sleeps on a futex word, woken by an atomic add and FUTEX_WAKE, as a loop on
    /// the futex path is.
    case futex
  }

  private let ringRequest: @Sendable () -> Void
  private let closeRequest: @Sendable () -> Void
  private let reply = ReplyDoorbell()
  private let stop = StopFlag()
  private let server: PlainThread
  /// Whether the client waits for the server to sleep before each round trip (settled) or sends
  /// the next request at once (back-to-back: the server may still be awake).
  private let settled: Bool

  init(pin: PinPlan, sleepingIn sleep: Sleep, settled: Bool = true) {
    self.settled = settled
    switch sleep {
    case .read:
      let request = EventDoorbell()
      ringRequest = { request.ring() }
      closeRequest = { request.close() }
      server = PlainThread(name: "floor-eventfd", cpu: pin.serverCPU) { [reply, stop] in
        while true {
          request.wait()
          if stop.isSet { return }
          reply.ring()
        }
      }
    case .epoll:
      let request = EventDoorbell(nonBlocking: true)
      ringRequest = { request.ring() }
      closeRequest = { request.close() }
      let epoll = EpollWaiter(watching: request.descriptor)
      server = PlainThread(name: "floor-epoll", cpu: pin.serverCPU) { [reply, stop] in
        while true {
          epoll.wait()
          request.drain()
          if stop.isSet { break }
          reply.ring()
        }
        epoll.close()
      }
    case .futex:
      let request = FutexDoorbell()
      ringRequest = { request.ring() }
      closeRequest = {}
      server = PlainThread(name: "floor-futex", cpu: pin.serverCPU) { [reply, stop] in
        var seen: UInt32 = 0
        while true {
          request.wait(seen: &seen)
          if stop.isSet { return }
          reply.ring()
        }
      }
    }
  }

  func measure(_ count: Int) -> [Double] {
    let ringRequest = self.ringRequest
    return sampleRoundTrips(count, settle: settled ? reply.waitUntilRingerSleeps : {}) {
      ringRequest()
      reply.wait()
    }
  }

  func close() {
    stop.set()
    ringRequest()
    server.join()
    closeRequest()
    reply.close()
  }
}

/// asyncrunloop: a `CommandSource` on a `RunLoopThread` (sleeping in epoll_wait); `post` is
/// "append + signal + wake"; the handler rings the reply.
final class AsyncRunLoopWake: LatencySession {
  private let reply = ReplyDoorbell()
  /// The server loop (`fill` adds idle members to it).
  let loop: RunLoopThread
  private let source: CommandSource<UInt32>
  private let epollMembers: EpollPathMembers?
  private let settled: Bool

  /// On `path` (see `LoopPath`); `settled` false: back-to-back round trips.
  init(pin: PinPlan, path: LoopPath = .futex, settled: Bool = true) {
    self.settled = settled
    loop = try! RunLoopThread(name: "wake-server", cpu: pin.serverCPU)
    source = CommandSource { [reply] _ in reply.ring() }
    loop.add(source.source, to: .default)
    epollMembers = EpollPathMembers.place(loop, on: path)
  }

  func measure(_ count: Int) -> [Double] {
    sampleRoundTrips(count, settle: settled ? reply.waitUntilRingerSleeps : {}) {
      source.post(1)
      reply.wait()
    }
  }

  func close() {
    source.source.invalidate()
    epollMembers?.remove()
    loop.shutdownAndWait()
    reply.close()
  }
}

/// The public ways to make a Foundation RunLoop thread run something, for `foundation-wake-routes`.
enum FoundationWakeRoute: String, CaseIterable {
  /// `RunLoop.perform(_:)` (CFRunLoopPerformBlock, which does not wake) + `CFRunLoopWakeUp`.
  case performAndWakeUp = "perform+CFRunLoopWakeUp"
  /// A CFRunLoopSource version 0 (custom source): `CFRunLoopSourceSignal` + `CFRunLoopWakeUp`.
  case customSource = "cfsource0-signal+wakeup"
  /// A one-shot `Timer` due now, added from the client thread (`RunLoop.add(_:forMode:)` re-arms
  /// the loop's timerfd, which wakes it). Foundation API only.
  case timerDueNow = "timer-due-now"
}

/// foundation-runloop: a pthread running Foundation's RunLoop, woken by `route`.
/// The default route is the fastest public one measured by `--only foundation-wake-routes` on the
/// development machine (2 vCPU x86_64 VM, Swift 6.3.1, quick mode): `cfsource0-signal+wakeup`
/// (p50 7.7 µs, p99 14 µs) and `perform+CFRunLoopWakeUp` (p50 7.7 µs, p99 20 µs) tie at p50 and the
/// custom source has the better tail (and is the closest analogue of `CommandSource`);
/// `timer-due-now`, the only route that needs no CoreFoundation call, is ~3.5× slower (p50 28 µs).
/// `RunLoop.perform` alone does not wake the loop; `perform(_:on:with:waitUntilDone:)` needs the
/// Objective-C runtime (not on Linux); `SocketPort` was not measured (a socket message per wake on
/// top of the same wake-up).
final class FoundationRunLoopWake: LatencySession {
  private let reply = ReplyDoorbell()
  private let route: FoundationWakeRoute
  private let server: FoundationLoopThread
  private let source: CFCustomSource

  init(pin: PinPlan, route: FoundationWakeRoute = .customSource) {
    self.route = route
    let source = CFCustomSource(ringing: reply)
    self.source = source
    server = FoundationLoopThread(name: "foundation-wake", cpu: pin.serverCPU) { _ in
      CFRunLoopAddSource(CFRunLoopGetCurrent(), source.source, kCFRunLoopDefaultMode)
    }
  }

  func measure(_ count: Int) -> [Double] {
    let runLoop = server.runLoop!
    let cfRunLoop = server.cfRunLoop!
    let reply = self.reply
    switch route {
    case .performAndWakeUp:
      return sampleRoundTrips(count, settle: reply.waitUntilRingerSleeps) {
        runLoop.perform { reply.ring() }
        CFRunLoopWakeUp(cfRunLoop)
        reply.wait()
      }
    case .customSource:
      let source = self.source.source
      return sampleRoundTrips(count, settle: reply.waitUntilRingerSleeps) {
        CFRunLoopSourceSignal(source)
        CFRunLoopWakeUp(cfRunLoop)
        reply.wait()
      }
    case .timerDueNow:
      return sampleRoundTrips(count, settle: reply.waitUntilRingerSleeps) {
        runLoop.add(Timer(timeInterval: 0, repeats: false) { _ in reply.ring() }, forMode: .default)
        reply.wait()
      }
    }
  }

  func close() {
    server.shutdown()
    source.invalidate()
    reply.close()
  }
}

/// dispatch-queue: `queue.async { reply }` on a serial queue (a libdispatch worker thread, which
/// cannot be pinned).
final class DispatchQueueWake: LatencySession {
  private let reply = ReplyDoorbell()
  private let queue = DispatchQueue(label: "wake-server")
  private let settled: Bool

  init(settled: Bool = true) { self.settled = settled }

  func measure(_ count: Int) -> [Double] {
    let reply = self.reply
    return sampleRoundTrips(count, settle: settled ? reply.waitUntilRingerSleeps : {}) {
      queue.async { reply.ring() }
      reply.wait()
    }
  }

  func close() { reply.close() }
}

enum WakeScenarios {
  static func wakeRTT(_ context: BenchmarkContext) -> ScenarioResult {
    wake("wake-rtt", context, settled: true)
  }

  /// wake-rtt without the settle: the next request goes out as soon as the reply arrived, so the
  /// server (loop or floor thread) may still be awake — what a busy service sees.
  static func wakeRTTBackToBack(_ context: BenchmarkContext) -> ScenarioResult {
    wake("wake-rtt-b2b", context, settled: false)
  }

  private static func wake(_ name: String, _ context: BenchmarkContext, settled: Bool) -> ScenarioResult {
    let pin = context.pin
    return runLatencyScenario(
      name, floor: "floor-futex",
      notes: [
        "client thread signals a server, server rings the client's reply eventfd (the client blocks in read()"
          + " for every peer); µs per round trip",
        settled
          ? "before each round trip the client waits until the server thread sleeps (/proc/self/task/<tid>/stat)"
          : "back-to-back: no wait between round trips; the server may still be awake",
        "asyncrunloop: futex path (the loop holds only the source) — matched floor floor-futex;"
          + " asyncrunloop-epoll: epoll path (a timer and a descriptor registered) — matched floor floor-epoll;"
          + " floor-eventfd: the bare floor (server blocks in read())",
        "foundation-runloop (settled only): CFRunLoopSource v0 signal + CFRunLoopWakeUp (fastest public route)",
      ],
      peers: [
        PeerSpec(name: "asyncrunloop", open: { AsyncRunLoopWake(pin: pin, path: .futex, settled: settled) }),
        PeerSpec(name: "asyncrunloop-epoll", open: { AsyncRunLoopWake(pin: pin, path: .epoll, settled: settled) }),
        PeerSpec(name: "floor-eventfd", open: { FloorWake(pin: pin, sleepingIn: .read, settled: settled) }),
        PeerSpec(name: "floor-futex", open: { FloorWake(pin: pin, sleepingIn: .futex, settled: settled) }),
        PeerSpec(name: "floor-epoll", open: { FloorWake(pin: pin, sleepingIn: .epoll, settled: settled) }),
        PeerSpec(name: "dispatch-queue", open: { DispatchQueueWake(settled: settled) }),
      ] + (settled ? [PeerSpec(name: "foundation-runloop", open: { FoundationRunLoopWake(pin: pin) })] : []),
      mode: context.mode)
  }

  /// Not in the default set: compares the public ways to wake a Foundation RunLoop thread.
  static func foundationRoutes(_ context: BenchmarkContext) -> ScenarioResult {
    let pin = context.pin
    return runLatencyScenario(
      "foundation-wake-routes", floor: nil,
      notes: ["how to wake a Foundation RunLoop thread fastest; picks the foundation-runloop route"],
      peers: FoundationWakeRoute.allCases.map { route in
        PeerSpec(name: route.rawValue, open: { FoundationRunLoopWake(pin: pin, route: route) })
      },
      mode: context.mode)
  }
}
