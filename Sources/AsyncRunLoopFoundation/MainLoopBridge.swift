import AsyncRunLoop
import CoreFoundation

/// Bridges the main thread's two run loops — Foundation's (`RunLoop.main`, CFRunLoop) and
/// AsyncRunLoop's (`RunLoopThread.main`) — so that whichever one the main thread runs serves the
/// other, in the same mode, with no polling timer (see the DocC article "Bridging Foundation's
/// run loop").
///
/// - Under `runMainLoop()` (or `RunLoopThread.main.run(...)`): when the main loop would sleep,
///   it sleeps inside `CFRunLoopRunInMode` instead, in the same mode. Foundation's timers,
///   performed blocks (`RunLoop.main.perform`, `CFRunLoopPerformBlock`), sources and wake-ups
///   are served there, and the main loop's own work wakes that CF run through its descriptor (a
///   CF source), which returns, and the main loop makes its pass.
/// - Under `RunLoop.main.run()` (or `CFRunLoopRun()`): CF hosts the main loop as an embedded
///   loop (`RunLoopThread.beginEmbedding()`): a CF source watches its descriptor, a CF timer its
///   next deadline, and before CF sleeps an observer runs the passes that are due. Sources,
///   timers, `perform`, `runOnMain`, `runOnMainAndWait` and `@MainActor` work are served. After
///   such a run the main loop counts as served until CF's next run (a caller of
///   `runOnMainAndWait` waits for it), unless `runMainLoop()` or a run of the main loop takes
///   over, or the main loop shuts down.
public enum MainLoopBridge {
  /// Installs the bridge for CF's default mode (and our `.default`) and for `modes`. Main thread
  /// only; call it before running either loop. Calling it again bridges further modes.
  /// - Parameter modes: More modes to bridge besides `.default` (not `.common`), each the mode of
  ///   the same name on the other side.
  public static func install(modes: [RunLoopMode] = []) {
    precondition(
      RunLoopThread.isMainThread, "AsyncRunLoopFoundation: MainLoopBridge.install must run on the main thread")
    let state = MainBridgeState.shared
    state.installIfNeeded()
    for mode in [RunLoopMode.default] + modes { state.bridge(mode) }
  }
}

/// The bridge's state. One per process.
final class MainBridgeState: @unchecked Sendable {  // Safety: proof below
  // Safety: every stored property is read and written on the main thread only: `install` checks
  // that it runs there, and every other access is a callout of the main CFRunLoop or of
  // `RunLoopThread.main`, which both run only on the main thread.
  static let shared = MainBridgeState()

  private var loop: RunLoopThread?
  /// The CF source watching the main loop's descriptor, and that descriptor.
  private var source: CFRunLoopSource?
  private var sourcePort: Int32 = -1
  /// Fires at the main loop's next deadline while CF hosts it.
  private var timer: CFRunLoopTimer?
  private var observer: CFRunLoopObserver?
  private var bridged: [RunLoopMode] = []
  private var ourObservers: [LoopObserver] = []
  /// How deep CF's runs are nested now, and the depths of those our loop started as its sleep
  /// (during those CF is only our sleep: its hooks stay passive).
  private var cfDepth = 0
  private var drivenDepths: [Int] = []
  /// For each CF run on the stack: whether its entry began embedding the main loop.
  private var embeddingStack: [Bool] = []
  private var isTornDown = false

  private var mainCF: CFRunLoop { CFRunLoopGetMain() }

  /// CF is running as our loop's sleep: its innermost run is one our observer started.
  private var cfIsOurSleep: Bool { drivenDepths.last == cfDepth }

  func installIfNeeded() {
    guard loop == nil else { return }
    let loop = RunLoopThread.main
    self.loop = loop
    makeSource(port: loop.embeddingDescriptor)
    timer = CFRunLoopTimerCreateWithHandler(nil, CFAbsoluteTimeGetCurrent() + 1e9, 1e9, 0, 0) { _ in
      MainBridgeState.shared.hostFired()
    }
    let activities =
      CFRunLoopActivity.entry.rawValue | CFRunLoopActivity.exit.rawValue
      | CFRunLoopActivity.beforeWaiting.rawValue
    observer = CFRunLoopObserverCreateWithHandler(nil, activities, true, CFIndex.max) { _, activity in
      MainBridgeState.shared.cfDid(activity)
    }
  }

  /// Bridges one more mode (a no-op for one bridged already).
  func bridge(_ mode: RunLoopMode) {
    precondition(mode != .common, "AsyncRunLoopFoundation: bridge the modes of the common set one by one")
    guard let loop, !bridged.contains(mode), !isTornDown else { return }
    bridged.append(mode)
    let cfMode = mode.coreFoundationMode
    if let source { CFRunLoopAddSource(mainCF, source, cfMode) }
    if let timer { CFRunLoopAddTimer(mainCF, timer, cfMode) }
    if let observer { CFRunLoopAddObserver(mainCF, observer, cfMode) }
    // Told last (highest order) before the main loop sleeps in this mode: it sleeps in CF instead.
    let sleeper = LoopObserver(activities: .beforeWaiting, order: Int.max) { _, _ in
      MainBridgeState.shared.ourLoopWillSleep(in: mode)
    }
    loop.add(sleeper, to: mode)
    ourObservers.append(sleeper)
  }

