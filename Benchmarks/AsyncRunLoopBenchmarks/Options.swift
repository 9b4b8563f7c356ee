import Glibc

/// How long to measure: sample counts and repetitions per mode.
enum RunMode: String, Sendable {
  /// CI only: proves every scenario runs; tiny samples, numbers are not meaningful.
  case smoke
  /// Under a minute on two cores.
  case quick
  /// The default: under five minutes.
  case full

  /// Interleaved repetitions (A B A B …); results are medians over them. Many short batches
  /// rather than a few long ones, so that a burst of activity from other processes spoils few
  /// repetitions and the median stays clean.
  var repetitions: Int {
    switch self {
    case .smoke: return 2
    case .quick: return 5
    case .full: return 9
    }
  }

  /// Round trips per repetition of a latency peer.
  var latencySamples: Int {
    switch self {
    case .smoke: return 200
    case .quick: return 3_500
    case .full: return 12_000
    }
  }

  /// Round trips of warm-up per latency peer (before the first repetition).
  var latencyWarmUp: Int {
    switch self {
    case .smoke: return 50
    case .quick: return 1_000
    case .full: return 3_000
    }
  }

  /// Timer fires per repetition of a lateness peer (1 ms apart).
  var timerFires: Int {
    switch self {
    case .smoke: return 20
    case .quick: return 200
    case .full: return 600
    }
  }

  /// Repetitions of the timer scenario, more than the others' (quick 10, full 27). On the
  /// development VM timer lateness drifts between regimes (an idle vCPU's wake-up) over seconds,
  /// so peers measured in long blocks landed in different regimes; shorter interleaved blocks
  /// share them more fairly.
  var timerRepetitions: Int {
    switch self {
    case .smoke: return repetitions
    case .quick: return 2 * repetitions
    case .full: return 3 * repetitions
    }
  }

  /// Elements of a throughput peer's warm-up run, which calibrates the later runs.
  var streamCalibrationElements: Int { self == .smoke ? 20_000 : 200_000 }

  /// How long each measured throughput run should take.
  var streamTargetSeconds: Double {
    switch self {
    case .smoke: return 0.02
    case .quick: return 0.25
    case .full: return 0.6
    }
  }

  /// The most elements a throughput run posts.
  var streamMaximumElements: Int { self == .smoke ? 50_000 : 10_000_000 }

  /// The idle-cpu observation window.
  var idleWindowNanoseconds: Int64 {
    switch self {
    case .smoke: return 200_000_000
    case .quick, .full: return 2_000_000_000
    }
  }

  /// Repetitions of the single-figure scenarios (idle-cpu, timers-100k, loops-1000).
  var figureRepetitions: Int {
    switch self {
    case .smoke: return 1
    case .quick: return 1
    case .full: return 3
    }
  }

  /// Timers in timers-100k and loops in loops-1000 (smoke mode shrinks them).
  var timerCount: Int { self == .smoke ? 10_000 : 100_000 }
  var loopCount: Int { self == .smoke ? 100 : 1_000 }
}

/// Command-line options.
struct Options: Sendable {
  var mode = RunMode.full
  /// `same` by default: on a small VM a wake-up that crosses CPUs costs tens of µs of
  /// hypervisor latency (an IPI to an idle vCPU) and where the scheduler places the two threads
  /// changes from run to run, so unpinned latencies are bimodal. Pinned to one CPU, the numbers
  /// measure the software path and repeat. `split` measures cross-CPU wake-ups (and lets a
  /// producer and its consumer run in parallel); `none` leaves placement to the scheduler.
  var pin = "same"
  var jsonPath: String?
  var plotPath: String?
  var only: Set<String>?
  /// Print every scenario's table and every target, not only the summary.
  var details = false
  /// Exit with status 1 when a target is missed (a run that measures nothing still exits 0).
  var check = false

  static let usage = """
    usage: AsyncRunLoopBenchmarks [--quick | --smoke] [--pin none|same|split] [--json PATH]
                                  [--plot PATH.svg] [--only scenario[,scenario]] [--details] [--check]
      --quick   under 60 s on 2 cores        (default: full mode, under 5 minutes)
      --smoke   a few seconds, tiny samples: proves every scenario runs (CI)
      --pin     same (default): both sides on CPU 0; split: client on CPU 0, server (and the main
                thread) on CPU 1; none: no pinning. Dispatch and default-executor threads are never
                pinned.
      --json    write the results as JSON
      --plot    write a latency CDF per scenario as SVG (and PATH-loop-group.svg: the scaling lines)
      --only    run only these scenarios
      --details print every scenario's table and every target (default: a short summary)
      --check   exit with status 1 when a target is missed (default: 0 whatever was measured)
    scenarios: \(Scenario.allNames.joined(separator: ", "))
    """

  /// Parses `arguments` (without the program name); exits with the usage on a bad option.
  static func parse(_ arguments: [String]) -> Options {
    var options = Options()
    var index = 0
    func value(_ flag: String) -> String {
      index += 1
      guard index < arguments.count else { fail("\(flag) needs a value") }
      return arguments[index]
    }
    while index < arguments.count {
      let argument = arguments[index]
      switch argument {
      case "--quick": options.mode = .quick
      case "--smoke": options.mode = .smoke
      case "--full": options.mode = .full
      case "--pin":
        options.pin = value(argument)
        guard ["none", "same", "split"].contains(options.pin) else { fail("--pin takes none, same or split") }
      case "--json": options.jsonPath = value(argument)
      case "--plot": options.plotPath = value(argument)
      case "--only":
        let names = value(argument).split(separator: ",").map(String.init)
        for name in names where !Scenario.allNames.contains(name) { fail("unknown scenario '\(name)'") }
        options.only = Set(names)
      case "--details": options.details = true
      case "--check": options.check = true
      case "--help", "-h":
        print(usage)
        exit(0)
      default:
        fail("unknown option '\(argument)'")
      }
      index += 1
    }
    return options
  }

  private static func fail(_ message: String) -> Never {
    writeStandardError("AsyncRunLoopBenchmarks: \(message)\n\(usage)\n")
    exit(2)
  }

  func includes(_ scenario: String) -> Bool { only?.contains(scenario) ?? true }
}
