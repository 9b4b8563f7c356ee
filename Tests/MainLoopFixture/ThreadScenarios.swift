import AsyncRunLoop
import CAsyncRunLoop
import Dispatch
import Glibc

/// An actor whose executor is the main loop (not the main actor).
actor MainLoopBoundActor: LoopActor {
  nonisolated let loop: RunLoopThread = .main

  func visit(_ record: @Sendable (String) -> Void) {
    record("a job of an actor on RunLoopThread.main")
  }
}

/// Every way of reaching the main thread runs the body on the process's main thread, isolated to
/// the main actor, while `runMainLoop()` runs: MainActor jobs, DispatchQueue.main, the three
/// `runOnMain` forms, and the main loop's own performs, timers, sources, observers and jobs.
func threadsScenario() {
  check(!RunLoopThread.isMainLoopRunning, "the main loop counts as running before runMainLoop()")
  expectMainThreadAndMainActor("synchronous top-level code")
  let loop = RunLoopThread.main
  let expected: Set<String> = [
    "runOnMain queued before the loop ran", "DispatchQueue.main.async", "Task { @MainActor }",
    "runOnMain from a plain thread", "runOnMainAndWait from a plain thread", "RunLoopThread.main.perform",
    "a main loop timer", "a main loop input source", "a main loop descriptor source", "a main loop observer",
    "await runOnMain from a pool thread", "await MainActor.run", "a job of an actor on RunLoopThread.main",
    "a task preferring RunLoopThread.main", "runOnMain from a loop thread", "runOnMainAndWait from a loop thread",
  ]
  let seen = Locked<Set<String>>([])
  let record: @Sendable (String) -> Void = { kind in
    expectMainThreadAndMainActor(kind)
    let complete = seen.withLock { seen in
      seen.insert(kind)
      return seen.isSuperset(of: expected)
    }
    if complete { stopMainLoop() }
  }

  // Queued before the main loop runs: it runs once the loop starts.
  PlainThread { runOnMain { record("runOnMain queued before the loop ran") } }.join()

  // The main loop's own members.
  loop.add(LoopTimer(after: .milliseconds(1)) { _ in record("a main loop timer") }, to: .common)
  loop.add(
    LoopObserver(activities: .afterWaiting, repeats: false) { _, _ in record("a main loop observer") }, to: .common)
  let input = InputSource { source in
    record("a main loop input source")
    source.invalidate()
  }
  loop.add(input, to: .common)
  var pipeEnds: [Int32] = [0, 0]
  check(pipe(&pipeEnds) == 0, "pipe failed")
  let (readEnd, writeEnd) = (pipeEnds[0], pipeEnds[1])
  do {
    try loop.add(
      DescriptorSource(descriptor: readEnd) { source, _ in
        var byte: UInt8 = 0
        _ = read(readEnd, &byte, 1)
        source.invalidate()
        record("a main loop descriptor source")
      }, to: .common)
  } catch {
    fail("cannot add the descriptor source: \(error)")
  }

  let plain = PlainThread {
    waitUntil("the main loop to run") { RunLoopThread.isMainLoopRunning }
    check(!RunLoopThread.isMainThread, "a plain thread counts as the main thread")
    DispatchQueue.main.async { record("DispatchQueue.main.async") }
    Task { @MainActor in record("Task { @MainActor }") }
    runOnMain { record("runOnMain from a plain thread") }
    do {
      let value = try runOnMainAndWait {
        record("runOnMainAndWait from a plain thread")
        return 7
      }
      check(value == 7, "runOnMainAndWait returned \(value)")
    } catch {
      fail("runOnMainAndWait threw \(error)")
    }
    loop.perform { record("RunLoopThread.main.perform") }
    input.signal()
    var byte: UInt8 = 1
    _ = write(writeEnd, &byte, 1)
  }

  Task.detached {
    check(!isOnMainThread, "a detached task started on the main thread")
    await runOnMain { record("await runOnMain from a pool thread") }
    await MainActor.run { record("await MainActor.run") }
    await MainLoopBoundActor().visit(record)
    await Task(executorPreference: loop) { record("a task preferring RunLoopThread.main") }.value
  }

  let worker = RunLoopThread.start(named: "fixture-worker")
  worker.perform {
    waitUntil("the main loop to run") { RunLoopThread.isMainLoopRunning }
    runOnMain { record("runOnMain from a loop thread") }
    do {
      try runOnMainAndWait { record("runOnMainAndWait from a loop thread") }
    } catch {
      fail("runOnMainAndWait from a loop thread threw \(error)")
    }
  }

  runMainLoop()
  plain.join()
  worker.shutdownAndWait()
  close(readEnd)
  close(writeEnd)
  check(!RunLoopThread.isMainLoopRunning, "the main loop counts as running after runMainLoop() returned")
  check(seen.current == expected, "missing: \(expected.subtracting(seen.current).sorted())")
  say("checked on the main thread: \(expected.sorted().joined(separator: "; "))")
}

