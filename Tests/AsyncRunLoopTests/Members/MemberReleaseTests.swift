import Glibc
import Testing

@testable import AsyncRunLoop

/// What a member's closures hold is released when its stay ends.
@Suite("What a member's closures hold is released when its stay ends")
struct MemberReleaseTests {
  /// Every member kind, every way its stay can end: what its closures captured is released
  /// (exactly once), a source's cancel routine runs exactly once per schedule, and a dropped loop
  /// gives its poller back.
  @Test(arguments: ReleasedMemberKind.allCases, MemberStayEnding.allCases)
  func everyClosureAMemberHoldsIsReleasedWhenItsStayEnds(kind: ReleasedMemberKind, ending: MemberStayEnding)
    async throws
  {
    let deaths = AtomicCounter()
    let fired = AtomicCounter()
    let cancels = AtomicCounter()
    let schedules = AtomicCounter()
    let pipe = kind == .descriptor ? makePipe() : nil
    defer {
      if let pipe {
        close(pipe.read)
        close(pipe.write)
      }
    }
    var loop: RunLoopThread? = try RunLoopThread(name: "release")
    weak let weakPoller = loop?.shared.poller
    var member: AnyMemberHandle? = AnyMemberHandle.make(
      kind, canary: ReleaseCanary(deaths), fired: fired, cancels: cancels, schedules: schedules,
      selfInvalidating: ending == .fromOwnCallout, pipe: pipe)
    #expect(deaths.current == 0)
    if let loop { member?.add(loop) }
    member?.trigger()
    // The member is on the loop and has been called out at least once.
    #expect(await eventuallyWithin { fired.current >= 1 }, "\(kind) never called out")
    switch ending {
    case .invalidate:
      member?.invalidate()
      member = nil
    case .fromOwnCallout:
      member = nil
    case .shutdown:
      if let loop { await execShutdown(loop) }
      member = nil
    case .dropLoop:
      loop = nil
      member = nil
    case .removedThenDropped:
      if let loop { member?.remove(loop) }
      member = nil
    case .shutdownKeepingMember:
      if let loop { await execShutdown(loop) }
    case .dropLoopKeepingMember:
      loop = nil
    }
    #expect(await eventuallyWithin { deaths.current == 1 }, "\(kind) kept its closures after \(ending)")
    member = nil
    if kind == .source || kind == .command {
      #expect(await eventuallyWithin { cancels.current == schedules.current })
      #expect(schedules.current == 1)
      #expect(cancels.current == 1)
    }
    if ending == .dropLoop || ending == .dropLoopKeepingMember {
      #expect(await eventuallyWithin { weakPoller == nil }, "the dropped loop kept its poller")
    }
    if ending == .fromOwnCallout {
      #expect(fired.current == 1, "\(kind) called out again after invalidating itself")
    }
    if let loop { await execShutdown(loop) }
  }

