/// The machine-readable report (`--json`):
/// `{"schema":1,"mode":…,"pin":…,"cpus":N,"scenarios":{"<scenario>":{"<peer>":{…}}}}`, where a
/// latency peer is `{"unit":"us","p50":…,"p90":…,"p99":…,"max":…,"n":…}` and a figure
/// `{"unit":"ops/s|ns|ms|count","value":…}` plus its extras (`leaked_fds`, `leaked_threads`, …).
/// Peers that are not available are left out. After the scenarios, `"targets"` lists the issue's
/// targets as checked in this run: `{"target":…,"bound":"≤ 1.15","value":…|null,"met":true|false|null}`.
enum JSONReport {
  /// `load` (the 1-minute load average at start and end) is added as `"load_avg_1m"`, so a noisy
  /// run can be recognised.
  static func render(
    _ results: [ScenarioResult], targets: [TargetReport.Verdict], mode: RunMode, pin: String, cpus: Int,
    load: (Double?, Double?)
  ) -> String {
    var scenarios: [String] = []
    for result in results {
      var peers: [String] = []
      for peer in result.peers {
        switch peer.outcome {
        case .unavailable:
          continue
        case .latency(let summary, _):
          let fields = [
            "\"unit\":\"us\"", "\"p50\":\(number(summary.p50))", "\"p90\":\(number(summary.p90))",
            "\"p99\":\(number(summary.p99))", "\"max\":\(number(summary.max))", "\"n\":\(summary.n)",
          ]
          peers.append("\(quoted(peer.name)):{\(fields.joined(separator: ","))}")
        case .figure(let figure):
          var fields = ["\"unit\":\(quoted(result.unit))", "\"value\":\(number(figure.value))"]
          for (key, value) in figure.extras { fields.append("\(quoted(key)):\(number(value))") }
          peers.append("\(quoted(peer.name)):{\(fields.joined(separator: ","))}")
        }
      }
      scenarios.append("    \(quoted(result.name)):{\(peers.joined(separator: ","))}")
    }
    let verdicts = targets.map { verdict in
      let met = verdict.outcome.map { $0.met ? "true" : "false" } ?? "null"
      return "    {\"target\":\(quoted(verdict.label)),\"bound\":\(quoted(verdict.bound)),"
        + "\"value\":\(number(verdict.outcome?.value ?? .nan)),\"met\":\(met)}"
    }
    return """
      {"schema":1,"mode":\(quoted(mode.rawValue)),"pin":\(quoted(pin)),"cpus":\(cpus),\
      "load_avg_1m":{"start":\(number(load.0 ?? .nan)),"end":\(number(load.1 ?? .nan))},"scenarios":{
      \(scenarios.joined(separator: ",\n"))
      },"targets":[
      \(verdicts.joined(separator: ",\n"))
      ]}

      """
  }

  /// A JSON number: integers without a fraction, others with 3 decimals; null for NaN/infinity.
  static func number(_ value: Double) -> String {
    guard value.isFinite else { return "null" }
    if value == value.rounded() && abs(value) < 1e15 { return String(Int(value)) }
    return formatFixed(value, decimals: 3)
  }

  static func quoted(_ text: String) -> String {
    var escaped = "\""
    for scalar in text.unicodeScalars {
      switch scalar {
      case "\"": escaped += "\\\""
      case "\\": escaped += "\\\\"
      case "\n": escaped += "\\n"
      default:
        if scalar.value < 0x20 {
          escaped += "\\u00" + (scalar.value < 0x10 ? "0" : "") + String(scalar.value, radix: 16)
        } else {
          escaped.unicodeScalars.append(scalar)
        }
      }
    }
    return escaped + "\""
  }
}
