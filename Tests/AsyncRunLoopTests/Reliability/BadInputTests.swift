import CAsyncRunLoop
import Glibc
import Testing

@testable import AsyncRunLoop

/// Bad input has defined answers (issue 12): out-of-range numbers saturate, are refused with an
/// error, or trap with a message naming the loop, the parameter and the rule — never with a bare
/// conversion trap.
@Suite("Bad input")
struct BadInputTests {
  // MARK: Floating-point seconds beyond Duration's range

  @Test func hugeSecondsSaturateInsteadOfTrapping() throws {
    let timer = try LoopTimer(seconds: 1e30, toleranceSeconds: 1e30) { _ in }
    #expect(timer.fireDate == .distantFuture)
    #expect(timer.tolerance == .nanoseconds(Int64.max))
    let largest = try LoopTimer(seconds: .greatestFiniteMagnitude) { _ in }
    #expect(largest.fireDate == .distantFuture)
  }

  @Test func hugeRepeatIntervalInSecondsSaturates() throws {
    let timer = try LoopTimer(seconds: 1, repeatingEverySeconds: 1e30) { _ in }
    #expect(timer.interval == .nanoseconds(Int64.max))
  }

  @Test func hugelyNegativeSecondsMakeAOneShotTimerThatFiresAtOnce() throws {
    let loop = try RunLoopThread(name: "bad-negative")
    defer { loop.shutdownAndWait() }
    let fires = Locked(0)
    let timer = try LoopTimer(seconds: -1e30, repeatingEverySeconds: -1e30) { _ in fires.withLock { $0 += 1 } }
    #expect(timer.fireDate < .now)  // in the past: it fires as soon as possible
    #expect(timer.interval == nil)
    loop.add(timer)
    waitUntil("the fire") { fires.withLock { $0 } == 1 && !timer.isValid }
    try loop.performAndWait {}
    #expect(fires.withLock { $0 } == 1)
  }

  @Test func secondsInTheUsualRangeAreUnchanged() throws {
    let timer = try LoopTimer(seconds: 1, repeatingEverySeconds: 0.25, toleranceSeconds: 0.001) { _ in }
    #expect(timer.interval == .milliseconds(250))
    #expect(timer.tolerance == .milliseconds(1))
  }
}

/// A CPU number below CPU_SETSIZE that the process's affinity mask does not allow (nil when the
/// mask allows every one, on a machine with 1024 CPUs).
private func disallowedCPU() throws -> Int? {
  let allowed = Set(try CPUAffinity.allowedCPUs())
  return (0..<Int(carl_cpu_set_size())).first { !allowed.contains($0) }
}

/// The CPUs the calling thread may run on.
@Sendable private func loopThreadCPUs() -> [Int] {
  var cpus = [Int32](repeating: 0, count: Int(carl_cpu_set_size()))
  let count = carl_thread_allowed_cpus(&cpus, Int32(cpus.count))
  return cpus.prefix(Int(max(count, 0))).map(Int.init)
}

extension BadInputTests {
  // MARK: Pinning a loop to a CPU

  @Test(arguments: [9999, -1, 1024, Int.max, Int.min])
  func pinningToACPUOutsideTheValidRangeThrows(cpu: Int) {
    #expect {
      _ = try RunLoopThread(name: "bad-pin", cpu: cpu)
    } throws: { error in
      guard let error = error as? SystemCallError else { return false }
      let text = error.description
      return error.errno == EINVAL && text.contains("loop 'bad-pin' to cpu \(cpu)") && text.contains("0..<1024")
        && text.contains("affinity mask")
    }
  }

  @Test func pinningToACPUTheAffinityMaskDoesNotAllowThrows() throws {
    let cpu = try #require(try disallowedCPU())
    let allowed = CPUAffinity.describe(try CPUAffinity.allowedCPUs())
    #expect {
      _ = try RunLoopThread(name: "bad-pin-mask", cpu: cpu)
    } throws: { error in
      guard let error = error as? SystemCallError else { return false }
      return error.errno == EINVAL && error.description.contains("to cpu \(cpu)")
        && error.description.contains("allows cpus \(allowed)")
    }
  }

  @Test func theAllowedCPUsAreListedAsRanges() {
    #expect(CPUAffinity.describe([0, 1, 2, 5]) == "0-2,5")
    #expect(CPUAffinity.describe([3]) == "3")
    #expect(CPUAffinity.describe([]) == "none")
  }

  @Test func pinningToAnAllowedCPUStartsTheLoopThere() throws {
    let cpu = try #require(try CPUAffinity.allowedCPUs().last)
    let loop = try RunLoopThread(name: "bad-pin-ok", cpu: cpu)
    defer { loop.shutdownAndWait() }
    #expect(try loop.performAndWait(loopThreadCPUs) == [cpu])
  }

  /// The kernel's refusal (here: a pin the check above would have refused, made anyway) fails
  /// `pthread_create` itself, so no thread exists, and the loop object with its descriptors goes.
  @Test func aPinTheKernelRefusesLeavesNoThreadAndNoLoop() throws {
    let cpu = try #require(try disallowedCPU())
    weak var released: RunLoopThread?
    do {
      let loop = try RunLoopThread(name: "bad-pin-kernel", ownsThread: true, isMainLoop: false)
      released = loop
      #expect {
        try loop.startThread(pinnedTo: Int32(cpu))
      } throws: { error in
        (error as? SystemCallError)?.errno == EINVAL
          && (error as? SystemCallError)?.call.contains("pinned to cpu \(cpu)") == true
      }
    }
    #expect(released == nil)
    #expect(threadCount(named: "bad-pin-kernel") == 0)
  }

  /// In a process of its own, where nothing else opens descriptors or starts threads.
  @Test func failedPinsLeakNoDescriptorsAndNoThreads() async {
    await #expect(processExitsWith: .success) {
      let disallowed = try disallowedCPU() ?? 9999
      let descriptors = openDescriptorCount()
      let threads = threadCount()
      for cpu in [9999, -1, Int.max, disallowed] {
        for _ in 0..<20 {
          guard (try? RunLoopThread(name: "bad-pin-leak", cpu: cpu)) == nil else { exit(2) }
          let loop = try RunLoopThread(name: "bad-pin-leak", ownsThread: true, isMainLoop: false)
          guard (try? loop.startThread(pinnedTo: Int32(disallowed))) == nil else { exit(3) }
        }
      }
      // 80 failures: a leak would show as 80 threads or 240 descriptors; the slack absorbs what
      // the test harness itself opens or starts in this process meanwhile.
      guard openDescriptorCount() - descriptors < 10 else { exit(4) }
      guard threadCount() - threads < 10 else { exit(5) }
    }
  }
}

