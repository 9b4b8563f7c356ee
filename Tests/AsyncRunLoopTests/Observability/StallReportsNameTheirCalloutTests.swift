import Glibc
import Testing

@testable import AsyncRunLoop

/// Every kind of callout is reported under its own kind, with the label its member was given, the
/// mode it ran in and the nesting depth (issue 27, item 1). Each callout sleeps four times the
/// threshold, so each is certain to end with an `.ended` report.
@Suite("Stall reports name their callout")
struct StallReportsNameTheirCalloutTests {
  static let threshold = Duration.milliseconds(10)
  static let slow: useconds_t = 40_000

  @Test func eachCalloutKindIsReportedWithItsLabel() async throws {
    let loop = try RunLoopThread(name: "stall-kinds")
    let ended = Guarded<[StallReport]>([])
    let watch = loop.watchStalls(threshold: Self.threshold) { report in
      if case .ended = report.phase { ended.withLock { $0.append(report) } }
    }
    try loop.performAndWait {}
    let fired = Guarded<Set<String>>([])

    let source = InputSource(label: "commands") { _ in
      usleep(Self.slow)
      fired.withLock { _ = $0.insert("source") }
    }
    loop.add(source, to: .default)
    source.signal()
    waitUntil("the source") { fired.snapshot.contains("source") }

    let commands = CommandSource<Int>(label: "command buffer") { _ in
      usleep(Self.slow)
      fired.withLock { _ = $0.insert("command") }
    }
    loop.add(commands.source, to: .default)
    commands.post(1)
    waitUntil("the command") { fired.snapshot.contains("command") }
    commands.source.invalidate()

    let timer = LoopTimer(after: .zero, label: "tick") { _ in
      usleep(Self.slow)
      fired.withLock { _ = $0.insert("timer") }
    }
    loop.add(timer, to: .default)
    waitUntil("the timer") { fired.snapshot.contains("timer") }

    var pipe: [Int32] = [0, 0]
    #expect(Glibc.pipe(&pipe) == 0)
    let reader = DescriptorSource(descriptor: pipe[0], label: "pipe") { source, _ in
      var byte: UInt8 = 0
      _ = read(source.descriptor, &byte, 1)
      usleep(Self.slow)
      fired.withLock { _ = $0.insert("readiness") }
    }
    try loop.add(reader, to: .default)
    var byte: UInt8 = 1
    #expect(write(pipe[1], &byte, 1) == 1)
    waitUntil("the readiness handler") { fired.snapshot.contains("readiness") }
    reader.invalidate()

    let observer = LoopObserver(activities: .beforeSources, repeats: false, label: "watcher") { _, _ in
      usleep(Self.slow)
      fired.withLock { _ = $0.insert("observer") }
    }
    loop.add(observer, to: .default)
    loop.wakeUp()
    waitUntil("the observer") { fired.snapshot.contains("observer") }

    try loop.performAndWait { _ = usleep(Self.slow) }
    await Task(executorPreference: loop) { _ = usleep(Self.slow) }.value

    // A nested run: a timer labelled "modal tick" fires in mode "modal", one run deeper.
    let modal: RunLoopMode = "modal"
    try loop.performAndWait {
      let current = RunLoopThread.current
      let inner = LoopTimer(after: .zero, label: "modal tick") { _ in
        usleep(Self.slow)
        current.stop()
      }
      current.add(inner, to: modal)
      current.run(mode: modal, until: .now.advanced(by: .seconds(60)))
    }
    try loop.performAndWait {}
    // An `.ended` report comes from the watcher's thread, later, when that was still delivering
    // the callout's `.stillRunning` report as it ended: wait for all nine (one per slow callout)
    // before the watch stops.
    waitUntil("every callout's ended report") { ended.snapshot.count >= 9 }
    watch.cancel()
    source.invalidate()
    loop.shutdownAndWait()
    close(pipe[0])
    close(pipe[1])

    let reports = ended.snapshot
    func only(_ kind: LoopCalloutKind, _ label: String?) -> [StallReport] {
      reports.filter { $0.kind == kind && $0.label == label }
    }
    #expect(only(.sourceHandler, "commands").count == 1)
    #expect(only(.sourceHandler, "command buffer").count == 1)
    #expect(only(.timer, "tick").count == 1)
    #expect(only(.readinessHandler, "pipe").count == 1)
    #expect(only(.observer(.beforeSources), "watcher").count == 1)
    #expect(only(.job, nil).count == 1)
    #expect(only(.job, nil).first?.priority != nil)
    let nested = only(.timer, "modal tick")
    #expect(nested.count == 1)
    #expect(nested.first?.mode == modal && nested.first?.nestingDepth == 2)
    // Two blocks ran long: the sleeping one, and the one that ran the modal mode (depth 1).
    #expect(only(.performedBlock, nil).count == 2)
    #expect(reports.filter { $0.kind != .timer || $0.label != "modal tick" }.allSatisfy { $0.nestingDepth == 1 })
    #expect(reports.filter { $0.label != "modal tick" }.allSatisfy { $0.mode == .default })
    #expect(reports.allSatisfy { $0.priority == nil || $0.kind == .job })
  }
}
