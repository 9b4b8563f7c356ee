import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("Descriptor registrations carry their source in the kind's payload", .serialized, .timeLimit(.minutes(10)))
struct DescriptorRegistrationTests {
  /// What the loop keeps for its descriptors (loop thread): registrations by token, and tokens by
  /// number.
  private static func registrations(_ loop: RunLoopThread) -> (byToken: Int, numbers: [Int32]) {
    (loop.core.descriptors.count, loop.core.descriptors.registry.ownedDescriptors)
  }

  /// A source in A and B, its descriptor readable: runs in C silence it (no spin, no delivery),
  /// switching back re-arms it (A and B each deliver, `.readable` only); removed while silenced
  /// (from another thread, during a run in C) it leaves nothing behind, and a second source on
  /// the same descriptor registers and hears it.
  @Test func aSourceInTwoModesIsSilencedAndReArmedAndRemovedWhileSilenced() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "silence and re-arm") {
      () throws -> [String] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      var problems: [String] = []
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let counter = PassCountingObserver()
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: payloadModeC)
      loop.add(counter.observer, to: payloadModeC)
      let events = Locked<[DescriptorEvents]>([])
      weak var weakCapture: WeaklyObservedObject?
      weak var weakSource: DescriptorSource?
      do {
        let capture = WeaklyObservedObject()
        weakCapture = capture
        let source = DescriptorSource(descriptor: pipe.read) { _, fired in
          withExtendedLifetime(capture) {}
          events.withLock { $0.append(fired) }
          _ = drainDescriptor(pipe.read)
          RunLoopThread.current.stop()
        }
        weakSource = source
        try loop.add(source, to: payloadModeA)
        try loop.add(source, to: payloadModeB)
        writeByte(pipe.write)
        var before = counter.passes.current
        _ = loop.run(mode: payloadModeC, until: .now.advanced(by: .milliseconds(100)))
        if counter.passes.current - before > 200 { problems.append("C spun: \(counter.passes.current - before)") }
        if !events.withLock({ $0.isEmpty }) { problems.append("delivered in C") }
        for mode in [payloadModeA, payloadModeB] {
          if mode == payloadModeB { writeByte(pipe.write) }
          let result = loop.run(mode: mode, until: .now.advanced(by: .seconds(5)))
          if result != .stopped { problems.append("\(mode): \(result)") }
          _ = loop.run(mode: payloadModeC, until: .now.advanced(by: .milliseconds(10)))  // silence again
        }
        if events.withLock({ $0 }) != [.readable, .readable] { problems.append("events \(events.withLock { $0 })") }
        // Silenced in C (readable again), then removed from both modes by another thread.
        writeByte(pipe.write)
        let remover = startThread {
          usleep(20_000)
          loop.remove(source, from: payloadModeA)
          loop.remove(source, from: payloadModeB)
        }
        before = counter.passes.current
        _ = loop.run(mode: payloadModeC, until: .now.advanced(by: .milliseconds(100)))
        joinThread(remover)
        _ = loop.run(mode: payloadModeC, until: .now.advanced(by: .milliseconds(10)))  // applied by now
        if counter.passes.current - before > 200 { problems.append("C spun: \(counter.passes.current - before)") }
        let left = Self.registrations(loop)
        if left.byToken != 0 || !left.numbers.isEmpty { problems.append("registration left: \(left)") }
        if !loop.core.modes(of: source).isEmpty { problems.append("still in modes") }
      }
      // A second source on the same descriptor registers (the first one's is gone) and hears it.
      let second = Locked(0)
      let other = DescriptorSource(descriptor: pipe.read) { _, _ in
        second.withLock { $0 += 1 }
        _ = drainDescriptor(pipe.read)
        RunLoopThread.current.stop()
      }
      do {
        try loop.add(other, to: payloadModeA)
      } catch {
        problems.append("second source refused: \(error)")
      }
      if loop.run(mode: payloadModeA, until: .now.advanced(by: .seconds(5))) != .stopped {
        problems.append("second: no fire")
      }
      if second.withLock({ $0 }) != 1 { problems.append("second fired \(second.withLock { $0 })") }
      if events.withLock({ $0.count }) != 2 { problems.append("the removed source fired again") }
      other.invalidate()
      keep.invalidate()
      counter.observer.invalidate()
      if weakSource != nil { problems.append("removed source still held") }
      if weakCapture != nil { problems.append("removed source's handler still held") }
      return problems
    }
    #expect(outcome == [])
  }

  /// Paused (as a `ReadinessSequence` consumer with a full buffer pauses it), the registration
  /// stays silent across mode switches, resumes on request, and invalidated while paused from
  /// another thread it leaves nothing: a second source on the descriptor registers.
  @Test func aPausedSourceStaysSilentAcrossModeSwitchesAndLeavesNothingWhenInvalidated() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "paused") { () throws -> [String] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      var problems: [String] = []
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let counter = PassCountingObserver()
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: .common)
      loop.addModeToCommonModes(payloadModeA)
      loop.addModeToCommonModes(payloadModeC)
      loop.add(counter.observer, to: .common)
      let fires = AtomicCounter()
      let source = DescriptorSource(descriptor: pipe.read) { _, _ in
        fires.increment()
        RunLoopThread.current.stop()
      }
      try loop.add(source, to: payloadModeA)
      try loop.add(source, to: .default)
      loop.core.setPaused(source, true)
      writeByte(pipe.write)  // readable from now on (nobody drains it)
      for mode in [payloadModeA, payloadModeC, .default, payloadModeA] {
        let before = counter.passes.current
        _ = loop.run(mode: mode, until: .now.advanced(by: .milliseconds(40)))
        if counter.passes.current - before > 200 { problems.append("\(mode) spun: \(counter.passes.current - before)") }
      }
      if fires.current != 0 { problems.append("a paused source fired \(fires.current) times") }
      loop.core.setPaused(source, false)
      if loop.run(mode: payloadModeA, until: .now.advanced(by: .seconds(5))) != .stopped {
        problems.append("no fire on resume")
      }
      if fires.current != 1 { problems.append("fired \(fires.current) times after resume") }
      // Silenced in C (a mode switch), then paused there, then resumed in C: still silent in C.
      _ = loop.run(mode: payloadModeC, until: .now.advanced(by: .milliseconds(20)))
      loop.core.setPaused(source, true)
      loop.core.setPaused(source, false)  // re-armed although C does not hold it
      let before = counter.passes.current
      _ = loop.run(mode: payloadModeC, until: .now.advanced(by: .milliseconds(40)))
      if counter.passes.current - before > 200 {
        problems.append("C spun after resume: \(counter.passes.current - before)")
      }
      if fires.current != 1 { problems.append("fired in C") }
      loop.core.setPaused(source, true)
      let invalidator = startThread { source.invalidate() }
      joinThread(invalidator)
      _ = loop.run(mode: payloadModeA, until: .now.advanced(by: .milliseconds(20)))
      let left = Self.registrations(loop)
      if left.byToken != 0 || !left.numbers.isEmpty { problems.append("registration left: \(left)") }
      let other = DescriptorSource(descriptor: pipe.read) { _, _ in
        _ = drainDescriptor(pipe.read)
        RunLoopThread.current.stop()
      }
      do {
        try loop.add(other, to: payloadModeA)
      } catch {
        problems.append("second source refused: \(error)")
      }
      if loop.run(mode: payloadModeA, until: .now.advanced(by: .seconds(5))) != .stopped {
        problems.append("second: no fire")
      }
      if fires.current != 1 { problems.append("the invalidated source fired") }
      other.invalidate()
      keep.invalidate()
      counter.observer.invalidate()
      return problems
    }
    #expect(outcome == [])
  }

  /// The documented `EEXIST`: a second source on a descriptor that a silenced (or paused) source
  /// of this loop still holds is refused; once that source is removed it is accepted.
  @Test func aSecondSourceOnAHeldDescriptorIsRefusedUntilTheFirstIsRemoved() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "second source") {
      () throws -> [String] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      var problems: [String] = []
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: payloadModeC)
      let first = DescriptorSource(descriptor: pipe.read) { _, _ in }
      try loop.add(first, to: payloadModeA)
      func secondIsRefused() -> Bool {
        let second = DescriptorSource(descriptor: pipe.read) { _, _ in }
        defer { second.invalidate() }
        do {
          try loop.add(second, to: payloadModeB)
          return false
        } catch {
          return error.errno == EEXIST
        }
      }
      if !secondIsRefused() { problems.append("accepted while the first is armed") }
      writeByte(pipe.write)
      _ = loop.run(mode: payloadModeC, until: .now.advanced(by: .milliseconds(20)))  // silences the first
      if !secondIsRefused() { problems.append("accepted while the first is silenced") }
      loop.core.setPaused(first, true)
      if !secondIsRefused() { problems.append("accepted while the first is paused") }
      loop.remove(first, from: payloadModeA)
      if secondIsRefused() { problems.append("refused after the first was removed") }
      let left = Self.registrations(loop)
      if left.byToken != 0 || !left.numbers.isEmpty { problems.append("registration left: \(left)") }
      first.invalidate()
      keep.invalidate()
      return problems
    }
    #expect(outcome == [])
  }

  /// Silenced, then its descriptor closed and the number reused for another pipe: a new source
  /// on the number is accepted and hears the new pipe; the old one never fires again (re-arming
  /// it would report the new file), and nothing spins.
  @Test func aSilencedSourceWhoseNumberIsReusedNeverHearsTheNewFile() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "reused number") {
      () throws -> [String] in
      let loop = RunLoopThread.current
      defer { loop.shutdown() }
      var problems: [String] = []
      let counter = PassCountingObserver()
      let keep = LoopTimer(after: .seconds(3600)) { _ in }
      loop.add(keep, to: .common)
      loop.addModeToCommonModes(payloadModeA)
      loop.addModeToCommonModes(payloadModeC)
      loop.add(counter.observer, to: .common)
      let old = makePipe()
      let number = old.read
      let oldFires = AtomicCounter()
      let oldSource = DescriptorSource(descriptor: number) { _, _ in oldFires.increment() }
      try loop.add(oldSource, to: payloadModeA)
      writeByte(old.write)
      _ = loop.run(mode: payloadModeC, until: .now.advanced(by: .milliseconds(20)))  // silenced
      // Closed and reused in one step (dup2 onto the number): between a `close` and a new pipe,
      // a test running alongside could take the number, and then close it under this one.
      let fresh = makePipe()
      precondition(dup2(fresh.read, number) == number)
      close(fresh.read)
      close(old.write)
      let newFires = AtomicCounter()
      let newSource = DescriptorSource(descriptor: number) { _, _ in
        newFires.increment()
        _ = drainDescriptor(number)
        RunLoopThread.current.stop()
      }
      do {
        try loop.add(newSource, to: payloadModeA)
      } catch {
        problems.append("the new source was refused: \(error)")
      }
      writeByte(fresh.write)
      if loop.run(mode: payloadModeA, until: .now.advanced(by: .seconds(5))) != .stopped {
        problems.append("new: no fire")
      }
      writeByte(fresh.write)
      let before = counter.passes.current
      _ = loop.run(mode: payloadModeC, until: .now.advanced(by: .milliseconds(30)))
      if loop.run(mode: payloadModeA, until: .now.advanced(by: .seconds(5))) != .stopped {
        problems.append("new: no 2nd fire")
      }
      if counter.passes.current - before > 200 { problems.append("spun: \(counter.passes.current - before)") }
      if oldFires.current != 0 { problems.append("the old source fired \(oldFires.current) times") }
      if newFires.current != 2 { problems.append("the new source fired \(newFires.current) times") }
      oldSource.invalidate()
      newSource.invalidate()
      _ = loop.run(mode: payloadModeA, until: .now.advanced(by: .milliseconds(10)))
      let left = Self.registrations(loop)
      if left.byToken != 0 || !left.numbers.isEmpty { problems.append("registration left: \(left)") }
      keep.invalidate()
      counter.observer.invalidate()
      close(number)
      close(fresh.write)
      return problems
    }
    #expect(outcome == [])
  }
}
