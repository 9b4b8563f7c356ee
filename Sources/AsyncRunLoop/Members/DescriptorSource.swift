import CAsyncRunLoop
import Glibc

/// The readiness a `DescriptorSource` watches for, or reports.
public struct DescriptorEvents: OptionSet, Sendable, Hashable, CustomStringConvertible {
  public let rawValue: UInt32
  public init(rawValue: UInt32) { self.rawValue = rawValue }

  /// Data can be read (or the peer closed: a read returns 0).
  public static let readable = DescriptorEvents(rawValue: UInt32(EPOLLIN.rawValue))
  /// Data can be written.
  public static let writable = DescriptorEvents(rawValue: UInt32(EPOLLOUT.rawValue))
  /// An error is pending on the descriptor (always reported, never needs asking for).
  public static let error = DescriptorEvents(rawValue: UInt32(EPOLLERR.rawValue))
  /// The peer hung up (always reported, never needs asking for).
  public static let hangUp = DescriptorEvents(rawValue: UInt32(EPOLLHUP.rawValue))

  public var description: String {
    let names: [(DescriptorEvents, String)] = [
      (.readable, "readable"), (.writable, "writable"), (.error, "error"), (.hangUp, "hangUp"),
    ]
    return "[" + names.filter { contains($0.0) }.map(\.1).joined(separator: ", ") + "]"
  }
}

/// A readiness ("version 1", port-based) source: fires when a file descriptor becomes readable or
/// writable (pipes, sockets, eventfd, timerfd, signalfd, ...).
///
/// The handler runs on the loop thread, level-triggered: it fires on every pass while the
/// descriptor stays ready, so it should read (or write) until `EAGAIN`, or remove the source.
/// The source does not own the descriptor: close it yourself, after removing the source. A
/// descriptor closed while registered, and its number reused by a new descriptor, never delivers
/// events to the old registration: each registration is identified by a token, not by the number.
/// One exception is epoll's: while another descriptor (a `dup`, a forked child's copy) keeps the
/// closed one's file open, the kernel keeps the registration, and the source, until removed, is
/// still told that file's readiness (not the new one's). Once the source is removed or invalidated
/// the loop drops such a registration (it rebuilds its epoll set when it sees one reported), so
/// it never makes the loop spin.
/// One source per descriptor and loop: adding a second source for a descriptor that a source on
/// the same loop still watches fails with `EEXIST`, as epoll refuses it — also while the first
/// one is silenced (the loop runs a mode that does not hold it). The interest is fixed for the
/// source's life. To watch both directions, either give one source `[.readable, .writable]` and
/// dispatch on the events it reports, or watch a `dup()` of the descriptor with a second source
/// (epoll registers each descriptor number on its own, so a reader on `fd` and a writer waiting on
/// `dup(fd)` work side by side, each with its own interest; close the duplicate after removing
/// its source). Changing one registration's interest in place is not offered: a level-triggered
/// `.writable` interest fires on every pass while the socket can be written, so a server keeps
/// it only while it has something to write, which is exactly a second, short-lived source.
///
/// **When an add fails.** `RunLoopThread.add(_:to:)` applies the registration on the loop thread.
/// Called there, it throws epoll's refusal. Called from another thread it checks what it can at
/// once (a closed descriptor, a regular file) and throws that, but does not wait for the loop
/// (a blocking add could deadlock, and the loop may not be running): a refusal only epoll can
/// see (`EEXIST`, `ENOMEM`, `ENOSPC`) then arrives later, on the loop thread, as one `[.error]`
/// call of the handler, after which the source is invalidated. `registrationError` then says why,
/// so that the handler can tell a refused registration from an error on the descriptor itself.
public final class DescriptorSource: LoopMember, @unchecked Sendable {  // Safety: proof below
  // Safety: `descriptor`, `interest` and `order` are immutable. `state` (binding, handler) and
  // `refusal` are only touched with `lock` held. The loop-thread side (epoll token, armed) lives in the loop's
  // `MemberRecord`.

  static var kindName: String { "DescriptorSource" }

  /// The watched file descriptor.
  public let descriptor: Int32
  /// What the source waits for.
  public let interest: DescriptorEvents
  /// Among readiness sources ready in the same pass, lower orders fire first.
  public let order: Int
  /// A name for diagnostics: stall reports name the member by it (see `StallReport.label`).
  public let label: String?
  /// Set (once, before the handler is told `[.error]`) when the loop refused an add made from
  /// another thread; only touched with `lock` held.
  private var refusal: SystemCallError?

