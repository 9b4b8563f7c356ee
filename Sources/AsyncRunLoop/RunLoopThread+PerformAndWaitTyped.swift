extension RunLoopThread {
  /// Runs a block that cannot throw on the loop thread and waits for it to finish, returning its
  /// result; the only errors are the loop's own, so the call throws `RunLoopError` (typed).
  /// Otherwise exactly `performAndWait(inModes:_:)` with a throwing block (which must stay
  /// untyped: it rethrows whatever its block throws): on the loop's own thread it runs inline at
  /// once; from other threads it blocks until the loop ran it. Any thread.
  ///
  /// Swift picks this overload for every block that does not throw, so existing calls compile
  /// unchanged; a `catch` of such a call now knows the error is a `RunLoopError`.
  /// - Throws: `RunLoopError.shutDown` if the loop has shut down (or shuts down before running
  ///   the block); `RunLoopError.wouldDeadlock` as for `performAndWait(inModes:_:)`.
  public func performAndWait<T: Sendable>(
    inModes modes: [RunLoopMode] = [.common], _ block: @escaping @Sendable () -> T
  ) throws(RunLoopError) -> T {
    if isOnLoopThread {
      precondition(!modes.isEmpty, Self.emptyModesMessage("performAndWait(inModes:)", loop: name))
      return block()  // inline: nothing can fail
    }
    let throwing: @Sendable () throws -> T = block
    do {
      return try performAndWait(inModes: modes, throwing)
    } catch let error as RunLoopError {
      throw error
    } catch {
      // Every other error would be the block's, and it throws none.
      preconditionFailure("AsyncRunLoop: performAndWait threw \(error) for a block that cannot throw")
    }
  }
}
