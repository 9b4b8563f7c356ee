import Glibc
import Testing

@testable import AsyncRunLoop

@Suite("The shutdown drain ends every member and wait", .serialized, .timeLimit(.minutes(10)))
struct ShutdownDrainTests {
  /// A chain of custom sources: the first is on the loop; the cancel routine of each adds the
  /// next to the loop (on the loop thread). The loop shuts down. Promised: "cancel exactly once
  /// per schedule" and "adding anything to a loop that has terminated invalidates it at once":
  /// every source the drain scheduled is cancelled, and none is left valid on the dead loop.
  @Test
  func aChainOfCancelRoutinesAddingSourcesDuringTheDrainIsFullyDetached() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "cancel chain at shutdown") {
      () throws -> (unpaired: [String], log: [String], valid: [Int], bound: [Int]) in
      let loop = try RunLoopThread(name: "d1")
      let log = EventLog()
      let pairs = PairLog()
      let chain = Guarded<[InputSource]>([])
      let added = Guarded<[Int]>([0])
      let length = 5
      for index in 0..<length {
        let source = loggedSource(
          "s\(index)", log, pairs: pairs,
          cancel: { _, loop in
            guard index + 1 < length else { return }
            added.withLock { $0.append(index + 1) }
            loop.add(chain.withLock { $0[index + 1] })
          })
        chain.withLock { $0.append(source) }
      }
      loop.add(chain.withLock { $0[0] })
      _ = try loop.performAndWait {}
      loop.shutdownAndWait()
      let sources = chain.snapshot
      let valid = added.snapshot.filter { sources[$0].isValid }
      let bound = sources.indices.filter { sources[$0].isBound(to: loop.shared) }
      for source in sources { source.invalidate() }
      return (pairs.unpaired, log.snapshot, valid, bound)
    }
    guard let outcome else { return }
    #expect(outcome.unpaired == [], "\(outcome.log)")
    #expect(outcome.valid == [], "\(outcome.log)")
    #expect(outcome.bound == [], "\(outcome.log)")
  }
}

extension ShutdownDrainTests {
  /// Two other threads keep sending registration changes (adding a mode to the common set, again
  /// and again: accepted while the loop drains) when the loop is shut down. Promised: the drain
  /// ends even if producers keep sending ("if producers outpace the drain for
  /// `shutdownDrainRounds` rounds the loop terminates anyway"): `shutdownAndWait()` returns while
  /// the flood goes on.
  @Test
  func theDrainEndsDuringAFloodOfChangesFromAnotherThread() async throws {
    let outcome = try await withWatchdogOnThread(timeout: .seconds(30), "drain during a flood") {
      () throws -> (returned: Bool, sent: Int) in
      let loop = try RunLoopThread(name: "d2")
      let stop = Guarded(false)
      let sent = AtomicCounter()
      let flooders = (0..<2).map { _ in
        startThread {
          while !stop.snapshot {
            for _ in 0..<64 { loop.addModeToCommonModes(loopThreadModeC) }
            sent.increment()
          }
        }
      }
      waitUntil("the flood started") { sent.current > 100 }
      let returned = TestGate()
      startThread(detached: true) {
        loop.shutdownAndWait()
        returned.open()
      }
      let inTime = returned.wait(timeout: .seconds(10 * watchdogScale))
      stop.withLock { $0 = true }
      for flooder in flooders { joinThread(flooder) }
      _ = returned.wait(timeout: .seconds(20))
      return (inTime, sent.current * 64)
    }
    guard let outcome else { return }
    #expect(
      outcome.returned,
      "shutdownAndWait() did not return in 10 s (times the watchdog scale) while \(outcome.sent) changes were sent")
  }
}

// MARK: - Shutdown drain past its cap

