import Glibc
import Testing

@testable import AsyncRunLoop

/// Something the routines capture, to see (weakly) that they are released.
final class Capture: Sendable {}

// MARK: IndexedTimerHeap against a model

final class HeapItem: TimerHeapElement {
  var heapSlot = -1
  let id: Int
  init(id: Int) { self.id = id }
}
