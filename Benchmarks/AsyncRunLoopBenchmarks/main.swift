import Glibc

// AsyncRunLoopBenchmarks: compares AsyncRunLoop with its floors (raw eventfd/epoll/timerfd
// threads) and the peers a user would otherwise pick (Foundation RunLoop, Dispatch,
// AsyncStream, the default executor), in one process. See `--help`.
//
// The measurements run on a background thread; the main thread serves a main loop on request
// (main-rtt gives it alternately to the AsyncRunLoop main loop and to Foundation's RunLoop.main).

let arguments = Array(CommandLine.arguments.dropFirst())
let mainDriver = MainThreadDriver()
if arguments.first == AllocationTrace.childFlag {
  // The hop-allocations tracing child (see AllocationTrace).
  _ = PlainThread(name: "bench-child", cpu: nil) {
    mainDriver.exitProcess(AllocationTrace.runChild(arguments: arguments))
  }
  mainDriver.serve(pinnedTo: nil)
} else {
  let options = Options.parse(arguments)
  _ = PlainThread(name: "bench-driver", cpu: nil) {
    mainDriver.exitProcess(BenchmarkDriver.run(options: options, mainDriver: mainDriver))
  }
  mainDriver.serve(pinnedTo: PinPlan(options.pin, cpus: onlineCPUs).serverCPU)
}