@Suite("The shutdown drain's order")
struct ShutdownDrainOrderTests {
  /// 24 command sources removed from L (holding commands posted since) and 12 added to L during
  /// its drain (accepted, waiting for the next round), all invalidated from 6 threads at once
  /// past the drain's cap while a drain block runs: every invalidation is taken, each source
  /// schedules and cancels once, every command is delivered once, nothing is dropped, and
  /// `shutdownAndWait` returns.
  @Test func invalidationsFromManyThreadsPastTheCapAreAllDelivered() async throws {
    let loop = try RunLoopThread(name: "many")
    let outcome = try await withWatchdogOnThread(timeout: .seconds(20), "many invalidations") {
      () -> (addsAccepted: Bool, tallies: [CommandTally]) in
      let books = (0..<36).map { _ in CommandBooks() }
      let sources = books.map { $0.makeSource() }
      for index in 0..<24 { loop.add(sources[index].source) }
      waitUntil { books[0..<24].allSatisfy { $0.schedules.current == 1 } }
      for index in 0..<24 { loop.remove(sources[index].source) }
      waitUntil { books[0..<24].allSatisfy { $0.cancels.current == 1 } }
      for index in 0..<36 {
        for command in 0..<3 { books[index].post(sources[index], command) }
      }
      let endDrain = holdDrain(loop)
      for index in 24..<36 { loop.add(sources[index].source, to: .default) }
      let addsAccepted = sources[24...].allSatisfy { $0.source.isValid }
      waitForDrainCap(loop)
      let invalidators: [@Sendable () -> Void] = (0..<6).map { thread in
        { for index in stride(from: thread, to: 36, by: 6) { sources[index].source.invalidate() } }
      }
      race(invalidators)
      endDrain.open()
      loop.shutdownAndWait()
      return (addsAccepted, (0..<36).map { CommandTally(books[$0], sources[$0]) })
    }
    guard let outcome else { return }
    #expect(outcome.addsAccepted, "setup: the adds in the drain were refused")
    for (index, tally) in outcome.tallies.enumerated() {
      #expect(tally.delivered == [0, 1, 2] && tally.dropped == 0 && tally.pending == 0, "source \(index): \(tally)")
      #expect(tally.schedules == 1 && tally.cancels == 1, "source \(index): \(tally)")
    }
  }

  /// Invalidations racing the end of the drain (no held block: the drain ends as soon as it is
  /// idle). A source removed from L before may be delivered there (invalidation taken) or
  /// dropped (refused: L terminated), never both, never twice; a source added to L during the
  /// drain is either scheduled, delivered and cancelled, or (its add refused) never scheduled and
  /// dropped; one added, removed and invalidated meanwhile delivers or drops each command once.
  @Test func invalidationsRacingTheEndOfTheDrainNeitherLoseNorDuplicate() async throws {
    let failures = try await withWatchdogOnThread(timeout: .seconds(30), "end-of-drain races") { () -> [String] in
      var failures: [String] = []
      repeatRounds(60 * stressFactor, budget: .milliseconds(1500)) { round in
        guard let loop = try? RunLoopThread(name: "end") else { return }
        let removedBooks = CommandBooks()
        let removed = removedBooks.makeSource()
        loop.add(removed.source)
        waitUntil { removedBooks.schedules.current == 1 }
        loop.remove(removed.source)
        waitUntil { removedBooks.cancels.current == 1 }
        let addedBooks = CommandBooks()
        let added = addedBooks.makeSource()
        let bouncedBooks = CommandBooks()
        let bounced = bouncedBooks.makeSource()
        for command in 0..<3 {
          removedBooks.post(removed, command)
          addedBooks.post(added, command)
          bouncedBooks.post(bounced, command)
        }
        race([
          { loop.shutdown() },
          {
            usleep(UInt32(round % 6) * 40)
            loop.add(added.source)
            added.source.invalidate()
          },
          {
            usleep(UInt32(round % 4) * 60)
            removed.source.invalidate()
          },
          {
            usleep(UInt32(round % 5) * 50)
            loop.add(bounced.source)
            loop.remove(bounced.source)
            bounced.source.invalidate()
          },
        ])
        loop.shutdownAndWait()
        let (removedTally, addedTally) = (CommandTally(removedBooks, removed), CommandTally(addedBooks, added))
        let removedOK =
          removedTally.balances && removedTally.pending == 0
          && (removedTally.delivered == [0, 1, 2] || removedTally.dropped == 3)
        let addedOK =
          addedTally.balances && addedTally.pending == 0
          && ((addedTally.delivered == [0, 1, 2] && addedTally.schedules == 1)
            || (addedTally.dropped == 3 && addedTally.schedules == 0))
        if !removedOK, failures.count < 3 { failures.append("round \(round) removed: \(removedTally)") }
        if !addedOK, failures.count < 3 { failures.append("round \(round) added: \(addedTally)") }
        let bouncedTally = CommandTally(bouncedBooks, bounced)
        if !(bouncedTally.balances && bouncedTally.pending == 0), failures.count < 3 {
          failures.append("round \(round) bounced: \(bouncedTally)")
        }
      }
      return failures
    }
    #expect(failures == [])
  }

