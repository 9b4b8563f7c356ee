import CoreFoundation
import Dispatch
import Foundation
import Synchronization

/// A pthread running a Foundation `RunLoop` (CFRunLoop underneath) until `shutdown()`.
final class FoundationLoopThread: @unchecked Sendable {
  // Safety: `runLoop` and `cfRunLoop` are written once on the new thread before `ready` is
  // signalled, and only read after `init` has waited for it. `RunLoop` is not Sendable; other
  // threads only call its thread-safe entry points (`perform`, `add(_:forMode:)`), and CF's
  // (`CFRunLoopWakeUp`, `CFRunLoopStop`, `CFRunLoopSourceSignal`), all documented as thread-safe.
  private(set) var runLoop: RunLoop!
  private(set) var cfRunLoop: CFRunLoop!
  private var thread: PlainThread!
  private let stopRequested = Atomic<Bool>(false)

  /// Starts the thread; `setUp` runs on it (with its run loop) before the first run.
  init(name: String, cpu: Int?, setUp: @escaping @Sendable (RunLoop) -> Void = { _ in }) {
    let ready = DispatchSemaphore(value: 0)
    thread = PlainThread(name: name, cpu: cpu) { [self] in
      let runLoop = RunLoop.current
      self.runLoop = runLoop
      self.cfRunLoop = CFRunLoopGetCurrent()
      // Something to watch, so that run(mode:before:) sleeps instead of returning at once.
      runLoop.add(Timer(timeInterval: 86_400, repeats: false) { _ in }, forMode: .default)
      setUp(runLoop)
      ready.signal()
      while !stopRequested.load(ordering: .acquiring) {
        _ = runLoop.run(mode: .default, before: .distantFuture)
      }
    }
    ready.wait()
  }

  /// Stops the run loop and joins the thread.
  func shutdown() {
    stopRequested.store(true, ordering: .releasing)
    CFRunLoopStop(cfRunLoop)
    thread.join()
  }
}

/// A CFRunLoopSource "version 0" (the custom-source model AsyncRunLoop reproduces) whose perform
/// routine rings a doorbell.
final class CFCustomSource: @unchecked Sendable {
  // Safety: `source` is created once in init and only passed to CF's thread-safe calls.
  let source: CFRunLoopSource
  private let target: Unmanaged<DoorbellBox>

  init(ringing doorbell: ReplyDoorbell) {
    target = Unmanaged.passRetained(DoorbellBox(doorbell))
    var context = CFRunLoopSourceContext()
    context.info = target.toOpaque()
    context.perform = { info in
      Unmanaged<DoorbellBox>.fromOpaque(info!).takeUnretainedValue().doorbell.ring()
    }
    source = CFRunLoopSourceCreate(kCFAllocatorDefault, 0, &context)
  }

  func invalidate() {
    CFRunLoopSourceInvalidate(source)
    target.release()
  }
}

private final class DoorbellBox: Sendable {
  let doorbell: ReplyDoorbell
  init(_ doorbell: ReplyDoorbell) { self.doorbell = doorbell }
}