  /// A `CommandSource` never added and dropped with commands pending: it has no loop to deliver
  /// on, so it drops them ("Only a source that has no loop to deliver on — invalidated before it
  /// was ever added [...] — drops what it holds"): each command and the handler are released.
  @Test func aNeverAddedCommandSourceDroppedWithPendingCommandsReleasesThem() async throws {
    let deaths = AtomicCounter()
    let delivered = AtomicCounter()
    do {
      let canary = ReleaseCanary(deaths)
      let commands = CommandSource<ReleaseCanary> { _ in
        canary.touch()
        delivered.increment()
      }
      for _ in 0..<3 { #expect(commands.post(ReleaseCanary(deaths))) }
      #expect(commands.pendingCount == 3)
    }
    #expect(await eventuallyWithin { deaths.current == 4 }, "released \(deaths.current) of 4")
    #expect(delivered.current == 0)
  }

  /// A `CommandSource` on a loop, dropped while the loop is busy and commands wait: the loop
  /// delivers each once, then cancels, and lets go of every command and of the handler. Then the
  /// same with the loop dropped (no shutdown) instead of the source.
  @Test(arguments: [false, true])
  func pendingCommandsAreDeliveredOnceAndReleasedWhenTheSourceOrLoopIsDropped(dropLoop: Bool) async throws {
    let deaths = AtomicCounter()
    let delivered = AtomicCounter()
    let cancels = AtomicCounter()
    var loop: RunLoopThread? = try RunLoopThread(name: "pending")
    weak let weakPoller = loop?.shared.poller
    var commands: CommandSource<ReleaseCanary>? = {
      let canary = ReleaseCanary(deaths)
      return CommandSource<ReleaseCanary>(
        cancel: { _, _ in cancels.increment() },
        handler: { command in
          canary.touch()
          command.touch()
          delivered.increment()
        })
    }()
    if let loop, let commands { loop.add(commands.source, to: .default) }
    let release = await execOnNewThread { [loop] in blockLoop(loop!) }
    for _ in 0..<5 { #expect(commands?.post(ReleaseCanary(deaths)) == true) }
    if dropLoop {
      loop = nil
    } else {
      commands = nil
    }
    release.open()
    #expect(await eventuallyWithin { delivered.current == 5 })
    commands = nil
    #expect(await eventuallyWithin { deaths.current == 6 }, "released \(deaths.current) of 6")
    #expect(await eventuallyWithin { cancels.current == 1 })
    #expect(delivered.current == 5)
    if dropLoop { #expect(await eventuallyWithin { weakPoller == nil }) }
    if let loop { await execShutdown(loop) }
  }

  /// What a custom source's routines captured is released after the source's lock is let go:
  /// an object whose deinit signals that same source, released when the loop lets go of the
  /// invalidated source, does not lock the loop's thread out of the source.
  @Test func whatASourceCapturedMaySignalTheSourceWhenItIsReleased() async throws {
    let loop = try RunLoopThread(name: "release-reentrant")
    let target = Locked<InputSource?>(nil)
    let released = AtomicCounter()
    // The routine holds the only reference to the object.
    let source = { [target, released] in
      let toucher = SignalsItsSourceOnDeinit(target: target, released: released)
      return InputSource { _ in withExtendedLifetime(toucher) {} }
    }()
    target.withLock { $0 = source }
    loop.add(source, to: .default)
    try loop.performAndWait {}  // on the loop
    source.invalidate()  // the loop lets go of it, and of what its routines hold, on its thread
    let releasedInTime = await eventuallyWithin { released.current == 1 }
    #expect(releasedInTime, "the captured object was never released (the loop thread is stuck?)")
    guard releasedInTime else {
      // (A debug build traps on the relock.) The loop's thread is stuck holding the source's
      // lock: a shutdown would never finish, nor would dropping the loop or the source return.
      // Leave both to the process.
      _ = Unmanaged.passRetained(loop)
      _ = Unmanaged.passRetained(source)
      return
    }
    target.withLock { $0 = nil }
    await execShutdown(loop)
  }

  /// A repeating timer and an observer whose closures capture their own loop strongly (a cycle
  /// through the loop's registry): the shutdown breaks it ("detaches every source, timer and
  /// observer (cancel routines run, closures are released"), so the loop and its poller go once
  /// the test lets go of it.
  @Test func shutdownBreaksTheCycleOfAHandlerCapturingItsOwnLoop() async throws {
    let deaths = AtomicCounter()
    let fired = AtomicCounter()
    var loop: RunLoopThread? = try RunLoopThread(name: "cycle")
    weak let weakPoller = loop?.shared.poller
    do {
      let strongLoop = loop!
      let canary = ReleaseCanary(deaths)
      let timer = LoopTimer(after: .milliseconds(1), repeatingEvery: .milliseconds(3)) { _ in
        canary.touch()
        _ = strongLoop.name
        fired.increment()
      }
      let observer = LoopObserver(activities: .beforeWaiting) { _, _ in
        canary.touch()
        _ = strongLoop.isShutDown
      }
      strongLoop.add(timer, to: .common)
      strongLoop.add(observer, to: .default)
    }
    #expect(await eventuallyWithin { fired.current >= 2 })
    if let loop { await execShutdown(loop) }
    loop = nil
    #expect(await eventuallyWithin { deaths.current == 1 }, "the shut-down loop kept the closures")
    #expect(await eventuallyWithin { weakPoller == nil }, "the shut-down loop was kept alive")
  }

  /// Threads add, remove and invalidate many sources at once while another shuts the loop down:
  /// each source's schedule and cancel routines pair up, and every source's routines are released.
  @Test func membershipChurnRacingShutdownPairsRoutinesAndReleasesThem() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(60), "the churn") { () -> [String] in
      var problems: [String] = []
      for round in 0..<6 {
        let loop = try RunLoopThread(name: "churn")
        let deaths = AtomicCounter()
        let log = PairLog()
        let count = 100
        do {
          var sources: [InputSource] = []
          for _ in 0..<count {
            let canary = ReleaseCanary(deaths)
            sources.append(
              InputSource(
                schedule: { _, loop, _ in
                  canary.touch()
                  log.schedule(loop)
                }, cancel: { _, loop in log.cancel(loop) }, perform: { _ in canary.touch() }))
          }
          let all = sources
          race([
            { for source in all { loop.add(source, to: .default) } },
            { for source in all { loop.remove(source, from: .default) } },
            { for source in all { loop.add(source, to: .common) } },
            { for source in all { source.signal() } },
            { for (index, source) in all.enumerated() where index % 2 == 0 { source.invalidate() } },
            {
              for _ in 0..<(round * 200) { sched_yield() }
              loop.shutdown()
            },
          ])
          loop.shutdownAndWait()
        }
        if !poll(timeout: .seconds(10 * watchdogScale), { deaths.current == count }) {
          problems.append("round \(round): \(deaths.current) of \(count) sources' routines released")
        }
        if !log.unpaired.isEmpty { problems.append("round \(round): \(log.unpaired)") }
      }
      return problems
    }
    #expect(outcome == [])
  }

  /// Promised: "Releasing the last reference to a loop [...] the thread drains the loop, exits
  /// (detached) and its descriptors are closed" (OnePassOfTheLoop, "Dropping a loop"; also
  /// `shutdown()`: "closing its descriptors when the loop is released"), and `MemberBinding`: "a
  /// removed member never keeps a loop's handle alive". A member the application keeps after its
  /// loop is gone must not keep the loop's poller (its epoll descriptor, eventfd and timerfd) open.
  ///
  /// What happens: every member that was ever on the loop keeps the loop's `LoopShared`, and with it
  /// the `EpollPoller` and its three descriptors, for as long as the member lives — whether the
  /// loop was dropped, shut down, or the member invalidated or removed first. The `RunLoopThread`
  /// itself is released and its thread ends; only the shared half (and the descriptors) leak.
  /// Dropping the member then releases the poller (the control below). Fails 20 of 20 cases, in
  /// every run (3 of 3 runs).
  ///
  /// Fixed: the binding forgets its last loop once the member is invalidated, or once that loop
  /// applied its removal. A removed `CommandSource` keeps it, as documented, so that the loop can
  /// deliver what is posted meanwhile: invalidating it lets go.
  @Test(arguments: ReleasedMemberKind.allCases, LoopDeparture.allCases)
  func aMemberThatOutlivesItsLoopLetsGoOfTheLoopsDescriptors(kind: ReleasedMemberKind, gone: LoopDeparture) async throws
  {
    let deaths = AtomicCounter()
    let fired = AtomicCounter()
    let counter = AtomicCounter()
    let pipe = kind == .descriptor ? makePipe() : nil
    defer {
      if let pipe {
        close(pipe.read)
        close(pipe.write)
      }
    }
    var loop: RunLoopThread? = try RunLoopThread(name: "outlive")
    weak let weakPoller = loop?.shared.poller
    var member: AnyMemberHandle? = AnyMemberHandle.make(
      kind, canary: ReleaseCanary(deaths), fired: fired, cancels: counter, schedules: counter, selfInvalidating: false,
      pipe: pipe)
    if let loop { member?.add(loop) }
    member?.trigger()
    #expect(await eventuallyWithin { fired.current >= 1 }, "\(kind) never called out")
    switch gone {
    case .dropped: break
    case .shutDownThenDropped: if let loop { await execShutdown(loop) }
    case .invalidatedThenDropped: member?.invalidate()
    case .removedThenDropped: if let loop { member?.remove(loop) }
    case .removedOnItsThreadThenDropped:
      if let loop, let kept = member {
        _ = await execOnNewThread { try? loop.performAndWait { kept.remove(loop) } }
      }
    }
    loop = nil
    if kind == .command && (gone == .removedThenDropped || gone == .removedOnItsThreadThenDropped) {
      member?.invalidate()  // documented: a removed command source keeps its last loop until then
    }
    #expect(await eventuallyWithin(3) { weakPoller == nil }, "a \(kind) kept its gone loop's poller")
    // Control: the member was what held it.
    member = nil
    #expect(await eventuallyWithin { weakPoller == nil }, "the poller outlived the member too")
  }

  /// Promised (`CommandSource`): "Only a source that has no loop to deliver on — invalidated
  /// before it was ever added, or after the loop it was last on terminated — drops what it holds".
  /// Here the commands are (a) posted to a source never added, or (b) posted to a source removed
  /// from its last mode whose loop then terminated; the source is invalidated and the
  /// application keeps the `CommandSource`. The dropped commands must be released.
  ///
  /// Before the fix none of them was released (and `pendingCount` still said 3 wait, though
  /// nothing would ever deliver them) until the `CommandSource` itself was freed: the
  /// invalidation of a source with no loop never ran the close routine that empties `pending`.
  /// Failed 5 of 5 runs, both cases. Now the source's `discard` routine drops them when its
  /// routines are released with no loop to close on. (Running the close routine on the
  /// invalidating thread instead, tried first, also dropped commands that a loop still delivered
  /// later: `ShutdownDrainEndsEveryMemberTests.shutdownRacingMovesPostsAndInvalidation`.)
  @Test(arguments: [false, true])
  func commandsDroppedByAnInvalidatedSourceWithNoLoopAreReleased(wasOnALoop: Bool) async throws {
    let deaths = AtomicCounter()
    let delivered = AtomicCounter()
    var commands: CommandSource<ReleaseCanary>? = CommandSource<ReleaseCanary> { command in
      command.touch()
      delivered.increment()
    }
    if wasOnALoop {
      let loop = try RunLoopThread(name: "removed-cmd")
      loop.add(commands!.source, to: .default)
      #expect(commands?.post(ReleaseCanary(deaths)) == true)
      #expect(await eventuallyWithin { delivered.current == 1 })
      loop.remove(commands!.source, from: .default)
      _ = try await withWatchdogOnThread(timeout: .seconds(20), "a round trip") { try loop.performAndWait {} }
      for _ in 0..<3 { #expect(commands?.post(ReleaseCanary(deaths)) == true) }
      await execShutdown(loop)
    } else {
      for _ in 0..<3 { #expect(commands?.post(ReleaseCanary(deaths)) == true) }
    }
    let before = wasOnALoop ? 1 : 0
    #expect(deaths.current == before)
    commands?.source.invalidate()
    #expect(
      await eventuallyWithin(3) { deaths.current == before + 3 },
      "released \(deaths.current - before) of 3 dropped commands; pendingCount \(commands?.pendingCount ?? -1)")
    #expect(commands?.pendingCount == 0)
    #expect(commands?.droppedCount == 3)
    #expect(commands?.post(ReleaseCanary(deaths)) == false)  // refused: that canary is released at once
    #expect(delivered.current == before)
    #expect(deaths.current == before + 4)
    commands = nil
    #expect(deaths.current == before + 4)
  }
}

@Suite("Members are released once they leave their loop", .serialized, .timeLimit(.minutes(10)))
struct MembersReleasedOnceTheyLeaveTests {
  /// Members of every kind in several modes and `.common`, removed by name and by `.common` in
  /// every order: once out of their last mode name, the loop holds none of them (nor their
  /// closures), and they are in no mode.
  @Test func membersInSeveralModesAreReleasedOnceRemovedFromTheirLastModeName() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "release") { () throws -> [String] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      var problems: [String] = []
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let names: [[RunLoopMode]] = [
        [payloadModeA, payloadModeB, .common], [.common, payloadModeA, payloadModeB],
        [payloadModeB, .common, payloadModeA],
        [.common, .default, payloadModeA, payloadModeB],
      ]
      loop.addModeToCommonModes(payloadModeC)
      for (round, order) in names.enumerated() {
        weak var weakTimer: LoopTimer?
        weak var weakObserver: LoopObserver?
        weak var weakSource: DescriptorSource?
        weak var weakInput: InputSource?
        weak var weakCapture: WeaklyObservedObject?
        do {
          let capture = WeaklyObservedObject()
          weakCapture = capture
          let timer = makeParkedTimer { _ in withExtendedLifetime(capture) {} }
          let observer = LoopObserver(activities: .all) { _, _ in withExtendedLifetime(capture) {} }
          let source = DescriptorSource(descriptor: pipe.read) { _, _ in withExtendedLifetime(capture) {} }
          let input = InputSource { _ in withExtendedLifetime(capture) {} }
          (weakTimer, weakObserver, weakSource, weakInput) = (timer, observer, source, input)
          for mode in names[0] {
            loop.add(timer, to: mode)
            loop.add(observer, to: mode)
            try loop.add(source, to: mode)
            loop.add(input, to: mode)
          }
          timer.setFireDate(.now)
          writeByte(pipe.write)
          input.signal()
          for mode in [payloadModeA, payloadModeB, payloadModeC, RunLoopMode.default] {
            _ = loop.run(mode: mode, until: .now.advanced(by: .milliseconds(5)))
          }
          _ = drainDescriptor(pipe.read)
          for mode in order {
            loop.remove(timer, from: mode)
            loop.remove(observer, from: mode)
            loop.remove(source, from: mode)
            loop.remove(input, from: mode)
          }
          if !loop.core.modes(of: timer).isEmpty || !loop.core.modes(of: observer).isEmpty
            || !loop.core.modes(of: source).isEmpty || !loop.core.modes(of: input).isEmpty
          {
            problems.append("round \(round): still in modes")
          }
          if loop.core.modeTable.allRecords.count != 0 { problems.append("round \(round): records left") }
        }
        let alive = [weakTimer != nil, weakObserver != nil, weakSource != nil, weakInput != nil]
        if alive.contains(true) { problems.append("round \(round): members still held \(alive)") }
        if weakCapture != nil { problems.append("round \(round): a closure is still held") }
      }
      return problems
    }
    #expect(outcome == [])
  }

