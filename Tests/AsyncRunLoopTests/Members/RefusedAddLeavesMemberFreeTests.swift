import Glibc
import Testing

@testable import AsyncRunLoop

/// A refused add reports once, invalidates the member, and leaks nothing.
@Suite("A refused add reports once, invalidates the member, and leaks nothing", .serialized, .timeLimit(.minutes(10)))
struct RefusedAddLeavesMemberFreeTests {
  /// A readiness source whose add epoll refuses on the loop thread throws there, and stays valid
  /// (a thrown error means the add did not happen); one refused from another thread reports
  /// `[.error]` once and is invalid. Its records hold nothing afterwards (the source and its
  /// handler are freed).
  @Test func refusedDescriptorAddsReportOnceAndLeakNothing() async throws {
    let loop = try RunLoopThread(name: "rrec-fd-refused")
    defer { loop.shutdownAndWait() }
    let pipe = makePipe()
    defer {
      close(pipe.read)
      close(pipe.write)
    }
    let holder = DescriptorSource(descriptor: pipe.read) { _, _ in }
    try loop.add(holder)
    final class Sentinel: Sendable {}
    let outcome = try await withWatchdogOnThread { () -> [String] in
      var problems: [String] = []
      repeatRounds(200) { round in
        let errors = AtomicCounter()
        weak var weakSource: DescriptorSource?
        weak var weakSentinel: Sentinel?
        do {
          let sentinel = Sentinel()
          weakSentinel = sentinel
          let source = DescriptorSource(descriptor: pipe.read) { _, events in
            withExtendedLifetime(sentinel) {}
            if events.contains(.error) { errors.increment() }
          }
          weakSource = source
          if round % 2 == 0 {
            let threw =
              (try? loop.performAndWait { () -> Bool in
                do {
                  try loop.add(source, to: .default)
                  return false
                } catch { return true }
              }) ?? false
            if !threw { problems.append("round \(round): the loop-thread add did not throw") }
            if errors.current != 0 { problems.append("round \(round): a throwing add also reported") }
            if !source.isValid { problems.append("round \(round): a throwing add invalidated the source") }
          } else {
            try? loop.add(source, to: .default)
            try? loop.add(source, to: RunLoopMode("rrec-fd-m"))  // a second add with the same record
            _ = try? loop.performAndWait { () }
            if errors.current != 1 { problems.append("round \(round): \(errors.current) error reports") }
            if source.isValid { problems.append("round \(round): still valid") }
          }
        }
        _ = try? loop.performAndWait { () }
        if weakSource != nil || weakSentinel != nil { problems.append("round \(round): leaked") }
      }
      return problems
    }
    holder.invalidate()
    #expect(outcome == [])
  }

  /// "Adding anything to a loop that has terminated (shut down and drained) invalidates it at
  /// once": every kind is invalid when `add` returns; a never-added command source's pending
  /// commands are dropped then (no loop ever held it), its later posts refused, and no schedule,
  /// cancel or callout runs.
  @Test func addingAnythingToATerminatedLoopInvalidatesItAtOnce() async throws {
    let loop = try RunLoopThread(name: "terminated")
    await execShutdown(loop)
    let calls = AtomicCounter()
    let books = CommandBooks()
    let commands = books.makeSource()
    for command in 0..<2 { books.post(commands, command) }
    let source = InputSource(
      schedule: { _, _, _ in calls.increment() }, cancel: { _, _ in calls.increment() },
      perform: { _ in calls.increment() })
    source.signal()
    let timer = LoopTimer(after: .zero) { _ in calls.increment() }
    let observer = LoopObserver(activities: .all) { _, _ in calls.increment() }
    let pipe = makePipe()
    defer {
      close(pipe.read)
      close(pipe.write)
    }
    let descriptor = DescriptorSource(descriptor: pipe.read) { _, _ in calls.increment() }
    loop.add(commands.source)
    loop.add(source)
    loop.add(timer)
    loop.add(observer)
    try loop.add(descriptor)
    #expect(!commands.source.isValid && !source.isValid && !timer.isValid && !observer.isValid)
    #expect(!descriptor.isValid)
    #expect(commands.droppedCount == 2 && commands.pendingCount == 0)
    #expect(!commands.post(2))
    #expect(calls.current == 0 && books.schedules.current == 0 && books.cancels.current == 0)
  }

