import Glibc
import Testing

@testable import AsyncRunLoop

/// Helpers shared by the suites that conform (they call them as `Self.name` or by name).
protocol TimerCalloutModes {}

extension TimerCalloutModes {
  var modeA: RunLoopMode { RunLoopMode("a") }

  var modeB: RunLoopMode { RunLoopMode("b") }

  var modeC: RunLoopMode { RunLoopMode("c") }
}