  /// The loop shuts down from a timer's callout while a run nested in it has parked the timer's
  /// extra entries (the first mode removed): the drain detaches it without a crash and releases
  /// it.
  @Test func shutdownFromACalloutWithParkedExtraEntriesReleasesTheTimer() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "shutdown in callout") {
      () throws -> (fires: Int, released: Bool) in
      let fires = AtomicCounter()
      weak var weakTimer: LoopTimer?
      do {
        let loop = try RunLoopThread(name: "shutdown-callout")
        let calloutDone = TestGate()
        let timer = makeParkedTimer { _ in
          fires.increment()
          let current = RunLoopThread.current
          _ = current.run(mode: payloadModeC, until: .now.advanced(by: .milliseconds(10)))
          current.shutdown()
          _ = current.run(mode: payloadModeB, until: .now.advanced(by: .milliseconds(10)))
          calloutDone.open()
        }
        weakTimer = timer
        for mode in [payloadModeA, payloadModeB, payloadModeC, RunLoopMode.default] { loop.add(timer, to: mode) }
        loop.remove(timer, from: payloadModeA)
        let keep = LoopTimer(after: .seconds(3600)) { _ in }
        loop.add(keep, to: payloadModeC)
        timer.setFireDate(.now)
        _ = calloutDone.wait(timeout: .seconds(10))
        loop.shutdownAndWait()
        keep.invalidate()
      }
      return (fires.current, weakTimer == nil)
    }
    #expect(outcome?.fires == 1)
    #expect(outcome?.released == true)
  }
}

/// Signals its source when it is released (and counts that): a user's object that reaches the
/// source it is captured by.
final class SignalsItsSourceOnDeinit: Sendable {
  let target: Locked<InputSource?>
  let released: AtomicCounter

  init(target: Locked<InputSource?>, released: AtomicCounter) {
    self.target = target
    self.released = released
  }

  deinit {
    target.withLock { $0 }?.signal()
    released.increment()
  }
}
