import AsyncRunLoop
import Synchronization

// The delegate-wrapper idiom, ported from FORCE_MAIN_THREAD: a type whose delegate
// callouts happen on the main thread however they are triggered — by its own work on a background
// loop thread, by a caller on a pool thread, or by a caller already on the main thread (then the
// callout runs inline, before the triggering call returns).
//
// Run it: swift run MainThreadDelegateExample

/// Told about a transfer. Main-actor isolated: every method runs on the main thread.
@MainActor
protocol TransferDelegate: AnyObject {
  func transferDidStart(_ transfer: Transfer)
  func transfer(_ transfer: Transfer, didReceive totalBytes: Int)
  func transferDidFinish(_ transfer: Transfer)
}

/// Wraps a main-actor delegate for code that runs on any thread. Each method is the
/// FORCE_MAIN_THREAD guard: on the main thread the callout runs inline; elsewhere it is queued for
/// the main thread (in call order) and the method returns at once.
final class MainThreadTransferDelegate: Sendable {
  @MainActor private weak var target: (any TransferDelegate)?

  @MainActor init(_ target: any TransferDelegate) { self.target = target }

  func transferDidStart(_ transfer: Transfer) {
    runOnMain { [self] in target?.transferDidStart(transfer) }
  }

  func transfer(_ transfer: Transfer, didReceive totalBytes: Int) {
    runOnMain { [self] in target?.transfer(transfer, didReceive: totalBytes) }
  }

  func transferDidFinish(_ transfer: Transfer) {
    runOnMain { [self] in target?.transferDidFinish(transfer) }
  }
}

/// Receives data on a loop thread and reports to its delegate, on the main thread.
final class Transfer: Sendable {
  let name: String
  private let loop: RunLoopThread
  private let chunks: Int
  private let delegate: MainThreadTransferDelegate
  /// Bytes received. Only the timer handler (on `loop`'s thread) changes it, so relaxed ordering
  /// is enough; it is atomic only so that the class is Sendable.
  private let received = Atomic<Int>(0)

  @MainActor init(name: String, loop: RunLoopThread, chunks: Int, delegate: any TransferDelegate) {
    self.name = name
    self.loop = loop
    self.chunks = chunks
    self.delegate = MainThreadTransferDelegate(delegate)
  }

  /// Starts receiving. Any thread: the delegate hears `transferDidStart` on the main thread —
  /// before this returns when called there.
  func start() {
    delegate.transferDidStart(self)
    let chunk = 1024
    let timer = LoopTimer(after: .milliseconds(1), repeatingEvery: .milliseconds(1)) { [self] timer in
      let total = received.add(chunk, ordering: .relaxed).newValue
      delegate.transfer(self, didReceive: total)
      if total >= chunks * chunk {
        timer.invalidate()
        delegate.transferDidFinish(self)
      }
    }
    loop.add(timer, to: .common)
  }
}

/// The application's main-thread object.
@MainActor
final class ProgressScreen: TransferDelegate {
  private(set) var events: [String] = []
  private var callouts = 0
  private var finished = 0
  private let transfers: Int

  init(transfers: Int) { self.transfers = transfers }

  func transferDidStart(_ transfer: Transfer) {
    expectMainThread()
    events.append("\(transfer.name) started")
  }

  func transfer(_ transfer: Transfer, didReceive totalBytes: Int) {
    expectMainThread()
    events.append("\(transfer.name) \(totalBytes) bytes")
  }

  func transferDidFinish(_ transfer: Transfer) {
    expectMainThread()
    events.append("\(transfer.name) finished")
    finished += 1
    if finished == transfers { stopMainLoop() }
  }

  private func expectMainThread() {
    precondition(RunLoopThread.isMainThread, "a delegate callout ran off the main thread")
    MainActor.preconditionIsolated()
    callouts += 1
  }

  var summary: String { "\(callouts) delegate callouts, all on the main thread" }
}

// A synchronous top-level program: set up, then run the main loop on the main thread.
let io = RunLoopThread.start(named: "io")
let screen = ProgressScreen(transfers: 2)

let first = Transfer(name: "first", loop: io, chunks: 5, delegate: screen)
first.start()  // on the main thread: the callout already ran, inline
precondition(screen.events == ["first started"], "the main-thread callout was not inline")

let second = Transfer(name: "second", loop: io, chunks: 5, delegate: screen)
Task.detached { second.start() }  // on a pool thread: the callout hops to the main thread

runMainLoop()  // returns when the screen calls stopMainLoop()
io.shutdownAndWait()
for event in screen.events { print(event) }
print(screen.summary)
