import Glibc
import Testing

@testable import AsyncRunLoop

/// Readiness ("version 1") sources on file descriptors (SPEC §3).
@Suite("DescriptorSource")
struct DescriptorSourceTests {
  @Test func readablePipeFiresTheHandlerOnTheLoopThread() throws {
    let loop = try RunLoopThread(name: "fd-readable")
    let (readEnd, writeEnd) = makePipe()
    let events = Locked<[DescriptorEvents]>([])
    let offThread = Locked(0)
    let source = DescriptorSource(descriptor: readEnd, interest: .readable) { _, occurred in
      if !loop.isOnLoopThread { offThread.withLock { $0 += 1 } }
      drainDescriptor(readEnd)
      events.withLock { $0.append(occurred) }
    }
    try loop.add(source, to: .default)  // from this thread: registered on the loop's next pass
    try loop.performAndWait {}
    writeByte(writeEnd)
    waitUntil("the readable event") { events.withLock { $0.count } >= 1 }
    #expect(events.withLock { $0[0] }.contains(.readable))
    #expect(offThread.withLock { $0 } == 0)

    // The peer closing is reported too (a read then returns 0).
    close(writeEnd)
    waitUntil("the hang-up") { events.withLock { $0.count } >= 2 }
    source.invalidate()
    loop.shutdownAndWait()
    close(readEnd)
  }

  @Test func writablePipeFiresTheHandler() throws {
    let loop = try RunLoopThread(name: "fd-writable")
    let (readEnd, writeEnd) = makePipe()
    let events = Locked<[DescriptorEvents]>([])
    let source = DescriptorSource(descriptor: writeEnd, interest: .writable) { source, occurred in
      events.withLock { $0.append(occurred) }
      source.invalidate()  // level-triggered: an empty pipe stays writable
    }
    try loop.add(source, to: .default)
    waitUntil("the writable event") { events.withLock { $0.count } >= 1 }
    try loop.performAndWait {}
    try loop.performAndWait {}
    #expect(events.withLock { $0 } == [.writable])
    loop.shutdownAndWait()
    close(readEnd)
    close(writeEnd)
  }

  @Test func removalStopsEventsAndAddingAgainResumesThem() throws {
    let loop = try RunLoopThread(name: "fd-remove")
    let (readEnd, writeEnd) = makePipe()
    let fired = Locked(0)
    let source = DescriptorSource(descriptor: readEnd) { _, _ in
      drainDescriptor(readEnd)
      fired.withLock { $0 += 1 }
    }
    try loop.add(source, to: .default)
    try loop.performAndWait {}
    writeByte(writeEnd)
    waitUntil("the first event") { fired.withLock { $0 } == 1 }

    loop.remove(source, from: .default)
    try loop.performAndWait {}  // the removal is applied before this block runs
    writeByte(writeEnd)
    // Two more passes, each waiting on epoll after the write: a registration would report it.
    try loop.performAndWait {}
    try loop.performAndWait {}
    #expect(fired.withLock { $0 } == 1)
    #expect(source.isValid)  // removal is not invalidation

    try loop.add(source, to: .default)  // the byte written meanwhile is still there
    waitUntil("the event after adding again") { fired.withLock { $0 } == 2 }
    source.invalidate()
    loop.shutdownAndWait()
    close(readEnd)
    close(writeEnd)
  }

