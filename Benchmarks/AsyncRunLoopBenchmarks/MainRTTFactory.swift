import Foundation

// main-rtt's factory route: `MainRTTAsyncMain` (built next to this benchmark) is an `async` main
// on AsyncRunLoopExecutorFactory. It runs as a child process for the whole scenario; each batch
// asks it for N round trips (a plain thread → `await MainActor.run { value }`, the Foundation
// peer's shape) and reads back the N samples. Its main thread is its own, so this process's main
// thread driver is not involved.

/// asyncrunloop-factory-mainactor: the measurements of the child process.
final class FactoryMainActorRTT: LatencySession {
  private let child: Process
  private let requests: FileHandle
  private let replies: FileHandle
  private var pending: [UInt8] = []

  /// The child's path, or nil when it was not built.
  static var executable: String? {
    let directory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
    let path = directory.appendingPathComponent("MainRTTAsyncMain").path
    return FileManager.default.isExecutableFile(atPath: path) ? path : nil
  }

  init(executable: String) {
    child = Process()
    child.executableURL = URL(fileURLWithPath: executable)
    let input = Pipe()
    let output = Pipe()
    child.standardInput = input
    child.standardOutput = output
    do {
      try child.run()
    } catch {
      fatalError("cannot start \(executable): \(error)")
    }
    requests = input.fileHandleForWriting
    replies = output.fileHandleForReading
  }

  func activate() {
    _ = measure(10)  // the first calls pay for the child's start
  }

  func measure(_ count: Int) -> [Double] {
    requests.write(Data("\(count)\n".utf8))
    let samples = readLine().split(separator: " ").compactMap { Double($0) }
    precondition(samples.count == count, "MainRTTAsyncMain answered \(samples.count) of \(count) samples")
    return samples
  }

  func close() {
    try? requests.close()  // end of input: the child stops its main loop and returns from main
    child.waitUntilExit()
  }

  private func readLine() -> String {
    while true {
      if let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
        let line = String(decoding: pending[..<newline], as: UTF8.self)
        pending.removeSubrange(...newline)
        return line
      }
      let chunk = replies.availableData
      precondition(!chunk.isEmpty, "MainRTTAsyncMain ended early")
      pending.append(contentsOf: chunk)
    }
  }
}