  /// From each kind of callout on the loop thread, while a burst of 600 adds waits: adding a
  /// regular file, /dev/null and a descriptor that is not open throws (EPERM, EPERM, EBADF), the
  /// source stays valid and on no loop, may be added to another loop (refused there too, by its
  /// `fstat` check) and, once its number holds a pipe, is added there and fires. Every add of the
  /// burst is applied exactly once.
  @Test(arguments: RefusedAddCallout.allCases)
  func aRefusedDescriptorAddFromACalloutLeavesTheSourceFree(callout: RefusedAddCallout) throws {
    let outcome = try withWatchdogSync(timeout: .seconds(20), "refused from \(callout)") { () -> [String] in
      let loop = try RunLoopThread(name: "refuse")
      let other = try RunLoopThread(name: "refuse-b")
      defer {
        loop.shutdownAndWait()
        other.shutdownAndWait()
      }
      let regular = openRegularFile()
      let devNull = open("/dev/null", O_RDONLY | O_CLOEXEC)
      defer {
        close(regular)
        close(devNull)
      }
      let handlerCalls = AtomicCounter()
      let refused = [regular, devNull, neverOpenedDescriptor].map { descriptor in
        DescriptorSource(descriptor: descriptor) { source, _ in
          drainDescriptor(source.descriptor)
          handlerCalls.increment()
        }
      }
      let results = Guarded<[String]>([])
      let attempts = AtomicCounter()
      @Sendable func attempt() {
        guard attempts.increment() == 1 else { return }
        var lines: [String] = []
        for source in refused {
          do throws(SystemCallError) {
            try loop.add(source)
            lines.append("fd \(source.descriptor): added")
          } catch {
            lines.append("fd \(source.descriptor): \(error.errno)")
          }
          lines.append("valid \(source.isValid) modes \(loop.core.modeCount(of: source))")
          do throws(SystemCallError) {
            try other.add(source)
            lines.append("other: added")
          } catch {
            lines.append("other: \(error.errno)")
          }
        }
        results.withLock { $0 += lines }
      }
      let armed = Guarded(false)
      let takeArmed: @Sendable () -> Bool = {
        armed.withLock { value in
          defer { value = false }; return value
        }
      }
      let scheduled = AtomicCounter()
      let sources = (0..<600).map { index in
        RoutineCountingSource(index: index) { index, loop in
          scheduled.increment()
          guard index == 300 else { return }
          switch callout {
          case .schedule: attempt()
          case .observerInNestedRun:
            armed.withLock { $0 = true }
            _ = loop.run(mode: .default, until: .now)
          default: break
          }
        }
      }
      let observer = LoopObserver(activities: .beforeTimers) { _, _ in if takeArmed() { attempt() } }
      if callout == .observer || callout == .observerInNestedRun { loop.add(observer) }
      let timer = LoopTimer(after: .zero) { _ in attempt() }
      let handler = InputSource { _ in attempt() }
      if callout == .handler { loop.add(handler) }
      try loop.performAndWait {}
      let release = blockLoop(loop)
      for counted in sources[..<300] { loop.add(counted.source) }
      if callout == .timer { loop.add(timer) }
      for counted in sources[300...] { loop.add(counted.source) }
      switch callout {
      case .observer: armed.withLock { $0 = true }
      case .block: loop.perform { attempt() }
      case .handler: handler.signal()
      default: break
      }
      release.open()
      waitUntil(timeout: .seconds(10), "the attempt") { attempts.current > 0 }
      try loop.performAndWait {}
      var found = results.snapshot
      let expected = [
        "fd \(regular): \(EPERM)", "valid true modes 0", "other: \(EPERM)",
        "fd \(devNull): \(EPERM)", "valid true modes 0", "other: added",
        "fd \(neverOpenedDescriptor): \(EBADF)", "valid true modes 0", "other: \(EBADF)",
      ]
      if found == expected { found = [] } else { found = ["attempt: \(found)"] }
      if attempts.current != 1 { found.append("attempts: \(attempts.current)") }
      if scheduled.current != 600 { found.append("scheduled \(scheduled.current)") }
      // /dev/null went to `other` from the loop's thread (not `other`'s): epoll refuses it there,
      // which only the handler hears, with [.error], and the source is invalidated.
      try other.performAndWait {}
      if refused[1].isValid { found.append("/dev/null source still valid on other") }
      if handlerCalls.current != 1 { found.append("handler calls \(handlerCalls.current)") }
      // The regular file's source is free: with a pipe at its number, `other` takes it.
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      _ = dup2(pipe.read, regular)
      do throws(SystemCallError) {
        try other.add(refused[0])
      } catch {
        found.append("re-add: \(error)")
      }
      writeByte(pipe.write)
      waitUntil(timeout: .seconds(10), "the re-added source") { handlerCalls.current == 2 }
      refused[0].invalidate()
      observer.invalidate()
      timer.invalidate()
      handler.invalidate()
      for counted in sources { counted.source.invalidate() }
      try loop.performAndWait {}
      try other.performAndWait {}
      if handlerCalls.current != 2 { found.append("handler calls at the end \(handlerCalls.current)") }
      found += miscounted(sources, schedules: 1, cancels: 1)
      return found
    }
    #expect(outcome == [])
  }

