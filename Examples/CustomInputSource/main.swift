import AsyncRunLoop

// The classic CFRunLoop custom input source, with a command buffer: a worker thread runs a loop
// with one command source; the source's schedule routine registers it with the main thread (tells
// a main-thread coordinator how to reach it), the main thread posts commands to it, and the cancel
// routine unregisters it. The main thread runs the main loop until the worker has unregistered.
//
// Every line of the trace is printed on the main thread (worker lines travel there with
// `runOnMain`, which keeps one thread's calls in order), so the trace reads the same on every run.
//
// Run it: swift run CustomInputSourceExample

/// What the main thread asks the worker to do.
enum Command: Sendable {
  case greet(String)
  case add(Int, Int)
  case finish
}

/// Prints `line` on the main thread, tagged with the thread it comes from. Any thread: from the
/// worker it is queued for the main thread, after that thread's earlier `runOnMain` calls.
func trace(_ line: String) {
  let thread = RunLoopThread.isMainThread ? "main  " : "worker"
  runOnMain { print("[\(thread)] \(line)") }
}

/// The worker thread: a loop of its own and the command source it listens on.
final class Worker: Sendable {
  let loop: RunLoopThread
  /// The command buffer. Kept alive here: dropping a `CommandSource` invalidates it.
  let commands: CommandSource<Command>

  init(name: String, coordinator: Coordinator) throws {
    loop = try RunLoopThread(name: name)
    commands = CommandSource(
      // Schedule routine (worker thread, when the source is added to the loop): tell the
      // main thread that this source, on this loop, takes commands now.
      schedule: { source, loop, mode in
        trace("schedule routine: source added to '\(loop.name)' in mode '\(mode)'; registering with main")
        runOnMain { coordinator.register(source, on: loop) }
      },
      // Cancel routine (worker thread, when the source leaves its loop): take it back.
      cancel: { source, loop in
        trace("cancel routine: source left '\(loop.name)'; unregistering from main")
        runOnMain { coordinator.unregister(source) }
      },
      // Handler (worker thread, once per command, in posting order).
      handler: { command in
        precondition(!RunLoopThread.isMainThread, "a command ran on the main thread")
        switch command {
        case .greet(let name):
          trace("handled greet: hello, \(name)")
        case .add(let a, let b):
          trace("handled add: \(a) + \(b) = \(a + b)")
          runOnMain { coordinator.received(sum: a + b) }
        case .finish:
          trace("handled finish")
          runOnMain { coordinator.workerFinished() }
        }
      })
  }

  /// The thread's setup, as a worker thread's entry routine does it: install the source on its
  /// own loop. Any thread (the add itself happens on the worker thread).
  func start() {
    loop.perform { [self] in
      trace("installing the command source")
      loop.add(commands.source, to: .default)
    }
  }
}

/// The main thread's side: learns which sources are reachable, posts commands to them, and
/// stops the main loop once the worker has unregistered.
@MainActor
final class Coordinator {
  /// Workers this coordinator created; a source is reachable once its schedule routine ran.
  private var workers: [Worker] = []
  /// The registered worker (its source is on its loop), if any.
  private var registered: Worker?
  private(set) var sums: [Int] = []

  func adopt(_ worker: Worker) { workers.append(worker) }

  /// The schedule routine's message (main thread). The routine is handed the underlying
  /// `InputSource`, so the coordinator finds the worker it belongs to.
  func register(_ source: InputSource, on loop: RunLoopThread) {
    guard let worker = workers.first(where: { $0.commands.source === source }) else { return }
    registered = worker
    trace("registered the source of '\(loop.name)'; posting commands")
    for command in [Command.greet("main thread"), .add(2, 3), .add(40, 2), .finish] {
      let accepted = worker.commands.post(command)
      trace("posted \(command) (accepted: \(accepted))")
    }
  }

  func received(sum: Int) {
    sums.append(sum)
    trace("received sum \(sum)")
  }

  /// The worker handled `.finish`: invalidate its source, which runs the cancel routine.
  func workerFinished() {
    trace("worker finished; invalidating its source")
    registered?.commands.source.invalidate()
  }

  /// The cancel routine's message (main thread): forget the source; nothing is left to do.
  func unregister(_ source: InputSource) {
    guard let worker = registered, worker.commands.source === source else { return }
    registered = nil
    trace("unregistered the source; stopping the main loop")
    stopMainLoop()
  }
}

// A synchronous main: set up, then run the main loop on the main thread.
let coordinator = Coordinator()
let worker: Worker
do {
  worker = try Worker(name: "worker", coordinator: coordinator)
} catch {
  fatalError("cannot start the worker loop: \(error)")
}
coordinator.adopt(worker)
worker.start()

runMainLoop()  // returns when the coordinator calls stopMainLoop()
worker.loop.shutdownAndWait()
precondition(coordinator.sums == [5, 42], "unexpected sums \(coordinator.sums)")
print("done: sums \(coordinator.sums), worker shut down")
