import CAsyncRunLoop
import Glibc

// floor-futex (issue 26): the matched floor of a loop on the futex path. The server sleeps on a
// futex word, as a loop that watches no descriptor and no timer does, and is woken by FUTEX_WAKE
// after an atomic add, as `EpollPoller.wake(.futex)` does it.

/// A futex word used as a doorbell between threads: `ring()` from any thread, `wait(seen:)` on
/// the one thread that sleeps on it.
final class FutexDoorbell: @unchecked Sendable {
  // Safety: `word` (the pointer) is immutable after init; its pointee is only read and changed
  // through the C helpers' atomics (`carl_futex_word_load`, `carl_futex_bump_and_wake`) and the
  // futex system call. Deallocated in deinit, when no thread holds the doorbell any more.
  private let word: UnsafeMutablePointer<UInt32>

  init() {
    word = .allocate(capacity: 1)
    word.initialize(to: 0)
  }

  deinit { word.deallocate() }

  /// Bumps the word and wakes the sleeper. Any thread.
  @inline(__always)
  func ring() { carl_futex_bump_and_wake(word) }

  /// Sleeps until the word differs from `seen` (at once if it already does), then records the
  /// new value in `seen`. The sleeping thread only.
  @inline(__always)
  func wait(seen: inout UInt32) {
    while true {
      let now = carl_futex_word_load(word)
      if now != seen {
        seen = now
        return
      }
      carl_futex_wait(word, seen)
    }
  }
}
