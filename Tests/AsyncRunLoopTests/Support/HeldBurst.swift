@testable import AsyncRunLoop

/// The setup of the per-pass budget tests: a burst of registration changes larger than a budget,
/// with the change under test queued behind it.
///
/// Holds `loop` in a blocking perform (`blockLoop`; with `modes`, a block performed in those modes,
/// so that a run of one of them is what is held), runs `whileHeld` on the calling thread, sends an
/// add of every one of `fillers` to the loop's default mode, runs `change` (so that what it sends
/// waits in the inbox behind the burst), and releases the loop, which then applies the burst in
/// passes of one budget each. Returns at once: the test makes the passes it needs
/// (`performAndWait`, a run of a mode) and invalidates the fillers when it is done.
func burstBehindHeldLoop(
  _ fillers: [InputSource], on loop: RunLoopThread, inModes modes: [RunLoopMode]? = nil,
  whileHeld: () -> Void = {}, then change: () -> Void
) {
  let release: TestGate
  if let modes {
    let started = TestGate()
    let held = TestGate()
    loop.perform(inModes: modes) {
      started.open()
      _ = held.wait(timeout: .seconds(20))
    }
    _ = started.wait(timeout: .seconds(20))
    release = held
  } else {
    release = blockLoop(loop)
  }
  whileHeld()
  for filler in fillers { loop.add(filler) }
  change()
  release.open()
}

/// `count` custom sources that do nothing: fillers for a burst of changes.
func fillerSources(_ count: Int) -> [InputSource] { (0..<count).map { _ in InputSource(perform: { _ in }) } }
