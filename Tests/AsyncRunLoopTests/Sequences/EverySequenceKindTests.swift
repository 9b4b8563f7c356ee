import Glibc
import Testing

@testable import AsyncRunLoop

// MARK: - Every sequence kind: shutdown, leaks

@Suite("Every sequence kind keeps the same promises", .serialized, .timeLimit(.minutes(10)))
struct EverySequenceKindTests {
  /// Promised: the loop's shutdown ends every sequence whose consumer is suspended (each
  /// `for await` ends; none hangs), consumers pinned to the loop included; afterwards posts answer
  /// `.terminated` and `signal()` false.
  @Test func shutdownEndsEveryKindOfSequenceWhileItsConsumerWaits() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "shutdown ends sequences") {
      () async throws -> (waited: [Bool], ended: [Int], post: SourcePostResult, signal: Bool) in
      let loop = try RunLoopThread(name: "sd")
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let source = loop.sourceSequence(of: Int.self)
      let signals = loop.signalSequence()
      let timer = loop.timer(every: .seconds(3600))
      let readiness = try loop.readiness(of: pipe.read)
      let activities = loop.activities(.exit)
      let ended = AtomicCounter()
      let tasks: [Task<Void, Never>] = [
        Task(executorPreference: loop) {
          for await _ in source {}
          ended.increment()
        },
        Task {
          for await _ in signals {}
          ended.increment()
        },
        Task(executorPreference: loop) {
          for await _ in timer {}
          ended.increment()
        },
        Task {
          for await _ in readiness {}
          ended.increment()
        },
        Task(executorPreference: loop) {
          for await _ in activities {}
          ended.increment()
        },
      ]
      let waited = [
        await pollEveryMillisecond { isConsumerWaiting(source) },
        await pollEveryMillisecond { isConsumerWaiting(signals) },
        await pollEveryMillisecond { isConsumerWaiting(timer) },
        await pollEveryMillisecond { isConsumerWaiting(readiness) },
        await pollEveryMillisecond { isConsumerWaiting(activities) },
      ]
      await execShutdown(loop)
      for task in tasks { await task.value }
      return (waited, [ended.current], source.post(1), signals.signal())
    }
    guard let outcome else { return }
    #expect(outcome.waited == [true, true, true, true, true])
    #expect(outcome.ended == [5])
    #expect(outcome.post == .terminated)
    #expect(!outcome.signal)
  }
}

extension EverySequenceKindTests {
  /// Promised: a consumer that drops its iterator (`break`) ends the sequence and takes the
  /// member off its loop; once the sequence is dropped too, nothing keeps the sequence, its
  /// member or what the member's closures captured alive (checked with weak references), for
  /// every kind of sequence.
  @Test func breakingOutAndDroppingTheSequenceReleasesEverything() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "leaks") {
      () async throws -> (gone: [String: Bool], records: Int?) in
      let loop = try RunLoopThread(name: "leak")
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      var weak: [String: WeakReference] = [:]
      do {
        let token = WeaklyObservedObject()
        weak["token"] = WeakReference(token)
        let source = loop.sourceSequence(of: Int.self, onCancel: { _ in _ = token })
        weak["source"] = WeakReference(source)
        weak["source.member"] = WeakReference(source.source)
        _ = source.post(1)
        for await _ in source { break }
      }
      do {
        let signals = loop.signalSequence()
        weak["signals"] = WeakReference(signals)
        weak["signals.member"] = WeakReference(signals.source)
        signals.signal()
        for await _ in signals { break }
      }
      do {
        let timer = loop.timer(every: .milliseconds(1))
        weak["timer"] = WeakReference(timer)
        weak["timer.member"] = WeakReference(timer.timer)
        for await _ in timer { break }
      }
      do {
        let readiness = try loop.readiness(of: pipe.read)
        weak["readiness"] = WeakReference(readiness)
        weak["readiness.member"] = WeakReference(readiness.source)
        writeByte(pipe.write)
        for await _ in readiness { break }
      }
      do {
        let activities = loop.activities(.beforeWaiting)
        weak["activities"] = WeakReference(activities)
        weak["activities.member"] = WeakReference(activities.observer)
        loop.wakeUp()
        for await _ in activities { break }
      }
      let all = weak
      _ = await pollEveryMillisecond(timeout: .seconds(5)) {
        _ = try? loop.performAndWait {}
        return all.values.allSatisfy(\.isGone)
      }
      let records = await execOnNewThread { try? loop.performAndWait { loop.core.modeTable.allRecords.count } }
      await execShutdown(loop)
      return (all.mapValues(\.isGone), records)
    }
    guard let outcome else { return }
    for (name, gone) in outcome.gone.sorted(by: { $0.key < $1.key }) {
      #expect(gone, "\(name) is still alive")
    }
    #expect(outcome.records == 0, "the loop still holds \(String(describing: outcome.records)) records")
  }

  /// Promised: a readiness sequence pauses its registration while an element waits for its
  /// consumer, so a consumer on another executor that does not read does not make the loop spin
  /// on a descriptor that stays readable; once it asks again the element comes at once (the
  /// descriptor is still ready), and after it drained, a new byte brings a new element.
  @Test func aStalledReadinessConsumerDoesNotMakeTheLoopSpinAndLosesNothing() async throws {
    let outcome = try await withWatchdog(timeout: .seconds(30), "readiness pause") {
      () async throws -> (passes: Int, first: Bool, again: Bool, afterDrain: Bool) in
      let loop = try RunLoopThread(name: "ready")
      let pipe = makePipe()
      defer {
        close(pipe.read)
        close(pipe.write)
      }
      let passes = AtomicCounter()
      loop.add(LoopObserver(activities: .afterWaiting) { _, _ in passes.increment() }, to: .common)
      let readiness = try loop.readiness(of: pipe.read)
      var iterator = readiness.makeAsyncIterator()
      writeByte(pipe.write)
      let first = await iterator.next()?.contains(.readable) == true
      // Stall without reading: the loop sees the descriptor ready again, keeps one element for
      // the consumer, and pauses.
      try await Task.sleep(for: .milliseconds(200))
      let stalledPasses = passes.current
      let again = await iterator.next()?.contains(.readable) == true
      drainDescriptor(pipe.read)
      // Whatever readiness was recorded before the drain may still come once; then a new byte.
      let gotNew = Locked(false)
      writeByte(pipe.write)
      let next = await iterator.next()
      gotNew.withLock { $0 = next?.contains(.readable) == true }
      readiness.invalidate()
      while await iterator.next() != nil {}
      await execShutdown(loop)
      return (stalledPasses, first, again, gotNew.withLock { $0 })
    }
    guard let outcome else { return }
    #expect(outcome.first)
    #expect(outcome.again)
    #expect(outcome.afterDrain)
    #expect(outcome.passes < 50, "the loop woke \(outcome.passes) times in 200 ms for a stalled consumer")
  }
}
