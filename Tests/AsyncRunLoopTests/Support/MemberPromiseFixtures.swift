import Glibc
import Testing

@testable import AsyncRunLoop

// MARK: - Async sequences: endings, and nothing left behind

/// A weak reference, readable from any thread.
final class WeakBox<Object: AnyObject>: @unchecked Sendable {
  // Safety: written once before it is shared; Swift's weak references are safe to read while
  // another thread releases the object.
  weak var object: Object?
  init(_ object: Object?) { self.object = object }
  var isGone: Bool { object == nil }
}

enum SequenceKind: String, CaseIterable, Sendable {
  case source, signal, timer, readiness, activity
}

enum Ending: String, CaseIterable, Sendable {
  case breakAfterFirst, cancelWhileWaiting, invalidateWhileWaiting, shutdownWhileWaiting
}

/// Helpers shared by the suites that conform (they call them as `Self.name` or by name).
protocol MemberPromiseSettling {}

extension MemberPromiseSettling {
  /// Lets the loop apply what was sent before and make one more pass.
  static func settle(_ loop: RunLoopThread) throws {
    _ = try loop.performAndWait { 0 }
    _ = try loop.performAndWait { 0 }
  }

  static func endLoopWhilePosting(
    weak: ExecWeakLoop, command: CommandSource<Int>, drop: Bool, producers: [@Sendable () -> Void]
  ) throws {
    let holder = Guarded<RunLoopThread?>(try RunLoopThread(name: "end"))
    guard let loop = holder.snapshot else { return }
    weak.set(loop)
    loop.add(command.source, to: .common)
    _ = try loop.performAndWait { 0 }
    let ender: @Sendable () -> Void = {
      usleep(50)
      if drop {
        holder.withLock { $0 = nil }  // the last reference: the loop shuts itself down
      } else {
        holder.snapshot?.shutdown()
        holder.withLock { $0 = nil }
      }
    }
    race(producers + [ender])
  }

  /// Makes a sequence of `kind` on `loop`, starts its consumer (which records every element and
  /// breaks after the first when asked), and returns a weak reference to the sequence, a way to
  /// make it produce, a way to invalidate it, and the consumer task. The sequence itself is only
  /// held by the consumer (the closures hold it weakly).
  static func startConsumer(
    _ kind: SequenceKind, on loop: RunLoopThread, pipe: (read: Int32, write: Int32), breakAfterFirst: Bool,
    cancels: AtomicCounter, elements: AtomicCounter
  ) throws -> (
    weak: WeakBox<AnyObject>, produce: @Sendable () -> Void, invalidate: @Sendable () -> Void, task: Task<Void, Never>
  ) {
    func consume<S: AsyncSequence & Sendable>(_ sequence: S) -> Task<Void, Never> where S.Failure == Never {
      Task {
        for await _ in sequence {
          elements.increment()
          if breakAfterFirst { break }
        }
      }
    }
    switch kind {
    case .source:
      let sequence = loop.sourceSequence(of: Int.self, onCancel: { _ in cancels.increment() })
      return (
        WeakBox(sequence), { [weak sequence] in _ = sequence?.post(1) }, { [weak sequence] in sequence?.invalidate() },
        consume(sequence)
      )
    case .signal:
      let sequence = loop.signalSequence(onCancel: { _ in cancels.increment() })
      return (
        WeakBox(sequence), { [weak sequence] in sequence?.signal() }, { [weak sequence] in sequence?.invalidate() },
        consume(sequence)
      )
    case .timer:
      let sequence = loop.timer(every: .milliseconds(1))
      return (WeakBox(sequence), {}, { [weak sequence] in sequence?.invalidate() }, consume(sequence))
    case .readiness:
      let sequence = try loop.readiness(of: pipe.read)
      return (
        WeakBox(sequence), { writeByte(pipe.write) }, { [weak sequence] in sequence?.invalidate() }, consume(sequence)
      )
    case .activity:
      let sequence = loop.activities([.afterWaiting])
      return (
        WeakBox(sequence), { [weak loop] in loop?.wakeUp() }, { [weak sequence] in sequence?.invalidate() },
        consume(sequence)
      )
    }
  }
}
