import Glibc
import Testing

@testable import AsyncRunLoop

/// An object whose `deinit` counts on a per-test counter: captured by the closures under test, it
/// shows when the library let go of them (a deinit counter, not a weak reference: a weak reference
/// to something that stays alive leaves a side table LeakSanitizer reports).
final class ReleaseCanary: Sendable {
  let deaths: AtomicCounter
  init(_ deaths: AtomicCounter) { self.deaths = deaths }
  deinit { deaths.increment() }
  func touch() {}
}

/// The member kinds under test.
enum ReleasedMemberKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
  case source, command, timer, observer, descriptor
  var testDescription: String { rawValue }
}

/// How a member's stay ends.
enum MemberStayEnding: String, CaseIterable, Sendable, CustomTestStringConvertible {
  /// `invalidate()` from the test's thread.
  case invalidate
  /// `invalidate()` from the member's own callout.
  case fromOwnCallout
  /// The loop's `shutdownAndWait()`.
  case shutdown
  /// The last reference to the loop dropped, without a shutdown.
  case dropLoop
  /// Removed from its only mode, then the member's last reference dropped.
  case removedThenDropped
  /// The loop's `shutdownAndWait()`, the test still holding the member.
  case shutdownKeepingMember
  /// The last reference to the loop dropped, the test still holding the member.
  case dropLoopKeepingMember
  var testDescription: String { rawValue }
}

/// One member of any kind, reduced to what the tests do with it. Holds the member strongly.
struct AnyMemberHandle: Sendable {
  let add: @Sendable (RunLoopThread) -> Void
  let remove: @Sendable (RunLoopThread) -> Void
  let invalidate: @Sendable () -> Void
  /// Makes the member's callout run (a signal, a post, a write; timers and observers fire alone).
  let trigger: @Sendable () -> Void

  /// `canary` is captured by every closure the member holds; `fired` counts callouts, `cancels`
  /// cancel routines (sources only). With `selfInvalidating`, the first callout invalidates it.
  static func make(
    _ kind: ReleasedMemberKind, canary: ReleaseCanary, fired: AtomicCounter, cancels: AtomicCounter,
    schedules: AtomicCounter,
    selfInvalidating: Bool, pipe: (read: Int32, write: Int32)?
  ) -> AnyMemberHandle {
    switch kind {
    case .source:
      let source = InputSource(
        schedule: { _, _, _ in
          canary.touch()
          schedules.increment()
        },
        cancel: { _, _ in
          canary.touch()
          cancels.increment()
        },
        perform: { source in
          canary.touch()
          fired.increment()
          if selfInvalidating { source.invalidate() }
        })
      return AnyMemberHandle(
        add: { $0.add(source, to: .default) }, remove: { $0.remove(source, from: .default) },
        invalidate: { source.invalidate() }, trigger: { source.signal() })
    case .command:
      let box = Locked<InputSource?>(nil)
      let command = CommandSource<Int>(
        schedule: { _, _, _ in
          canary.touch()
          schedules.increment()
        },
        cancel: { _, _ in
          canary.touch()
          cancels.increment()
        },
        handler: { _ in
          canary.touch()
          fired.increment()
          if selfInvalidating { box.withLock { $0 }?.invalidate() }
        })
      if selfInvalidating { box.withLock { $0 = command.source } }
      return AnyMemberHandle(
        add: { $0.add(command.source, to: .default) }, remove: { $0.remove(command.source, from: .default) },
        invalidate: { command.source.invalidate() }, trigger: { _ = command.post(1) })
    case .timer:
      let timer = LoopTimer(after: .milliseconds(1), repeatingEvery: .milliseconds(2)) { timer in
        canary.touch()
        fired.increment()
        if selfInvalidating { timer.invalidate() }
      }
      return AnyMemberHandle(
        add: { $0.add(timer, to: .default) }, remove: { $0.remove(timer, from: .default) },
        invalidate: { timer.invalidate() }, trigger: {})
    case .observer:
      let observer = LoopObserver(activities: [.beforeWaiting, .afterWaiting, .beforeSources, .beforeTimers]) {
        observer, _ in
        canary.touch()
        fired.increment()
        if selfInvalidating { observer.invalidate() }
      }
      return AnyMemberHandle(
        add: { $0.add(observer, to: .default) }, remove: { $0.remove(observer, from: .default) },
        invalidate: { observer.invalidate() }, trigger: {})
    case .descriptor:
      let pipe = pipe!
      let descriptor = DescriptorSource(descriptor: pipe.read) { source, _ in
        canary.touch()
        _ = drainDescriptor(source.descriptor)
        fired.increment()
        if selfInvalidating { source.invalidate() }
      }
      return AnyMemberHandle(
        add: { try? $0.add(descriptor, to: .default) }, remove: { $0.remove(descriptor, from: .default) },
        invalidate: { descriptor.invalidate() }, trigger: { writeByte(pipe.write) })
    }
  }
}

/// Polls `condition` (scaled by `watchdogScale`) without holding a pool thread.
func eventuallyWithin(_ seconds: Int = 10, _ condition: () -> Bool) async -> Bool {
  await pollAsync(timeout: .seconds(seconds * watchdogScale), condition)
}

/// An actor pinned to a loop.
actor LoopCheckingActor: LoopActor {
  nonisolated let loop: RunLoopThread
  init(loop: RunLoopThread) { self.loop = loop }
  func isOnItsLoop() -> Bool { loop.isOnLoopThread }
}

// MARK: - Nested runs from every kind of callout

/// Where a nested run is entered.
enum NestedRunCallout: String, CaseIterable, Sendable, CustomTestStringConvertible {
  case timer, observer, source, command, descriptor, perform, performAndWait, actorJob, consumer
  var testDescription: String { rawValue }
  var isMember: Bool { [.timer, .observer, .source, .command, .descriptor].contains(self) }
}

/// How the nested run is ended.
enum NestedRunEnding: String, CaseIterable, Sendable, CustomTestStringConvertible {
  /// The calling member is invalidated from another thread, then `stop()`.
  case invalidateAndStop
  /// The calling member is removed from its mode from another thread, then `stop()`.
  case removeAndStop
  /// `shutdownAndWait()` from another thread.
  case shutdown
  var testDescription: String { rawValue }
}

/// An actor on a loop that runs a body (a nested run) in one of its jobs.
actor BodyRunningActor: LoopActor {
  nonisolated let loop: RunLoopThread
  init(loop: RunLoopThread) { self.loop = loop }
  func run(_ body: @Sendable () -> Void) { body() }
}

// MARK: - Blocks of modes that never run, nested runs whose mode empties, re-entrant drains

let releaseNeverMode: RunLoopMode = "release-never-mode"

let releaseNestMode: RunLoopMode = "release-nest-mode"

/// How the loop goes away while the test keeps a member of it.
enum LoopDeparture: String, CaseIterable, Sendable, CustomTestStringConvertible {
  /// Dropped without a shutdown, the member still on it.
  case dropped
  /// Shut down, then dropped.
  case shutDownThenDropped
  /// The member invalidated first, then the loop dropped.
  case invalidatedThenDropped
  /// The member removed from its mode first, then the loop dropped.
  case removedThenDropped
  /// The member removed from its mode on the loop's own thread, then the loop dropped.
  case removedOnItsThreadThenDropped
  var testDescription: String { rawValue }
}