  private func makeSource(port: Int32) {
    if let source { CFRunLoopSourceInvalidate(source) }
    sourcePort = port
    let made = CFPlatform.makeDescriptorSource(descriptor: port, order: 0) { _ in MainBridgeState.shared.hostFired() }
    source = made
    for mode in bridged { CFRunLoopAddSource(mainCF, made, mode.coreFoundationMode) }
  }

  /// The mode CF runs now, as our mode, if it is bridged.
  private var currentBridgedMode: RunLoopMode? {
    guard let cfMode = CFRunLoopCopyCurrentMode(mainCF) else { return nil }
    let mode = RunLoopMode(coreFoundationName: CFPlatform.name(of: cfMode))
    return bridged.contains(mode) ? mode : nil
  }

  // MARK: CF hosts the main loop

  private func cfDid(_ activity: CFRunLoopActivity) {
    guard let loop, !isTornDown else { return }
    if activity == .entry {
      cfDepth += 1
      let begins = !cfIsOurSleep
      embeddingStack.append(begins)
      if begins { loop.beginEmbedding() }
    } else if activity == .exit {
      // (The exit of a run that was already running when the bridge was installed has no entry.)
      guard let began = embeddingStack.popLast() else { return }
      if began {
        // The outermost CF run ended: `while … { RunLoop.main.run(mode:before:) }` calls the next
        // one at once, so the main loop stays served in between, unless a run of our own (or
        // its shutdown) takes over (see `endEmbeddingUntilTheHostRunsAgain()`).
        if embeddingStack.isEmpty { loop.endEmbeddingUntilTheHostRunsAgain() } else { loop.endEmbedding() }
      }
      cfDepth -= 1
    } else if activity == .beforeWaiting, !cfIsOurSleep, let mode = currentBridgedMode {
      serveBeforeCFSleeps(loop, in: mode)
    }
  }

  /// The CF source (the main loop's descriptor is readable) or the CF timer (its deadline) fired.
  /// While CF is our loop's sleep this only ends that CF run (it returns after a source).
  private func hostFired() {
    guard let loop, !isTornDown, !cfIsOurSleep, let mode = currentBridgedMode else { return }
    pass(loop, in: mode)
  }

  private func pass(_ loop: RunLoopThread, in mode: RunLoopMode) {
    loop.runEmbeddedPass(mode: mode)
    if loop.isShutDown { tearDown() }
  }

  /// Before CF sleeps: runs the passes due, then arms the CF timer for the next deadline. The
  /// descriptor is checked too: CF is told about it only on a new readiness edge, and a handler
  /// may leave a descriptor ready. Still busy after 16 passes: CF polls instead of sleeping.
  private func serveBeforeCFSleeps(_ loop: RunLoopThread, in mode: RunLoopMode) {
    for _ in 0..<16 {
      switch loop.prepareForHostWait(mode: mode) {
      case .shutDown:
        pass(loop, in: mode)  // the last pass drains the main loop, then tears the bridge down
        return
      case .passNow:
        pass(loop, in: mode)
      case .wait(let deadline):
        if loop.embeddingDescriptor != sourcePort { makeSource(port: loop.embeddingDescriptor) }
        if CFPlatform.isReadable(sourcePort) {
          pass(loop, in: mode)
          continue
        }
        let seconds = deadline.map { CFPlatform.secondsUntil(monotonicNanoseconds: $0.nanoseconds) } ?? 1e9
        if let timer { CFRunLoopTimerSetNextFireDate(timer, CFAbsoluteTimeGetCurrent() + seconds) }
        return
      }
    }
    CFRunLoopWakeUp(mainCF)
  }

  // MARK: The main loop sleeps in CF

  /// Our main loop is about to sleep in `mode`: it sleeps in CF's run of the same mode instead,
  /// which returns when CF handled a source — ours among them: the main loop's descriptor became
  /// readable. Then the main loop makes a pass instead of sleeping again (`wakeUp()`).
  private func ourLoopWillSleep(in mode: RunLoopMode) {
    guard let loop, !isTornDown else { return }
    switch loop.prepareForHostWait(mode: mode) {
    case .shutDown:
      return
    case .passNow:
      return  // work is waiting: the main loop makes its pass, no sleep
    case .wait:
      if loop.embeddingDescriptor != sourcePort { makeSource(port: loop.embeddingDescriptor) }
      drivenDepths.append(cfDepth + 1)
      let result = CFRunLoopRunInMode(mode.coreFoundationMode, 1e9, true)
      drivenDepths.removeLast()
      // CF had nothing in that mode: the main loop sleeps by itself.
      if result != .finished { loop.wakeUp() }
    }
  }

  /// The main loop shut down: CF stops watching it. Its observers went with the shutdown.
  private func tearDown() {
    guard !isTornDown else { return }
    isTornDown = true
    if let source { CFRunLoopSourceInvalidate(source) }
    if let timer { CFRunLoopTimerInvalidate(timer) }
    if let observer { CFRunLoopObserverInvalidate(observer) }
    for began in embeddingStack where began { loop?.endEmbedding() }
    embeddingStack.removeAll()
    for observer in ourObservers { observer.invalidate() }
  }
}
