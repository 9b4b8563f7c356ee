import Glibc
import Testing

@testable import AsyncRunLoop

/// Nested runs entered from every kind of callout while other threads post, invalidate and shut
/// the loop down. Each scenario runs in an exit test's child process (a nested run from a job
/// crashes the process today), bounded by `alarm`: a hang kills the child and fails the test.
@Suite("Adversarial nesting: nested runs from every callout, under concurrent churn")
struct AdversarialNestingTests {
  static let calloutKinds = [
    "job", "block", "inputSource", "commandSource", "timer", "observer", "descriptor", "sequence",
  ]

  @Test(arguments: calloutKinds)
  func nestedRunsFromACalloutDeliverEveryAcceptedPostOnceAndTheOuterRunResumes(_ kind: String) async {
    await #expect(processExitsWith: .success) { [kind] in
      armChildAlarm(60)
      for round in 0..<(3 * stressFactor) {
        try await adversarialNestingRound(kind, round: round)
      }
    }
  }
}

/// An actor pinned to a loop whose method runs the loop nested (from an executor job).
actor NestingActor: LoopActor {
  nonisolated let loop: RunLoopThread
  let nest: @Sendable () -> Void
  init(loop: RunLoopThread, nest: @escaping @Sendable () -> Void) {
    self.loop = loop
    self.nest = nest
  }
  func nestOnce() { nest() }
}

/// One round: a loop with a victim `CommandSource` (in the default mode and the nested mode); a
/// callout of `kind` runs the loop nested, again and again, while one thread posts to the victim,
/// another invalidates it midway and a third shuts the loop down. Fails the child on a lost or
/// duplicated command, a cancel that did not run exactly once, or a nested run that did not
/// return to its callout.
func adversarialNestingRound(_ kind: String, round: Int) async throws {
  let loop = try RunLoopThread(name: "adv-\(kind)")
  let nestedMode: RunLoopMode = "adv-nested"
  let wanted = 20
  let entries = AtomicCounter()
  let resumed = AtomicCounter()
  let nestOnce: @Sendable () -> Void = {
    guard loop.isOnLoopThread else { childFail("a \(kind) callout ran off the loop thread") }
    entries.increment()
    loop.run(mode: nestedMode, for: .milliseconds(3))
    resumed.increment()
  }

  // The victim: delivered in the outer and the nested runs alike.
  let delivered = AtomicCounter()
  let accepted = AtomicCounter()
  let cancels = AtomicCounter()
  let victim = CommandSource<Int>(cancel: { _, _ in cancels.increment() }) { _ in delivered.increment() }
  loop.add(victim.source, to: .default)
  loop.add(victim.source, to: nestedMode)

  // The trigger: a callout of `kind` that nests, fired `wanted` times (or until the loop ends).
  let pipe = makePipe()
  defer {
    close(pipe.read)
    close(pipe.write)
  }
  let fire: @Sendable (Int) async -> Void
  var teardown: @Sendable () -> Void = {}
  switch kind {
  case "job":
    let actor = NestingActor(loop: loop, nest: nestOnce)
    fire = { _ in await actor.nestOnce() }
  case "block":
    fire = { _ in loop.perform(nestOnce) }
  case "inputSource":
    let source = InputSource { _ in nestOnce() }
    loop.add(source)
    fire = { _ in source.signal() }
    teardown = { source.invalidate() }
  case "commandSource":
    let command = CommandSource<Int> { _ in nestOnce() }
    loop.add(command.source)
    fire = { value in command.post(value) }
    teardown = { command.source.invalidate() }
  case "timer":
    let timer = LoopTimer(after: .milliseconds(1), repeatingEvery: .milliseconds(1)) { timer in
      if entries.current < wanted { nestOnce() } else { timer.invalidate() }
    }
    loop.add(timer)
    fire = { _ in }
    teardown = { timer.invalidate() }
  case "observer":
    let observer = LoopObserver(activities: [.beforeWaiting, .afterWaiting]) { observer, _ in
      if entries.current < wanted { nestOnce() } else { observer.invalidate() }
    }
    loop.add(observer)
    fire = { _ in loop.wakeUp() }
    teardown = { observer.invalidate() }
  case "descriptor":
    let source = DescriptorSource(descriptor: pipe.read) { source, _ in
      drainDescriptor(source.descriptor)
      nestOnce()
    }
    try loop.add(source)
    fire = { _ in writeByte(pipe.write) }
    teardown = { source.invalidate() }
  default:  // "sequence": a task on the loop consuming a SourceSequence nests for each element
    let sequence = loop.sourceSequence(of: Int.self)
    Task(executorPreference: loop) {
      for await _ in sequence { nestOnce() }
    }
    fire = { value in _ = sequence.post(value) }
    teardown = { sequence.invalidate() }
  }

  // The churn: a poster, an invalidator midway, and the shutdown, each on its own thread.
  let posterDone = TestGate()
  startThread(detached: true) {
    for value in 0..<400 where victim.post(value) { accepted.increment() }
    posterDone.open()
  }
  startThread(detached: true) {
    _ = poll(timeout: .seconds(5)) { accepted.current >= 200 }
    victim.source.invalidate()
  }
  for index in 0..<wanted {
    await fire(index)
    try? await Task.sleep(for: .milliseconds(1))
    if entries.current >= wanted { break }
  }
  _ = await pollAsync(timeout: .seconds(5)) { entries.current >= 1 }
  let shutdownDone = TestGate()
  startThread(detached: true) {
    loop.shutdown()
    shutdownDone.open()
  }
  // More posts race the shutdown (refused ones return false and are not counted).
  for value in 0..<50 where victim.post(value) { accepted.increment() }
  if !posterDone.wait(timeout: .seconds(20)) { childFail("round \(round): a post hung") }
  if !shutdownDone.wait(timeout: .seconds(20)) { childFail("round \(round): shutdown() hung") }
  teardown()
  let joined = TestGate()
  startThread(detached: true) {
    loop.shutdownAndWait()
    joined.open()
  }
  if !joined.wait(timeout: .seconds(20)) { childFail("\(kind) round \(round): the loop never finished") }

  // `#expect` shows the values in the parent's report; the exit status fails the exit test.
  let counts = (
    entries: entries.current, resumed: resumed.current, cancels: cancels.current, accepted: accepted.current,
    delivered: delivered.current
  )
  #expect(counts.entries > 0, "\(kind) round \(round): no callout ran the loop nested")
  #expect(counts.entries == counts.resumed, "\(kind) round \(round): a nested run did not return")
  #expect(counts.cancels == 1, "\(kind) round \(round): cancel did not run exactly once")
  #expect(counts.delivered == counts.accepted, "\(kind) round \(round): posts lost or duplicated")
  if counts.entries == 0 || counts.entries != counts.resumed || counts.cancels != 1
    || counts.delivered != counts.accepted
  {
    // The parent sees only the status: 100 + 10 × cancels (at most 9) + 1 for lost posts, 2 for
    // duplicated ones, 3 for a nesting failure.
    let lost = counts.delivered < counts.accepted ? 1 : counts.delivered > counts.accepted ? 2 : 0
    let nesting = counts.entries == 0 || counts.entries != counts.resumed ? 3 : 0
    exit(Int32(100 + 10 * min(counts.cancels, 9) + max(lost, nesting)))
  }
}