  /// Past the cap, while a drain block runs, 4 threads keep adding new command sources to L
  /// (refused: each is invalidated with nothing to deliver on) and invalidating 200 sources that
  /// were on L; they go on after the block ends, until `shutdownAndWait` returned: the drain is
  /// not held open, the sources that were on L are delivered, and the refused ones drop exactly
  /// what they held.
  @Test func threadsHammeringPastTheCapCannotHoldTheDrainOpen() async throws {
    let loop = try RunLoopThread(name: "hammer")
    let result = try await withWatchdogOnThread(timeout: .seconds(20), "hammered drain") {
      () -> (onLoop: [CommandTally], refusedBalance: Bool, refusedScheduled: Int) in
      let books = (0..<200).map { _ in CommandBooks() }
      let sources = books.map { $0.makeSource() }
      for source in sources { loop.add(source.source) }
      waitUntil { books.allSatisfy { $0.schedules.current == 1 } }
      for source in sources { loop.remove(source.source) }
      waitUntil { books.allSatisfy { $0.cancels.current == 1 } }
      for (index, source) in sources.enumerated() { books[index].post(source, 0) }
      let endDrain = holdDrain(loop)
      waitForDrainCap(loop)
      let done = TestGate()
      let next = AtomicCounter()
      let invalidated = AtomicCounter()
      let refusedBooks = CommandBooks()
      let refusedDropped = AtomicCounter()
      let threads = (0..<4).map { _ in
        startThread {
          while !done.opened {
            let index = next.increment() - 1
            if index < 200 {
              sources[index].source.invalidate()
              invalidated.increment()
            }
            let fresh = refusedBooks.makeSource()
            refusedBooks.post(fresh, 0)
            loop.add(fresh.source, to: index % 2 == 0 ? RunLoopMode.default : RunLoopMode("other"))
            fresh.source.invalidate()
            for _ in 0..<fresh.droppedCount { refusedDropped.increment() }
            usleep(20)
          }
        }
      }
      waitUntil(timeout: .seconds(5), "the hammer's invalidations") { invalidated.current == 200 }
      endDrain.open()
      loop.shutdownAndWait()
      done.open()
      for thread in threads { joinThread(thread) }
      for source in sources { source.source.invalidate() }
      return (
        (0..<200).map { CommandTally(books[$0], sources[$0]) },
        refusedBooks.accepted.current == refusedDropped.current, refusedBooks.schedules.current
      )
    }
    guard let result else { return }
    let wrong = result.onLoop.enumerated().filter { !($0.element.delivered == [0] && $0.element.balances) }
    #expect(wrong.isEmpty, "\(wrong.prefix(3).map { "source \($0.offset): \($0.element)" })")
    #expect(result.refusedBalance)
    #expect(result.refusedScheduled == 0)
  }

  /// A command source added to L during its drain (accepted, waiting) and removed past the cap
  /// (refused: the binding lets go at once, L still applies the add), then added to an active
  /// loop L2 with commands posted before and after: L schedules and cancels it once, L2 delivers
  /// every command once, in order, and after its invalidation on L2 schedules and cancels pair up.
  @Test func aRemovalRefusedPastTheCapThenAMoveDeliversEverythingOnTheNewLoop() async throws {
    let loop = try RunLoopThread(name: "refrm")
    let next = try RunLoopThread(name: "refrm2")
    let result = try await withWatchdogOnThread(timeout: .seconds(20), "refused removal, then move") {
      () -> (addAccepted: Bool, beforeInvalidation: CommandTally, atEnd: CommandTally) in
      let books = CommandBooks()
      let commands = books.makeSource()
      let endDrain = holdDrain(loop)
      loop.add(commands.source, to: .default)
      let addAccepted = commands.source.isValid
      waitForDrainCap(loop)
      loop.remove(commands.source, from: .default)
      for command in 0..<3 { books.post(commands, command) }
      next.add(commands.source, to: .default)
      for command in 3..<6 { books.post(commands, command) }
      endDrain.open()
      loop.shutdownAndWait()
      waitUntil(timeout: .seconds(10), "delivery on the new loop") { books.delivered.snapshot.count >= 6 }
      let before = CommandTally(books, commands)
      commands.source.invalidate()
      next.shutdownAndWait()
      return (addAccepted, before, CommandTally(books, commands))
    }
    guard let result else { return }
    #expect(result.addAccepted, "setup: the add in the drain was refused")
    #expect(result.beforeInvalidation.delivered == Array(0..<6), "\(result.beforeInvalidation)")
    #expect(result.atEnd.delivered == Array(0..<6) && result.atEnd.dropped == 0, "\(result.atEnd)")
    #expect(result.atEnd.schedules == 2 && result.atEnd.cancels == 2, "\(result.atEnd)")
  }
}