/// Calls from one thread run in the order they were made, whichever way each call went (runOnMain,
/// runOnMainAndWait, Task { @MainActor }, DispatchQueue.main.async); also for a task that mixes
/// runOnMain and await runOnMain.
func orderScenario() {
  let plainSenders = 4
  let callsPerSender = 3000
  let senders = plainSenders + 2  // plus a loop thread and a task
  let received = Locked<[[Int]]>(Array(repeating: [], count: senders))
  let record: @Sendable (Int, Int) -> Void = { sender, sequence in
    check(isOnMainThread, "sender \(sender)'s call \(sequence) ran off the main thread")
    MainActor.assumeIsolated {}
    received.withLock { $0[sender].append(sequence) }
  }
  let send: @Sendable (Int, Int) -> Void = { sender, sequence in
    switch sequence % 4 {
    case 0:
      runOnMain { record(sender, sequence) }
    case 1:
      Task { @MainActor in record(sender, sequence) }
    case 2:
      DispatchQueue.main.async { record(sender, sequence) }
    default:
      if sequence % 100 == 3 {
        do { try runOnMainAndWait { record(sender, sequence) } } catch { fail("runOnMainAndWait threw \(error)") }
      } else {
        runOnMain { record(sender, sequence) }
      }
    }
  }
  let finished = Locked(0)
  let senderDone: @Sendable () -> Void = {
    if finished.withLock({ count in
      count += 1
      return count == senders
    }) {
      runOnMain { stopMainLoop() }  // queued behind every sender's calls
    }
  }
  var threads: [PlainThread] = []
  for sender in 0..<plainSenders {
    threads.append(
      PlainThread {
        waitUntil("the main loop to run") { RunLoopThread.isMainLoopRunning }
        for sequence in 0..<callsPerSender { send(sender, sequence) }
        senderDone()
      })
  }
  let worker = RunLoopThread.start(named: "fixture-sender")
  worker.perform {
    waitUntil("the main loop to run") { RunLoopThread.isMainLoopRunning }
    for sequence in 0..<callsPerSender { send(plainSenders, sequence) }
    senderDone()
  }
  let taskSender = plainSenders + 1
  Task.detached {
    for sequence in 0..<callsPerSender / 10 {
      if sequence.isMultiple(of: 2) {
        fireAndForget { record(taskSender, sequence) }
      } else {
        await runOnMain { record(taskSender, sequence) }
      }
    }
    senderDone()
  }
  runMainLoop()
  for thread in threads { thread.join() }
  worker.shutdownAndWait()
  let lists = received.current
  for sender in 0..<senders {
    let count = sender == taskSender ? callsPerSender / 10 : callsPerSender
    check(lists[sender] == Array(0..<count), "sender \(sender)'s calls ran out of order or were lost")
  }
  say("order kept for \(senders) senders (\(lists.map(\.count).reduce(0, +)) calls)")
}

/// `runOnMain` from a synchronous function (the fire-and-forget overload), for async callers.
func fireAndForget(_ body: @escaping @MainActor () -> Void) {
  runOnMain(body)
}
