import Glibc

// NIOPeer: AsyncRunLoop against SwiftNIO's event loop (NIOPosix), side by side in one process,
// interleaved, with the matched floors measured in the same run. See `--help` and
// Benchmarks/results/nio-comparison.md.

let options = Options.parse(Array(CommandLine.arguments.dropFirst()))
let pin = PinPlan(options.pin, cpus: onlineCPUs)

// The measuring thread is the client side; the main thread only waits for it.
let driver = PlainThread(name: "bench-driver", cpu: pin.clientCPU) {
  #if DEBUG
    print("warning: debug build; the numbers mean nothing (build with -c release)")
  #endif
  print(
    "NIOPeer — mode \(options.mode.rawValue), pin \(pin.name), \(onlineCPUs) CPUs,"
      + " \(options.mode.repetitions) interleaved repetitions of \(options.mode.latencySamples) round trips;"
      + " medians over repetitions")
  print("load average (1 min) at start: \(loadAverage().map { format($0) } ?? "?")\n")
  let runs: [(String, () -> ScenarioResult)] = [
    ("wake-rtt", { WakeScenarios.wake(pin, mode: options.mode, settled: true) }),
    ("wake-rtt-b2b", { WakeScenarios.wake(pin, mode: options.mode, settled: false) }),
    ("thread-actor-rtt", { ActorScenarios.threadActor(pin, mode: options.mode, settled: true) }),
    ("thread-actor-rtt-b2b", { ActorScenarios.threadActor(pin, mode: options.mode, settled: false) }),
    ("actor-rtt", { ActorScenarios.actorActor(pin, mode: options.mode) }),
    ("stream-rtt", { StreamScenarios.streamRTT(pin, mode: options.mode, settled: true) }),
    ("stream-rtt-b2b", { StreamScenarios.streamRTT(pin, mode: options.mode, settled: false) }),
    ("stream-throughput", { StreamScenarios.throughput(pin, mode: options.mode) }),
  ]
  var results: [ScenarioResult] = []
  let started = monotonicNanoseconds()
  for (name, run) in runs where options.includes(name) {
    let result = run()
    results.append(result)
    print(Report.render(result))
    fflush(nil)
  }
  print(Report.renderTargets(results))
  print(
    "total time: \(format(Double(monotonicNanoseconds() - started) / 1e9, decimals: 1)) s;"
      + " load average (1 min) at the end: \(loadAverage().map { format($0) } ?? "?")")
  fflush(nil)
}
driver.join()
