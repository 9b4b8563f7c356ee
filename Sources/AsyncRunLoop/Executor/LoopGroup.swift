import Glibc
import Synchronization

/// A fixed group of loop threads, for spreading actors or connections across cores.
///
/// `next()` hands out the loops round-robin. Shut the group down with `shutdown()` (without
/// waiting) or `shutdownAndWait()`.
/// All methods may be called from any thread.
public final class LoopGroup: Sendable {
  /// The group's loops, in creation order.
  public let loops: [RunLoopThread]
  /// Round-robin cursor. Relaxed is enough: it only spreads load, it orders nothing.
  private let cursor = Atomic<UInt>(0)

  /// Creates `count` loops named "`name`-0", "`name`-1", ….
  /// - Parameters:
  ///   - count: How many loops (at least 1).
  ///   - name: The prefix of the loops' names.
  ///   - pinToCPUs: Pin loop *i* to the *i*-th CPU (modulo their number) of those the process
  ///     may run on (its affinity mask, see `RunLoopThread(name:cpu:)`).
  /// - Throws: `SystemCallError` if a loop cannot be created (the ones created are shut down).
  public init(count: Int, name: String = "loop", pinToCPUs: Bool = false) throws(SystemCallError) {
    precondition(count >= 1, "AsyncRunLoop: a LoopGroup needs at least one loop, not \(count)")
    // The allowed CPUs, not 0..<online: under `taskset` or a cpuset those differ, and pinning to a
    // CPU outside the mask throws.
    let cpus = pinToCPUs ? try CPUAffinity.allowedCPUs() : []
    var created: [RunLoopThread] = []
    do {
      for index in 0..<count {
        let cpu = cpus.isEmpty ? nil : cpus[index % cpus.count]
        created.append(try RunLoopThread(name: "\(name)-\(index)", cpu: cpu))
      }
    } catch {
      created.forEach { $0.shutdownAndWait() }
      throw error
    }
    loops = created
  }

  /// The next loop, round-robin.
  public func next() -> RunLoopThread {
    let index = cursor.wrappingAdd(1, ordering: .relaxed).oldValue
    return loops[Int(index % UInt(loops.count))]
  }

  /// Shuts every loop down, without waiting: `RunLoopThread.shutdown()` on each, in order. Any
  /// thread, including one of the group's loops (from a callout or a job on it); calling it again
  /// is a no-op. Each loop drains and its thread exits on its own; `shutdownAndWait()` waits for
  /// that.
  public func shutdown() {
    loops.forEach { $0.shutdown() }
  }

  /// Shuts every loop down and waits for their threads to finish. Any thread; on one of the
  /// group's loops it cannot wait for that loop itself (see `RunLoopThread.shutdownAndWait()`).
  public func shutdownAndWait() {
    loops.forEach { $0.shutdown() }
    loops.forEach { $0.shutdownAndWait() }
  }
}
