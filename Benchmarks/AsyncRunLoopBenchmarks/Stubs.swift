enum StreamScenarios {
  static func streamRTT(_ context: BenchmarkContext) -> ScenarioResult {
    ScenarioResult(name: "stream-rtt", unit: "us", floor: nil, peers: [], notes: [])
  }
  static func streamThroughput(_ context: BenchmarkContext) -> ScenarioResult {
    ScenarioResult(name: "stream-throughput", unit: "ops/s", floor: nil, peers: [], notes: [])
  }
}
enum TimerScenarios {
  static func timerLateness(_ context: BenchmarkContext) -> ScenarioResult {
    ScenarioResult(name: "timer-1ms-lateness", unit: "us", floor: nil, peers: [], notes: [])
  }
}
enum MainScenarios {
  static func mainRTT(_ context: BenchmarkContext) -> ScenarioResult {
    ScenarioResult(name: "main-rtt", unit: "us", floor: nil, peers: [], notes: [])
  }
}
enum ResourceScenarios {
  static func idleCPU(_ context: BenchmarkContext) -> ScenarioResult {
    ScenarioResult(name: "idle-cpu", unit: "ns", floor: nil, peers: [], notes: [])
  }
  static func timers100k(_ context: BenchmarkContext) -> ScenarioResult {
    ScenarioResult(name: "timers-100k", unit: "ns", floor: nil, peers: [], notes: [])
  }
  static func loops1000(_ context: BenchmarkContext) -> ScenarioResult {
    ScenarioResult(name: "loops-1000", unit: "ms", floor: nil, peers: [], notes: [])
  }
}