  private let lock = PthreadLock.make()
  // No dynamic exclusivity checks (a thread-local lookup each, on every fire): these are only
  // touched under `lock`, and no access spans a callout.
  @exclusivity(unchecked) private var state: CalloutMemberState<Handler>
  /// The handler, in a concrete struct (see `CalloutMemberState`).
  private struct Handler { let run: @Sendable (DescriptorSource, DescriptorEvents) -> Void }

  /// Creates a readiness source.
  /// - Parameters:
  ///   - descriptor: The descriptor to watch; it must stay open while the source is scheduled.
  ///   - interest: `.readable`, `.writable`, or both.
  ///   - order: Lower orders fire first among readiness sources ready in the same pass.
  ///   - label: A name for diagnostics (stall reports).
  ///   - handler: Called on the loop thread with the events that occurred.
  public convenience init(
    descriptor: Int32, interest: DescriptorEvents = .readable, order: Int = 0, label: String? = nil,
    handler: @escaping @Sendable (DescriptorSource, DescriptorEvents) -> Void
  ) {
    self.init(
      descriptor: descriptor, interest: interest, order: order, label: label, handler: handler, onInvalidate: nil)
  }

  init(
    descriptor: Int32, interest: DescriptorEvents, order: Int, label: String? = nil,
    handler: @escaping @Sendable (DescriptorSource, DescriptorEvents) -> Void,
    onInvalidate: (@Sendable () -> Void)?
  ) {
    self.descriptor = descriptor
    self.interest = interest
    self.order = order
    self.label = label
    self.state = CalloutMemberState(callout: Handler(run: handler), onInvalidate: onInvalidate)
  }

  func withBinding<Result>(_ body: (inout MemberBinding) -> Result) -> Result {
    lock.lock()
    defer { lock.unlock() }
    return body(&state.binding)
  }

  /// Removes the source from every mode of its loop (deregistering the descriptor) and releases
  /// the handler. No handler call starts after this returns. Any thread; idempotent.
  public func invalidate() {
    lock.withLock { state.invalidate() }.finish(self)
  }

  /// False once `invalidate()` was called. Any thread.
  public var isValid: Bool { lock.withLock { state.binding.isValid } }

  /// Why the loop refused to register the descriptor, when an add from another thread failed on
  /// the loop thread (see "When an add fails"): set before the handler is told `[.error]`, and the
  /// source is then invalidated. Nil otherwise; an `[.error]` with no `registrationError` is the
  /// descriptor's own error (`EPOLLERR`). Any thread.
  public var registrationError: SystemCallError? { lock.withLock { refusal } }

  /// Loop thread: records a refused registration before the handler hears of it.
  func recordRegistrationError(_ error: SystemCallError) {
    lock.withLock { refusal = error }
  }

  /// The epoll interest bits for this source, without epoll's mode flags. Registrations are
  /// always level-triggered (the loop silences and re-arms them per mode, and a wait that stops
  /// delivering after a nested run relies on them being reported again), so `EPOLLET`,
  /// `EPOLLONESHOT`, `EPOLLEXCLUSIVE` and `EPOLLWAKEUP` passed through
  /// `DescriptorEvents(rawValue:)` are ignored; every event bit is kept.
  var epollEvents: UInt32 { interest.rawValue & ~Self.modeFlags }

  private static let modeFlags =
    UInt32(EPOLLET.rawValue) | UInt32(EPOLLONESHOT.rawValue) | UInt32(EPOLLEXCLUSIVE.rawValue)
    | UInt32(EPOLLWAKEUP.rawValue)

  /// Loop thread: delivers events to the handler (not after invalidation, nor once the source
  /// left `loop`).
  func fire(_ events: DescriptorEvents, on loop: LoopShared) {
    let current = lock.withLock { state.callout(on: loop) }
    current?.run(self, events)
  }

  /// Loop thread: delivers readiness events that `loop` found for `record`, in the mode `claim`
  /// describes; returns false (and tells nobody) when the source was invalidated, left `loop`, or
  /// was removed from that mode by a call the loop has not applied yet.
  func fire(_ events: DescriptorEvents, on loop: LoopShared, record: MemberRecord, in claim: ModeClaim) -> Bool {
    guard let current = lock.withLock({ state.callout(on: loop, for: record, in: claim) }) else { return false }
    loop.observed(.readinessHandler, label: label) { current.run(self, events) }
    return true
  }
}
