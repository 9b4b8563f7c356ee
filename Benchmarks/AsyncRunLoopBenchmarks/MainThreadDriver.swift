import AsyncRunLoop
import AsyncRunLoopFoundation
import CoreFoundation
import Dispatch
import Foundation
import Synchronization

/// Who runs the process's main thread. The measurements run on a background thread; the main
/// thread serves one "main loop" at a time, because the AsyncRunLoop main loop and Foundation's
/// `RunLoop.main` cannot both own it at once. main-rtt switches between them before each batch
/// (A B A B), so both peers are measured interleaved in one process.
enum MainThreadOwner: Sendable {
  /// `RunLoopThread.main` runs (the AsyncRunLoop main loop).
  case asyncRunLoop
  /// Foundation's `RunLoop.main` runs (it also drains the main dispatch queue, i.e. MainActor).
  case foundation
}

/// Hands the main thread to a main loop on request. Any thread may call `begin`/`end`; `serve`
/// is called once, on the main thread.
final class MainThreadDriver: Sendable {
  private enum Request: Sendable {
    case run(MainThreadOwner)
    case installBridge
    case exit(Int32)
  }

  private let requests = Mutex<[Request]>([])
  private let requestArrived = DispatchSemaphore(value: 0)
  private let started = DispatchSemaphore(value: 0)
  private let ended = DispatchSemaphore(value: 0)
  /// Set by `end()`; the serving run checks it between runs. Relaxed is not enough: `end()`
  /// publishes "stop" and the main thread must see it after being woken, so release/acquire.
  private let stopRequested = Atomic<Bool>(false)
  private let current = Mutex<MainThreadOwner?>(nil)

  /// Main thread only: serves requests until an exit request, then exits the process.
  /// - Parameter cpu: Pins the main thread (the answering side of main-rtt) to this CPU.
  func serve(pinnedTo cpu: Int?) -> Never {
    pinCurrentThread(cpu)
    while true {
      requestArrived.wait()
      switch requests.withLock({ $0.removeFirst() }) {
      case .exit(let code):
        fflush(nil)
        exit(code)
      case .run(.asyncRunLoop):
        runAsyncRunLoopMain()
      case .run(.foundation):
        runFoundationMain()
      case .installBridge:
        MainLoopBridge.install()
        started.signal()
      }
    }
  }

  /// Gives the main thread to `owner`'s main loop; returns once that loop is about to run.
  func begin(_ owner: MainThreadOwner) {
    stopRequested.store(false, ordering: .releasing)
    current.withLock { $0 = owner }
    requests.withLock { $0.append(.run(owner)) }
    requestArrived.signal()
    started.wait()
  }

  /// Stops the main loop started by `begin` and waits until the main thread has left it.
  func end() {
    stopRequested.store(true, ordering: .releasing)
    switch current.withLock({ $0 }) {
    case .asyncRunLoop: stopMainLoop()
    case .foundation: CFRunLoopStop(CFRunLoopGetMain())
    case nil: return
    }
    ended.wait()
    current.withLock { $0 = nil }
  }

  /// Installs the Foundation bridge on the main thread (between runs) and waits for it: from
  /// then on each main loop also serves the other, for the rest of the process (so the bridged
  /// scenarios run after main-rtt). Any thread but the main thread; idempotent.
  func installBridge() {
    requests.withLock { $0.append(.installBridge) }
    requestArrived.signal()
    started.wait()
  }

  /// Ends the process from any thread (the main thread exits it).
  func exitProcess(_ code: Int32) {
    requests.withLock { $0.append(.exit(code)) }
    requestArrived.signal()
  }

  /// `runMainLoop()` until `end()` calls `stopMainLoop()`.
  private func runAsyncRunLoopMain() {
    _ = RunLoopThread.main  // created before `begin` returns, so `stopMainLoop()` finds it
    started.signal()
    while !stopRequested.load(ordering: .acquiring) {
      runMainLoop()
    }
    ended.signal()
  }

  private func runFoundationMain() {
    let runLoop = RunLoop.main
    let keepAlive = Timer(timeInterval: 86_400, repeats: false) { _ in }
    runLoop.add(keepAlive, forMode: .default)
    started.signal()
    while !stopRequested.load(ordering: .acquiring) {
      _ = runLoop.run(mode: .default, before: Date(timeIntervalSinceNow: 1))
    }
    keepAlive.invalidate()
    ended.signal()
  }
}
