import CAsyncRunLoop

/// The process's main-thread loop.
extension RunLoopThread {
  private static let mainStorage: LockedValue<RunLoopThread?> = LockedValue(nil)

  /// The loop of the process's main thread. Any thread may get it and hand it work; only the
  /// main thread may run it.
  public static var main: RunLoopThread {
    mainStorage.withLock { stored in
      if let stored { return stored }
      let created: RunLoopThread
      do {
        created = try RunLoopThread(name: "main", ownsThread: false, isMainLoop: true)
      } catch {
        preconditionFailure("AsyncRunLoop: cannot create the main loop: \(error)")
      }
      stored = created
      return created
    }
  }

  static var mainIfCreated: RunLoopThread? { mainStorage.withLock { $0 } }

  /// Main thread: makes the main loop the thread's current loop (so later checks are one load).
  @discardableResult
  func bindMainThread() -> RunLoopThread {
    if carl_current_loop() == nil { carl_set_current_loop(Unmanaged.passUnretained(self).toOpaque()) }
    return self
  }
}