  @Test func aClosedDescriptorWhoseNumberIsReusedNeverDeliversToTheOldRegistration() throws {
    let loop = try RunLoopThread(name: "fd-reuse")
    let (oldRead, oldWrite) = makePipe()
    let oldFired = Locked(0)
    let newFired = Locked(0)
    let oldSource = DescriptorSource(descriptor: oldRead) { source, _ in
      oldFired.withLock { $0 += 1 }
      source.invalidate()  // never expected; do not spin on it if it happens
    }
    try loop.performAndWait { try loop.add(oldSource, to: .default) }

    // Close the old read end *while registered* and reuse its number for a new pipe, in one
    // atomic step (dup2), so that no other test's descriptor can take the number in between.
    let (newRead, newWrite) = makePipe()
    #expect(dup2(newRead, oldRead) == oldRead)
    close(newRead)
    close(oldWrite)
    let reused = oldRead
    let newSource = DescriptorSource(descriptor: reused) { _, _ in
      drainDescriptor(reused)
      newFired.withLock { $0 += 1 }
    }
    try loop.performAndWait { try loop.add(newSource, to: .default) }
    writeByte(newWrite)
    waitUntil("the new registration's event") { newFired.withLock { $0 } == 1 }

    // Removing the old registration must not deregister the new one, which shares its number.
    oldSource.invalidate()
    try loop.performAndWait {}
    writeByte(newWrite)
    waitUntil("the new registration's second event") { newFired.withLock { $0 } == 2 }
    #expect(oldFired.withLock { $0 } == 0)
    newSource.invalidate()
    loop.shutdownAndWait()
    close(reused)
    close(newWrite)
  }

  @Test func addingAClosedDescriptorThrowsEBADF() throws {
    let loop = try RunLoopThread(name: "fd-closed")
    // A number at or above the open-files limit can never be open, unlike a descriptor we close
    // ourselves, whose number another test running in parallel could reuse at once.
    let neverOpen = Int32(clamping: sysconf(Int32(_SC_OPEN_MAX)))
    for descriptor in [neverOpen, -1] {
      let source = DescriptorSource(descriptor: descriptor) { _, _ in }
      let fromHere = #expect(throws: SystemCallError.self) { try loop.add(source, to: .default) }
      #expect(fromHere?.errno == EBADF)
      let onLoop = try loop.performAndWait { () -> Int32? in
        do {
          try loop.add(source, to: .default)
          return nil
        } catch {
          return (error as? SystemCallError)?.errno
        }
      }
      #expect(onLoop == EBADF)
    }
    loop.shutdownAndWait()
  }

  @Test func addingARegularFileOrDirectoryThrowsEPERM() throws {
    let loop = try RunLoopThread(name: "fd-file")
    var template = Array("/tmp/async-run-loop-test-XXXXXX".utf8CString)
    let file = mkstemp(&template)
    try #require(file >= 0)
    let directory = open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    try #require(directory >= 0)
    for descriptor in [file, directory] {
      let source = DescriptorSource(descriptor: descriptor) { _, _ in }
      let error = #expect(throws: SystemCallError.self) { try loop.add(source, to: .default) }
      #expect(error?.errno == EPERM)
    }
    loop.shutdownAndWait()
    close(file)
    close(directory)
    unlink(template)
  }

  @Test func descriptorSourcesFireOnlyInTheirModesAndEndARunAsHandledSource() {
    let log = EngineTestThread.run { () -> [String] in
      let loop = RunLoopThread.current
      let note = EngineEventLog()
      let (readEnd, writeEnd) = makePipe()
      loop.add(LoopTimer(after: .seconds(3_600)) { _ in }, to: .default)
      let source = DescriptorSource(descriptor: readEnd) { _, _ in
        drainDescriptor(readEnd)
        note("readable")
      }
      do {
        try loop.add(source, to: "modal")
      } catch {
        note("add failed: \(error)")
      }
      writeByte(writeEnd)
      note("\(loop.run(mode: .default, until: .now.advanced(by: .milliseconds(30))))")
      note("\(loop.run(mode: "modal", until: .now.advanced(by: .seconds(60)), returnAfterSourceHandled: true))")
      writeByte(writeEnd)
      note("\(loop.run(mode: .default, until: .now.advanced(by: .milliseconds(30))))")
      note("\(loop.run(mode: "modal", until: .now.advanced(by: .seconds(60)), returnAfterSourceHandled: true))")
      source.invalidate()
      close(readEnd)
      close(writeEnd)
      return note.entries
    }
    #expect(log == ["timedOut", "readable", "handledSource", "timedOut", "readable", "handledSource"])
  }

