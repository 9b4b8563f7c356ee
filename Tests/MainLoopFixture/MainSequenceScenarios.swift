import AsyncRunLoop
import Dispatch
import Glibc

/// Sequences on the main loop consumed from `@MainActor` code and from a task that
/// prefers the main loop, with producers on plain threads: every element arrives exactly once,
/// on the main thread; a timer sequence on the main loop ticks for a `@MainActor` consumer.
func mainSequencesScenario() {
  let loop = RunLoopThread.main
  let producers = 4
  let perProducer = 2000
  let elements = loop.sourceSequence(of: Int.self)
  let signals = loop.signalSequence()
  let ticks = loop.timer(every: .milliseconds(5))
  let done = Locked(0)
  let finished: @Sendable () -> Void = {
    if done.withLock({ count in
      count += 1
      return count == 3
    }) {
      stopMainLoop()
    }
  }
  let received = Locked<[Int]>([])
  let signalTotal = Locked(0)
  Task { @MainActor in
    var next = [Int](repeating: 0, count: producers)
    var count = 0
    for await value in elements {
      expectMainThreadAndMainActor("a @MainActor consumer of a main-loop source sequence")
      let producer = value / 1_000_000
      check(value % 1_000_000 == next[producer], "producer \(producer)'s element \(value) out of order")
      next[producer] += 1
      count += 1
    }
    received.withLock { $0 = next }
    check(count == producers * perProducer, "received \(count) of \(producers * perProducer)")
    finished()
  }
  Task(executorPreference: loop) {
    var total = 0
    for await count in signals {
      check(isOnMainThread, "a signal consumer preferring the main loop ran off the main thread")
      total += count
    }
    signalTotal.withLock { $0 = total }
    finished()
  }
  Task { @MainActor in
    var count = 0
    for await tick in ticks {
      expectMainThreadAndMainActor("a @MainActor consumer of a main-loop timer sequence")
      check(tick.scheduled <= .now, "a tick came before it was due")
      count += 1
      if count == 3 { break }
    }
    finished()
  }
  let threads = (0..<producers).map { producer in
    PlainThread {
      waitUntil("the main loop to run") { RunLoopThread.isMainLoopRunning }
      for index in 0..<perProducer {
        check(elements.post(producer * 1_000_000 + index) == .enqueued, "a post was refused")
        check(signals.signal(), "a signal was refused")
      }
    }
  }
  let closer = PlainThread {
    for thread in threads { thread.join() }
    elements.invalidate()
    signals.invalidate()
  }
  runMainLoop()
  closer.join()
  check(received.current == Array(repeating: perProducer, count: producers), "per-producer counts \(received.current)")
  check(signalTotal.current == producers * perProducer, "signals counted \(signalTotal.current)")
  say("main-loop sequences: \(producers * perProducer) elements and signals, 3 ticks, all on the main thread")
}

/// `await runOnMain` "comes back to the caller's executor": from a task that prefers a worker
/// loop and from an actor on that loop, the body runs on the main thread and the caller resumes
/// on the worker loop's thread.
func runOnMainReturnsToTheCallersExecutorScenario() {
  let worker = RunLoopThread.start(named: "fixture-worker")
  let actor = SequenceScenarioWorker(loop: worker)
  Task(executorPreference: worker) {
    check(worker.isOnLoopThread, "the task did not start on the worker loop")
    let value = await runOnMain { () -> Int in
      expectMainThreadAndMainActor("await runOnMain from a task preferring a worker loop")
      return 1
    }
    check(value == 1, "runOnMain returned \(value)")
    check(worker.isOnLoopThread, "after await runOnMain the task preferring the worker loop is off it")
    await actor.hop()
    stopMainLoop()
  }
  runMainLoop()
  worker.shutdownAndWait()
  say("await runOnMain came back to the worker loop")
}

actor SequenceScenarioWorker: LoopActor {
  nonisolated let loop: RunLoopThread
  init(loop: RunLoopThread) { self.loop = loop }

  func hop() async {
    loop.checkIsolated()
    let onMain = await runOnMain { isOnMainThread }
    check(onMain, "await runOnMain from an actor on a worker loop did not run on the main thread")
    check(loop.isOnLoopThread, "after await runOnMain the worker loop's actor is off its thread")
    loop.checkIsolated()
  }
}