  /// From another thread, behind a held burst of 300 adds, a /dev/null source passes the `fstat`
  /// check and epoll refuses it on the loop thread: its handler is told `[.error]` exactly once,
  /// the source is invalidated, and the loop keeps working (the burst is applied, a later pipe is
  /// watched).
  @Test func anEpollRefusalBehindABurstReportsOneErrorAndInvalidates() throws {
    let outcome = try withWatchdogSync(timeout: .seconds(20), "epoll refusal") { () -> [String] in
      let loop = try RunLoopThread(name: "epoll-refuse")
      defer { loop.shutdownAndWait() }
      let devNull = open("/dev/null", O_RDONLY | O_CLOEXEC)
      defer { close(devNull) }
      let events = Guarded<[DescriptorEvents]>([])
      let source = DescriptorSource(descriptor: devNull) { _, got in events.withLock { $0.append(got) } }
      let sources = (0..<600).map { _ in RoutineCountingSource() }
      let release = blockLoop(loop)
      for counted in sources[..<300] { loop.add(counted.source) }
      var found: [String] = []
      do throws(SystemCallError) { try loop.add(source) } catch { found.append("add threw \(error)") }
      for counted in sources[300...] { loop.add(counted.source) }
      release.open()
      try loop.performAndWait {}
      if events.snapshot != [.error] { found.append("events \(events.snapshot)") }
      if source.isValid { found.append("still valid") }
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let fired = AtomicCounter()
      let later = DescriptorSource(descriptor: pipe.read) { source, _ in
        drainDescriptor(source.descriptor)
        fired.increment()
      }
      do throws(SystemCallError) { try loop.add(later) } catch { found.append("pipe add threw \(error)") }
      writeByte(pipe.write)
      waitUntil(timeout: .seconds(10), "the pipe") { fired.current >= 1 }
      later.invalidate()
      for counted in sources { counted.source.invalidate() }
      try loop.performAndWait {}
      found += miscounted(sources, schedules: 1, cancels: 1)
      return found
    }
    #expect(outcome == [])
  }

