import Testing

/// The seed examples (`Examples/`) build, run by themselves, exit 0 and print the trace their
/// comments promise. Each runs in a child process (the examples that run the main loop need the
/// process's main thread); `swift test` builds them next to the test binary.
@Suite("Seed examples run", .serialized)
struct SeedExamplesRunTests {
  @Test func customInputSourceRegistersWithMainRunsCommandsInOrderAndUnregisters() throws {
    let run = try ChildProcess.run(
      ChildProcess.sibling("CustomInputSourceExample"), arguments: [], timeout: .seconds(60))
    #expect(run.exitCode == 0, "\(run)")
    // Every line is printed on the main thread, worker lines in the worker's order (runOnMain is
    // FIFO per thread), so the whole trace is fixed.
    #expect(
      lines(run.standardOutput) == [
        "[worker] installing the command source",
        "[worker] schedule routine: source added to 'worker' in mode 'kCFRunLoopDefaultMode'; registering with main",
        "[main  ] registered the source of 'worker'; posting commands",
        "[main  ] posted greet(\"main thread\") (accepted: true)",
        "[main  ] posted add(2, 3) (accepted: true)",
        "[main  ] posted add(40, 2) (accepted: true)",
        "[main  ] posted finish (accepted: true)",
        "[worker] handled greet: hello, main thread",
        "[worker] handled add: 2 + 3 = 5",
        "[main  ] received sum 5",
        "[worker] handled add: 40 + 2 = 42",
        "[main  ] received sum 42",
        "[worker] handled finish",
        "[main  ] worker finished; invalidating its source",
        "[worker] cancel routine: source left 'worker'; unregistering from main",
        "[main  ] unregistered the source; stopping the main loop",
        "done: sums [5, 42], worker shut down",
      ], "\(run)")
  }

  @Test func observerLogShowsTheOrderOfOnePassAndTheRunFinishing() throws {
    let run = try ChildProcess.run(ChildProcess.sibling("ObserverLogExample"), arguments: [], timeout: .seconds(60))
    #expect(run.exitCode == 0, "\(run)")
    // Without the "pass N: " prefix. A stray wake-up would add a pass; the order within passes
    // and the first pass are fixed.
    let events = lines(run.standardOutput).map { line in
      line.firstIndex(of: ":").map { String(line[line.index($0, offsetBy: 2)...]) } ?? line
    }
    #expect(
      Array(events.prefix(6)) == [
        "entry", "beforeTimers", "beforeSources", "beforeWaiting", "afterWaiting", "  timer fired (1)",
      ], "\(run)")
    // The signal from the timer's second fire: the next pass fires the source after beforeSources,
    // before it would sleep.
    let signal = try #require(events.firstIndex(of: "  timer signals the source"), "\(run)")
    #expect(
      Array(events[(signal + 1)...].prefix(4)) == ["beforeTimers", "beforeSources", "  source fired", "beforeWaiting"],
      "\(run)")
    #expect(events.filter { $0 == "entry" }.count == 1, "\(run)")
    #expect(events.filter { $0 == "  source fired" }.count == 1, "\(run)")
    #expect(
      Array(events.suffix(3)) == [
        "  timer invalidates itself and the source", "exit", "run returned finished after 3 timer fires",
      ], "\(run)")
  }

  @Test func echoServerEchoesEveryMessageOnEveryConnectionAndShutsDown() throws {
    let run = try ChildProcess.run(ChildProcess.sibling("EchoServerExample"), arguments: [], timeout: .seconds(60))
    #expect(run.exitCode == 0, "\(run)")
    let output = lines(run.standardOutput)
    var expectedEchoes: [String] = []
    for message in 1...5 {
      for connection in 1...3 {
        expectedEchoes.append("[client] echoed: message \(message) on connection \(connection)")
      }
    }
    #expect(output.filter { $0.hasPrefix("[client] echoed:") } == expectedEchoes, "\(run)")
    #expect(output.filter { $0.hasPrefix("[server] accepted connection") }.count == 3, "\(run)")
    #expect(output.filter { $0.hasSuffix("peer closed after 130 bytes echoed") }.count == 3, "\(run)")
    #expect(output.last == "done: 3 connections × 5 messages, 390 bytes echoed, server shut down", "\(run)")
  }

  private func lines(_ text: String) -> [String] {
    text.split(separator: "\n").map(String.init)
  }
}