  @Test func anEventDuringANestedRunInAnotherModeIsDeliveredWhenTheOuterRunResumes() {
    // The nested run silences the outer mode's registration when it reports an event; the outer
    // run must listen to it again before it next sleeps, not only at the start of its next pass.
    let result = EngineTestThread.run { () -> RunLoopRunResult in
      let loop = RunLoopThread.current
      let (readEnd, writeEnd) = makePipe()
      loop.add(LoopTimer(after: .seconds(3_600)) { _ in }, to: .default)
      loop.add(LoopTimer(after: .seconds(3_600)) { _ in }, to: "modal")
      let source = DescriptorSource(descriptor: readEnd) { _, _ in
        drainDescriptor(readEnd)
        RunLoopThread.current.stop()
      }
      try? loop.add(source, to: .default)
      let modal = InputSource { _ in
        writeByte(writeEnd)  // ready now, but the nested mode does not hold the source
        _ = RunLoopThread.current.run(mode: "modal", until: .now.advanced(by: .milliseconds(50)))
      }
      loop.add(modal, to: .default)
      modal.signal()
      let result = loop.run(mode: .default, until: .now.advanced(by: .seconds(60)))
      source.invalidate()
      modal.invalidate()
      close(readEnd)
      close(writeEnd)
      return result
    }
    #expect(result == .stopped)
  }

  @Test func aHandlerThatRunsTheLoopNestedLeavesNoStaleEventsForTheOuterPass() {
    // Two pipes are readable when the loop waits: one wait reports both. The first handler runs
    // the loop nested, where the other pipe is handled (and drained); the outer pass must not
    // then hand the other handler the event it had already seen.
    let pipes = [makePipe(), makePipe()]
    defer {
      for pipe in pipes {
        close(pipe.read)
        close(pipe.write)
      }
    }
    let readsPerCall = EngineTestThread.run { () -> [Int] in
      let loop = RunLoopThread.current
      loop.addModeToCommonModes("modal")
      let reads = Locked<[Int]>([])
      let nested = Locked(false)
      let sources = pipes.map { pipe in
        DescriptorSource(descriptor: pipe.read, interest: .readable) { _, _ in
          reads.withLock { $0.append(drainDescriptor(pipe.read)) }
          let first = nested.withLock { done in
            defer { done = true }
            return !done
          }
          if first { _ = RunLoopThread.current.run(mode: "modal", until: .now) }
        }
      }
      for source in sources { try? loop.add(source, to: .common) }
      for pipe in pipes { writeByte(pipe.write) }
      _ = loop.run(mode: .default, until: .now)
      _ = loop.run(mode: .default, until: .now)  // whatever was left, if anything
      for source in sources { source.invalidate() }
      return reads.withLock { $0 }
    }
    #expect(readsPerCall == [1, 1], "bytes read by each handler call: \(readsPerCall)")
  }

  @Test func aHungUpDescriptorOfAnotherModeDoesNotWakeTheLoopOverAndOver() {
    // The writer is closed: the read end reports a hang-up on every wait it is registered for,
    // whatever the interest. In a mode that ignores it, the loop must stop listening to it.
    let (readEnd, writeEnd) = makePipe()
    close(writeEnd)
    defer { close(readEnd) }
    let (wakes, handled) = EngineTestThread.run { () -> (Int, Int) in
      let loop = RunLoopThread.current
      let handled = Locked(0)
      let hungUp = DescriptorSource(descriptor: readEnd, interest: .readable) { _, _ in handled.withLock { $0 += 1 } }
      try? loop.add(hungUp, to: .default)
      let modal = LoopTimer(after: .seconds(3_600)) { _ in }  // keeps "modal" alive
      loop.add(modal, to: "modal")
      let wakes = Locked(0)
      let counter = LoopObserver(activities: .afterWaiting) { _, _ in wakes.withLock { $0 += 1 } }
      loop.add(counter, to: "modal")
      _ = loop.run(mode: "modal", for: .milliseconds(100))
      hungUp.invalidate()
      modal.invalidate()
      counter.invalidate()
      return (wakes.withLock { $0 }, handled.withLock { $0 })
    }
    // One wake-up may deliver the hang-up (and silence the registration); the time limit ends
    // the run. Listening to it on every wait would wake the loop thousands of times.
    #expect(wakes <= 3, "\(wakes) wake-ups in a modal run that had nothing to do")
    #expect(handled == 0)
  }
}
