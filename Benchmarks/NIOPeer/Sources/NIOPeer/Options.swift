import Glibc

/// How long to measure (AsyncRunLoopBenchmarks' modes, same counts).
enum RunMode: String, Sendable {
  case smoke
  case quick
  case full

  var repetitions: Int {
    switch self {
    case .smoke: return 2
    case .quick: return 5
    case .full: return 9
    }
  }

  var latencySamples: Int {
    switch self {
    case .smoke: return 200
    case .quick: return 3_500
    case .full: return 12_000
    }
  }

  var latencyWarmUp: Int {
    switch self {
    case .smoke: return 50
    case .quick: return 1_000
    case .full: return 3_000
    }
  }

  var streamCalibrationElements: Int { self == .smoke ? 20_000 : 200_000 }

  var streamTargetSeconds: Double {
    switch self {
    case .smoke: return 0.02
    case .quick: return 0.25
    case .full: return 0.6
    }
  }

  var streamMaximumElements: Int { self == .smoke ? 50_000 : 10_000_000 }
}

struct Options: Sendable {
  var mode = RunMode.full
  var pin = "same"
  var only: Set<String>?

  static let scenarios = [
    "wake-rtt", "wake-rtt-b2b", "thread-actor-rtt", "thread-actor-rtt-b2b", "actor-rtt", "stream-rtt",
    "stream-rtt-b2b", "stream-throughput",
  ]

  static let usage = """
    usage: NIOPeer [--quick | --smoke | --full] [--pin none|same|split] [--only scenario[,scenario]]
      --full    (default) 9 interleaved repetitions of 12,000 round trips per peer
      --quick   5 repetitions of 3,500; --smoke: 2 of 200 (proves it runs)
      --pin     same (default): client and server threads on CPU 0 (as AsyncRunLoopBenchmarks);
                split: client on CPU 0, server on CPU 1; none: no pinning
    scenarios: \(scenarios.joined(separator: ", "))
    """

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
      case "--only":
        let names = value(argument).split(separator: ",").map(String.init)
        for name in names where !scenarios.contains(name) { fail("unknown scenario '\(name)'") }
        options.only = Set(names)
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
    writeStandardError("NIOPeer: \(message)\n\(usage)\n")
    exit(2)
  }

  func includes(_ scenario: String) -> Bool { only?.contains(scenario) ?? true }
}