  /// Rounds racing an add of a /dev/null source from one thread against its `invalidate()` from
  /// another, and (every third round) against `shutdown`, behind a burst of 300 adds: no crash or
  /// hang, the handler is told at most `[.error]` once, and the source ends invalid.
  @Test func refusedAddsRacingInvalidateAndShutdown() async throws {
    let devNull = open("/dev/null", O_RDONLY | O_CLOEXEC)
    defer { close(devNull) }
    let failures = try await failuresOverRounds(30, timeout: .seconds(30), "refusal races") { round, failures in
      guard let loop = try? RunLoopThread(name: "race") else { return failures.append("no loop") }
      let events = Guarded<[DescriptorEvents]>([])
      let freed = AtomicCounter()
      let source = { () -> DescriptorSource in
        let token = DeinitCountingToken(freed)
        return DescriptorSource(descriptor: devNull) { _, got in
          withExtendedLifetime(token) { events.withLock { $0.append(got) } }
        }
      }()
      let sources = (0..<300).map { _ in RoutineCountingSource() }
      let release = blockLoop(loop)
      for counted in sources { loop.add(counted.source) }
      race([
        { try? loop.add(source) },
        { source.invalidate() },
        { if round % 3 == 0 { loop.shutdown() } },
      ])
      release.open()
      loop.shutdownAndWait()
      let got = events.snapshot
      if got != [] && got != [.error] { failures.append("round \(round): events \(got)") }
      if source.isValid { failures.append("round \(round): still valid") }
      // Invalid, so its handler (and what it captured) is released: nothing leaks.
      if freed.current != 1 { failures.append("round \(round): handler released \(freed.current) times") }
      let counts = miscounted(sources, schedules: 1, cancels: 1)
      if !counts.isEmpty { failures.append("round \(round): \(counts.prefix(3))") }
    }
    #expect(failures == [])
  }
}

// MARK: - Refused adds of members bound to that loop

@Suite("Refused adds report once")
struct RefusedAddsReportOnceTests {
  /// One member of every kind, with books of its callouts and a token its closures hold.
  private final class Members: Sendable {
    let freed: AtomicCounter
    let books: CommandBooks
    let plainSchedules: AtomicCounter
    let plainCancels: AtomicCounter
    let commands: CommandSource<Int>
    let plain: InputSource
    let timer: LoopTimer
    let observer: LoopObserver
    let readiness: DescriptorSource
    let pipe: (read: Int32, write: Int32)

    init() {
      let (freed, plainSchedules, plainCancels) = (AtomicCounter(), AtomicCounter(), AtomicCounter())
      let books = CommandBooks()
      self.freed = freed
      self.plainSchedules = plainSchedules
      self.plainCancels = plainCancels
      self.books = books
      pipe = makePipe()
      commands = books.makeSource(token: DeinitCountingToken(freed))
      let plainToken = DeinitCountingToken(freed)
      plain = InputSource(
        schedule: { _, _, _ in
          withExtendedLifetime(plainToken) {}
          plainSchedules.increment()
        },
        cancel: { _, _ in plainCancels.increment() }, perform: { _ in })
      let timerToken = DeinitCountingToken(freed)
      timer = LoopTimer(after: .seconds(3_600)) { _ in withExtendedLifetime(timerToken) {} }
      let observerToken = DeinitCountingToken(freed)
      observer = LoopObserver(activities: .all) { _, _ in withExtendedLifetime(observerToken) {} }
      let readinessToken = DeinitCountingToken(freed)
      readiness = DescriptorSource(descriptor: pipe.read) { _, _ in withExtendedLifetime(readinessToken) {} }
      for command in 0..<3 { books.post(commands, command) }
    }

    static let tokens = 5

    func add(to loop: RunLoopThread, _ mode: RunLoopMode) {
      loop.add(commands.source, to: mode)
      loop.add(plain, to: mode)
      loop.add(timer, to: mode)
      loop.add(observer, to: mode)
      try? loop.add(readiness, to: mode)
    }