extension BadInputTests {
  /// Under a narrowed affinity mask (as `taskset -c 1` leaves it), a pinned group uses the CPUs
  /// the mask allows, not 0..<online: pinning outside the mask would throw.
  @Test func pinnedLoopGroupUsesTheCPUsTheAffinityMaskAllows() async {
    await #expect(processExitsWith: .success) {
      guard let cpu = try CPUAffinity.allowedCPUs().last, cpu > 0 else { return }  // needs a CPU besides 0
      guard carl_restrict_process_to_cpu(Int32(cpu)) == 0 else { exit(2) }
      let group = try LoopGroup(count: 2, name: "bad-group", pinToCPUs: true)
      defer { group.shutdownAndWait() }
      for loop in group.loops {
        guard try loop.performAndWait(loopThreadCPUs) == [cpu] else { exit(3) }
      }
    }
  }
}

/// A global actor on a loop of its own, as users write them.
@globalActor
actor BadInputGlobalActor: GlobalActor, LoopActor {
  static let shared = BadInputGlobalActor()
  nonisolated let loop: RunLoopThread = .start(named: "bad-global")
}

protocol BadInputGreeting {
  func greet() -> String
}

/// Conforms only while isolated to the global actor: a dynamic cast to the protocol checks that
/// isolation at run time without trapping.
struct BadInputGreeter: @BadInputGlobalActor BadInputGreeting {
  @BadInputGlobalActor func greet() -> String { "hello" }
}

@BadInputGlobalActor func isolationMacroNamesTheGlobalActor() -> Bool {
  #isolation === BadInputGlobalActor.shared
}

extension BadInputTests {
  // MARK: Isolation traps name the loop and the thread

  @Test func actorAssumeIsolatedOffTheLoopNamesTheLoopAndTheThread() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let loop = try RunLoopThread(name: "bad-assume")
      ExecProbe(loop: loop).touchWithoutChecking()
    }
    expectStandardError(of: result, mentions: "expected to run on loop 'bad-assume', but running on thread '")
    expectStandardError(of: result, mentions: "(tid ")
  }

  @Test func actorPreconditionIsolatedOffTheLoopNamesTheLoop() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let loop = try RunLoopThread(name: "bad-precondition")
      ExecProbe(loop: loop).preconditionIsolated()
    }
    expectStandardError(of: result, mentions: "expected to run on loop 'bad-precondition', but running on thread")
  }

  @Test func globalActorAssumeIsolatedOnAnotherLoopNamesBothLoops() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let other = try RunLoopThread(name: "bad-other")
      _ = try other.performAndWait { BadInputGlobalActor.shared.assumeIsolated { _ in } }
    }
    expectStandardError(of: result, mentions: "expected to run on loop 'bad-global', but running on thread 'bad-other'")
    expectStandardError(of: result, mentions: "the thread of loop 'bad-other'")
  }

  // MARK: Checks that must not trap keep their answers

  @Test func isolatedConformanceCastsAnswerWithoutTrapping() async throws {
    let loop = BadInputGlobalActor.shared.loop
    #expect((BadInputGreeter() as Any) as? any BadInputGreeting == nil)  // off the loop
    #expect(try loop.performAndWait { (BadInputGreeter() as Any) as? any BadInputGreeting != nil })
    let inActor = await Task { @BadInputGlobalActor in (BadInputGreeter() as Any) as? any BadInputGreeting != nil }
      .value
    #expect(inActor)
    #expect(await isolationMacroNamesTheGlobalActor())
  }

  @Test func directIsolationQueriesAnswerDefinitelyOnTheLoopAndTrueOrUnknownOnItsRole() throws {
    let loop = try RunLoopThread(name: "bad-query")
    defer { loop.shutdownAndWait() }
    let probe = ExecProbe(loop: loop)
    #expect(loop.isIsolatingCurrentContext() == false)
    #expect(probe.withSerialExecutor { $0.isIsolatingCurrentContext() } == nil)
    let onLoop = try loop.performAndWait {
      (loop.isIsolatingCurrentContext(), probe.withSerialExecutor { $0.isIsolatingCurrentContext() })
    }
    #expect(onLoop.0 == true)
    #expect(onLoop.1 == true)
  }
}

