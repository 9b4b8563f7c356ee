import Glibc

/// What every scenario gets.
struct BenchmarkContext: Sendable {
  let options: Options
  let pin: PinPlan
  let mainDriver: MainThreadDriver
  var mode: RunMode { options.mode }
}

/// The scenarios, in the order they run.
enum Scenario {
  typealias Runner = @Sendable (BenchmarkContext) -> ScenarioResult

  /// Run by default (and by `--only`).
  static let standard: [(name: String, run: Runner)] = [
    ("wake-rtt", WakeScenarios.wakeRTT),
    ("wake-rtt-b2b", WakeScenarios.wakeRTTBackToBack),
    ("actor-rtt", ActorScenarios.actorRTT),
    ("task-actor-rtt", ActorScenarios.taskActorRTT),
    ("thread-actor-rtt", ActorScenarios.threadActorRTT),
    ("stream-rtt", StreamScenarios.streamRTT),
    ("stream-rtt-b2b", StreamScenarios.streamRTTBackToBack),
    ("stream-throughput", StreamScenarios.streamThroughput),
    ("timer-1ms-lateness", TimerScenarios.timerLateness),
    ("main-rtt", MainScenarios.mainRTT),
    ("idle-cpu", ResourceScenarios.idleCPU),
    ("timers-100k", ResourceScenarios.timers100k),
    ("loops-1000", ResourceScenarios.loops1000),
    ("hop-allocations", ActorScenarios.hopAllocations),
    ("churn", ChurnScenarios.churn),
    ("fill", FillScenarios.fill),
    ("loop-group-scaling", LoopGroupScenarios.scaling),
  ]

  /// Run only when named with `--only`.
  static let extra: [(name: String, run: Runner)] = [
    ("foundation-wake-routes", WakeScenarios.foundationRoutes),
    ("bridged-foundation-rtt", BridgedFoundationScenarios.bridgedFoundationRTT),
    ("metrics-overhead-wake", MetricsScenarios.wake),
    ("metrics-overhead-actor", MetricsScenarios.actor),
    ("sequence-consumer-counts", ConsumerScenarios.counts),
    ("bridged-foundation-wake-rtt", BridgedFoundationWakeScenarios.bridgedFoundationWakeRTT),
    ("bridged-main-rtt", BridgedMainScenarios.bridgedMainRTT),
  ]

  static var allNames: [String] { (standard + extra).map(\.name) }

  /// Runs the selected scenarios in order, printing each table as it completes (with `--details`).
  static func runSelected(_ context: BenchmarkContext) -> [ScenarioResult] {
    let selected =
      context.options.only == nil
      ? standard : (standard + extra).filter { context.options.includes($0.name) }
    var results: [ScenarioResult] = []
    for scenario in selected {
      let result = scenario.run(context)
      results.append(result)
      if context.options.details {
        print(TableFormatter.render(result))
        fflush(nil)
      }
    }
    return results
  }
}