    var validity: [Bool] {
      [commands.source.isValid, plain.isValid, timer.isValid, observer.isValid, readiness.isValid]
    }

    func closePipe() {
      close(pipe.read)
      close(pipe.write)
    }
  }

  /// What the refused-add tests check, as plain values.
  private struct Outcome: Sendable {
    /// The first adds were accepted (the members still valid after them): the setup worked.
    var firstAddsAccepted: Bool
    var validAfterRefusal: [Bool]
    var commands: CommandTally
    var plainSchedules: Int
    var plainCancels: Int
    var onOtherLoop: Int
    var leakedMembers: Int
    var leakedLoop: Bool
    var tokensFreed: Int
  }

  /// Adds the members to another loop (a no-op for invalidated members), checks how many modes
  /// hold them there, then drops every strong reference and reports what is still alive.
  private static func finish(_ members: Members, firstAccepted: Bool, validAfterRefusal: [Bool]) -> Outcome {
    var outcome = Outcome(
      firstAddsAccepted: firstAccepted, validAfterRefusal: validAfterRefusal,
      commands: CommandTally(members.books, members.commands),
      plainSchedules: members.plainSchedules.current, plainCancels: members.plainCancels.current,
      onOtherLoop: -1, leakedMembers: 0, leakedLoop: false, tokensFreed: 0)
    if let other = try? RunLoopThread(name: "other-loop") {
      members.add(to: other, .default)
      outcome.onOtherLoop =
        (try? other.performAndWait {
          other.core.modeCount(of: members.commands.source) + other.core.modeCount(of: members.plain)
            + other.core.modeCount(of: members.timer) + other.core.modeCount(of: members.observer)
            + other.core.modeCount(of: members.readiness)
        }) ?? -1
      other.shutdownAndWait()
    }
    return outcome
  }

  /// Runs `scenario` (which makes the loop and the members and returns its outcome with the
  /// members), then drops them and counts what survived.
  private static func measure(
    _ scenario: () -> (Outcome, Members, RunLoopThread)
  ) -> Outcome {
    weak var weakLoop: RunLoopThread?
    weak var weakCommands: CommandSource<Int>?
    weak var weakPlain: InputSource?
    weak var weakTimer: LoopTimer?
    weak var weakObserver: LoopObserver?
    weak var weakReadiness: DescriptorSource?
    let freed: AtomicCounter
    var outcome: Outcome
    do {
      let (result, members, loop) = scenario()
      outcome = result
      freed = members.freed
      weakLoop = loop
      weakCommands = members.commands
      weakPlain = members.plain
      weakTimer = members.timer
      weakObserver = members.observer
      weakReadiness = members.readiness
      members.closePipe()
    }
    outcome.leakedLoop = weakLoop != nil
    outcome.leakedMembers =
      [
        weakCommands != nil, weakPlain != nil, weakTimer != nil, weakObserver != nil, weakReadiness != nil,
      ].filter { $0 }.count
    outcome.tokensFreed = freed.current
    return outcome
  }