extension BadInputTests {
  // MARK: A repeating timer's tolerance is capped at half its interval

  @Test func aRepeatingTimersToleranceIsCappedAtHalfItsInterval() throws {
    let timer = LoopTimer(after: .milliseconds(10), repeatingEvery: .milliseconds(10), tolerance: .seconds(1)) { _ in }
    #expect(timer.tolerance == .milliseconds(5))
    let small = LoopTimer(after: .zero, repeatingEvery: .milliseconds(10), tolerance: .milliseconds(2)) { _ in }
    #expect(small.tolerance == .milliseconds(2))
    let zeroInterval = LoopTimer(after: .zero, repeatingEvery: .zero, tolerance: .seconds(1)) { _ in }
    #expect(zeroInterval.tolerance == .zero)
    let seconds = try LoopTimer(seconds: 0.01, repeatingEverySeconds: 0.01, toleranceSeconds: 1) { _ in }
    #expect(seconds.tolerance == .milliseconds(5))
  }

  @Test func aOneShotTimerKeepsItsWholeTolerance() {
    let timer = LoopTimer(after: .milliseconds(10), tolerance: .seconds(1)) { _ in }
    #expect(timer.tolerance == .seconds(1))
    let negativeInterval = LoopTimer(after: .zero, repeatingEvery: .seconds(-1), tolerance: .seconds(1)) { _ in }
    #expect(negativeInterval.tolerance == .seconds(1))  // a negative interval makes a one-shot timer
  }

  /// Behaviour, not timing: with the cap, twenty fires take about 200 ms; without it (about one
  /// fire a second) they would not fit in the generous bound.
  @Test func aFastTimerWithAHugeToleranceStillFiresOftenEnough() throws {
    let loop = try RunLoopThread(name: "bad-tolerance")
    defer { loop.shutdownAndWait() }
    let fires = Locked(0)
    let timer = LoopTimer(after: .milliseconds(10), repeatingEvery: .milliseconds(10), tolerance: .seconds(1)) { _ in
      fires.withLock { $0 += 1 }
    }
    loop.add(timer)
    waitUntil(timeout: .seconds(15), "twenty fires") { fires.withLock { $0 } >= 20 }
    timer.invalidate()
  }
}

extension BadInputTests {
  // MARK: An empty mode list traps

  @Test func performInNoModeTrapsNamingTheLoopAndTheParameter() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let loop = try RunLoopThread(name: "bad-modes")
      loop.perform(inModes: []) {}
    }
    expectStandardError(
      of: result, mentions: "perform(inModes:) on loop 'bad-modes' needs at least one mode in 'modes'")
  }

  @Test func performAndWaitInNoModeTrapsEvenOnTheLoopThread() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let loop = try RunLoopThread(name: "bad-modes-wait")
      _ = try loop.performAndWait { try loop.performAndWait(inModes: []) { 1 } }
    }
    expectStandardError(
      of: result, mentions: "performAndWait(inModes:) on loop 'bad-modes-wait' needs at least one mode in 'modes'")
  }
}

extension BadInputTests {
  // MARK: The sweep: other user input

  /// 18 bytes of two-byte characters: a byte-wise cut at 15 made an invalid name the kernel
  /// refused, so the loop's thread stayed unnamed.
  @Test func aLongNonASCIINameStillNamesTheThread() throws {
    let loop = try RunLoopThread(name: "ééééééééé")
    defer { loop.shutdownAndWait() }
    #expect(threadCount(named: "ééééééé") == 1)
    #expect(RunLoopThread.kernelThreadName("abcdefghijklmnopq") == "abcdefghijklmno")
  }

  @Test func emptyModeListsOfSequencesTrapNamingTheLoop() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let loop = try RunLoopThread(name: "bad-seq-modes")
      _ = loop.signalSequence(modes: [])
    }
    expectStandardError(
      of: result, mentions: "a SignalSequence on loop 'bad-seq-modes' needs at least one mode in 'modes'")
  }

  @Test func aNonPositiveTimerSequenceIntervalTrapsNamingTheLoop() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let loop = try RunLoopThread(name: "bad-seq-every")
      _ = loop.timer(every: .zero)
    }
    expectStandardError(of: result, mentions: "timer(every:) on loop 'bad-seq-every' needs a positive interval")
  }
}
