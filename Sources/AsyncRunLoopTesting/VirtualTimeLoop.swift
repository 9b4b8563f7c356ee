import AsyncRunLoop

/// A loop whose clock is virtual: time moves only when the test says, so timer-driven code is
/// tested without sleeping, deterministically.
///
/// Everything that reads the loop's clock follows virtual time: `LoopTimer`s added to `loop`
/// (a timer made with `LoopTimer(after:)` counts its delay from the loop's time when it is first
/// added), timer sequences (`loop.timer(every:)`), `loop.clock.sleep(for:)`, `Task.sleep` in a task
/// that prefers the loop (`withTaskExecutorPreference(loop)`), and run time limits
/// (`loop.run(for:)`). Time moves when the test calls `advance(by:)` or `advance(to:)`, or, with
/// `autoAdvances` on, whenever the loop has nothing else to do (Tokio's rule): the loop then jumps
/// to its next deadline.
///
/// The loop is an ordinary `RunLoopThread` with a thread of its own; only its clock differs. Its
/// passes are the real ones (modes, observers, sources, the order of one pass): a virtual sleep
/// tells observers `beforeWaiting` and `afterWaiting` as a real one does, and the time jumps in
/// between. Time never moves in the middle of a pass.
///
/// Deterministic: the loop's one thread runs every callout, and time moves only when the loop
/// would sleep, so two runs of the same test see the same events in the same order — provided the
/// code under test runs on the loop (its members' callouts, tasks that prefer it, actors pinned to
/// it). Work on other executors is not waited for by `advance`: when it resumes and sends work to
/// the loop is up to those executors. Run the test body itself on the loop
/// (`withTaskExecutorPreference(virtual.loop)`, or `Task(executorPreference: virtual.loop)`) to
/// make its steps part of the same order — not from `@MainActor` code (or top-level code): there
/// the closure of `withTaskExecutorPreference` keeps the caller's actor and runs on the main
/// thread; start a `Task(executorPreference:)` instead.
///
/// Why a thread of its own, not the test's thread (as NIO's `EmbeddedEventLoop`): an async test
/// resumes on whatever thread its executor picks after each `await`, while a loop belongs to one
/// thread. The test thread only hands the loop time and waits; the loop thread does the work.
public final class VirtualTimeLoop: Sendable {
  /// The loop. Use it as any loop: add members, run tasks on it, pin actors to it.
  public let loop: RunLoopThread
  private let virtualClock: VirtualClock

  /// Where virtual time starts unless a test says otherwise: one hour after the clock's origin, the
  /// same on every run, so instants in a test's log are too.
  public static let defaultOrigin = LoopClock.Instant(nanoseconds: 3_600_000_000_000)

  /// Starts a loop on a thread of its own, its time at `origin`.
  /// - Parameters:
  ///   - name: The loop's and thread's name.
  ///   - origin: The virtual time to start at (later than 1 ns).
  ///   - autoAdvances: Jump to the next deadline whenever the loop has nothing else to do.
  /// - Throws: `SystemCallError` if the kernel refuses a descriptor or the thread.
  public init(
    name: String = "VirtualTimeLoop", origin: LoopClock.Instant = defaultOrigin, autoAdvances: Bool = false
  ) throws(SystemCallError) {
    let clock = VirtualClock(origin: origin.nanoseconds, autoAdvances: autoAdvances)
    virtualClock = clock
    loop = try RunLoopThread(name: name, virtualClock: clock)
  }

  /// The virtual time now. Any thread. The same as `loop.clock.now`.
  public var now: LoopClock.Instant { LoopClock.Instant(nanoseconds: virtualClock.nowNanoseconds) }

  /// Whether the loop jumps to its next deadline (a timer, a sleep, a run's time limit) whenever it
  /// has nothing else to do, without waiting for `advance`. Any thread.
  ///
  /// With it on, `runUntilIdle()` returns only when no deadline is left, so a repeating timer keeps
  /// the loop busy until it is invalidated. Time jumps as soon as the loop has no work of its own:
  /// work that other executors are about to send it does not hold the time back.
  public var autoAdvances: Bool {
    get { virtualClock.autoAdvances }
    set {
      virtualClock.autoAdvances = newValue
      loop.wakeUp()  // a sleeping loop looks at its deadlines again
    }
  }

  /// Moves virtual time forward by `duration` and returns once the loop has done everything due by
  /// then and is idle. Any task, off the loop or on it (the caller is suspended, never blocks the
  /// loop).
  ///
  /// On the way the loop stops at every deadline in order: due timers fire in (date, scheduling)
  /// order, the work they release runs, and the time then moves to the next deadline, until none
  /// is left before the target; then the time is the target. A timer a callout adds or moves into
  /// the span fires in it too. Returns at once when the loop has shut down.
  public func advance(by duration: Duration) async {
    await advance(to: now.advanced(by: duration))
  }

  /// Moves virtual time forward to `instant` (nothing, if it has passed: time never goes back) and
  /// returns once the loop is idle there. See `advance(by:)`.
  public func advance(to instant: LoopClock.Instant) async {
    let loop = loop
    await virtualClock.waitForIdle(grantingUpTo: instant.nanoseconds) { loop.wakeUp() }
  }

  /// Returns once the loop has done all the work it has now and is idle, without moving time
  /// (unless `autoAdvances` is on: then until no deadline is left). Any task.
  public func runUntilIdle() async {
    await advance(to: now)
  }

  /// Shuts the loop down and waits for its thread to finish (see `RunLoopThread.shutdownAndWait()`).
  /// Not from the loop's own thread. Dropping the last reference to the loop shuts it down too.
  public func shutdownAndWait() {
    loop.shutdownAndWait()
  }
}