  private static func check(_ outcome: Outcome, sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(outcome.firstAddsAccepted, "setup: the first adds were refused", sourceLocation: sourceLocation)
    #expect(outcome.validAfterRefusal == [false, false, false, false, false], sourceLocation: sourceLocation)
    #expect(
      outcome.commands.delivered == [0, 1, 2] && outcome.commands.dropped == 0 && outcome.commands.pending == 0,
      "\(outcome.commands)", sourceLocation: sourceLocation)
    #expect(
      outcome.commands.schedules == 1 && outcome.commands.cancels == 1, "\(outcome.commands)",
      sourceLocation: sourceLocation)
    #expect(outcome.plainSchedules == 1 && outcome.plainCancels == 1, sourceLocation: sourceLocation)
    #expect(outcome.onOtherLoop == 0, sourceLocation: sourceLocation)
    #expect(outcome.leakedMembers == 0 && !outcome.leakedLoop, sourceLocation: sourceLocation)
    #expect(outcome.tokensFreed == Members.tokens, sourceLocation: sourceLocation)
  }

  /// Every kind is added to mode A of L during its drain (accepted, applied in the next round),
  /// then, past the drain's cap, to mode B (refused): each ends invalidated at once; the accepted
  /// add still schedules and cancels the sources (the command source delivers what it held,
  /// drops nothing); afterwards an add to another loop is a no-op; once the test lets go, no
  /// member, closure or loop is left alive.
  @Test func aSecondModeAddPastTheCapInvalidatesEveryKindAndKeepsTheFirstAdd() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "second-mode adds past the cap") {
      () -> Outcome in
      Self.measure { () -> (Outcome, Members, RunLoopThread) in
        let loop = try! RunLoopThread(name: "refused")
        let members = Members()
        let endDrain = holdDrain(loop)
        members.add(to: loop, "a")
        let firstAccepted = members.validity.allSatisfy { $0 }
        waitForDrainCap(loop)
        members.add(to: loop, "b")
        let valid = members.validity
        endDrain.open()
        loop.shutdownAndWait()
        return (Self.finish(members, firstAccepted: firstAccepted, validAfterRefusal: valid), members, loop)
      }
    }
    guard let outcome else { return }
    Self.check(outcome)
  }

  /// The terminated case: L's drain has terminated and its last application of changes is
  /// applying the adds it accepted (a first source's schedule routine holds it there). Every
  /// kind, accepted into mode A before, is now added to mode B: refused (terminated), but the
  /// member is still bound to L with that add on its way. Each ends invalidated; the accepted add
  /// is applied afterwards with the routines intact: the command source is scheduled, delivers
  /// its commands and is cancelled; nothing leaks.
  @Test func aSecondModeAddToATerminatedLoopStillApplyingTheFirstKeepsIt() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "second-mode adds at termination") {
      () -> (Outcome, Int, Int) in
      let holderSchedules = AtomicCounter()
      let holderCancels = AtomicCounter()
      let outcome = Self.measure { () -> (Outcome, Members, RunLoopThread) in
        let loop = try! RunLoopThread(name: "terminated")
        let members = Members()
        let heldAfterTermination = TestGate()
        let release = TestGate()
        let holder = InputSource(
          schedule: { _, loop, _ in
            holderSchedules.increment()
            let terminated = loop.shared.inboxLock.withLock { loop.shared.inbox.life.phase >= .finishing }
            guard terminated else { return }
            heldAfterTermination.open()
            _ = release.wait(timeout: .seconds(10))
          },
          cancel: { _, _ in holderCancels.increment() }, perform: { _ in })
        // Held in a job of the drain round's second batch (a job the first batch enqueued):
        // what arrives meanwhile is collected only after the loop terminated.
        let inJob = TestGate()
        let endJob = TestGate()
        loop.perform(inModes: ["never-run"]) {
          Task(executorPreference: loop) {
            Task(executorPreference: loop) {
              inJob.open()
              _ = endJob.wait(timeout: .seconds(20))
            }
          }
        }
        loop.shutdown()
        _ = inJob.wait(timeout: .seconds(20))
        loop.add(holder, to: "a")
        members.add(to: loop, "a")
        let firstAccepted = holder.isValid && members.validity.allSatisfy { $0 }
        waitForDrainCap(loop)
        endJob.open()
        var valid: [Bool] = []
        if heldAfterTermination.wait(timeout: .seconds(10)) {
          members.add(to: loop, "b")
          valid = members.validity
        }
        release.open()
        loop.shutdownAndWait()
        holder.invalidate()
        return (Self.finish(members, firstAccepted: firstAccepted, validAfterRefusal: valid), members, loop)
      }
      return (outcome, holderSchedules.current, holderCancels.current)
    }
    guard let (outcome, holderSchedules, holderCancels) = outcome else { return }
    #expect(holderSchedules == 1 && holderCancels == 1)
    Self.check(outcome)
  }
}
