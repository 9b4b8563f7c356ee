// swift-tools-version: 6.3
import PackageDescription

/// Every target is Swift 6 language mode. Warnings are errors only in our own builds (CI and
/// development set `ASYNC_RUN_LOOP_STRICT=1`, as `.ci/run` does): a package that depends on this one
/// must not fail to build because a newer compiler warns about something here.
let isStrictBuild = Context.environment["ASYNC_RUN_LOOP_STRICT"] != nil
let strictSettings: [SwiftSetting] =
  [.swiftLanguageMode(.v6)] + (isStrictBuild ? [.treatAllWarnings(as: .error)] : [])

let package = Package(
  name: "AsyncRunLoop",
  products: [
    .library(name: "AsyncRunLoop", targets: ["AsyncRunLoop"]),
    .library(name: "AsyncRunLoopFoundation", targets: ["AsyncRunLoopFoundation"]),
    .library(name: "AsyncRunLoopTesting", targets: ["AsyncRunLoopTesting"]),
  ],
  targets: [
    // System headers that Glibc's Swift module does not expose (epoll, eventfd, timerfd,
    // signalfd), the thread-local "current loop" slot, and libdispatch's main-queue hooks.
    .target(name: "CAsyncRunLoop"),
    .target(
      name: "AsyncRunLoop",
      dependencies: ["CAsyncRunLoop"],
      swiftSettings: strictSettings
    ),
    // The bridge to Foundation's run loops: the only target that imports Foundation/CoreFoundation.
    .target(
      name: "AsyncRunLoopFoundation",
      dependencies: ["AsyncRunLoop"],
      swiftSettings: strictSettings
    ),
    // The virtual-time test loop that users import in their tests.
    .target(
      name: "AsyncRunLoopTesting",
      dependencies: ["AsyncRunLoop"],
      swiftSettings: strictSettings
    ),
    .testTarget(
      name: "AsyncRunLoopTestingTests",
      dependencies: ["AsyncRunLoop", "AsyncRunLoopTesting"],
      swiftSettings: strictSettings
    ),
    .executableTarget(
      name: "AsyncRunLoopBenchmarks",
      dependencies: ["AsyncRunLoop", "AsyncRunLoopFoundation", "CAsyncRunLoop"],
      path: "Benchmarks/AsyncRunLoopBenchmarks",
      swiftSettings: strictSettings
    ),
    // main-rtt's factory route: an async main on AsyncRunLoopExecutorFactory, launched by the
    // benchmark (the flag as for AsyncMainExample).
    .executableTarget(
      name: "MainRTTAsyncMain",
      dependencies: ["AsyncRunLoop"],
      path: "Benchmarks/MainRTTAsyncMain",
      swiftSettings: strictSettings + [.unsafeFlags(["-Xfrontend", "-disable-availability-checking"])]
    ),
    // The delegate-wrapper idiom (FORCE_MAIN_THREAD): delegate callouts always on the main thread.
    .executableTarget(
      name: "MainThreadDelegateExample",
      dependencies: ["AsyncRunLoop"],
      path: "Examples/MainThreadDelegate",
      swiftSettings: strictSettings
    ),
    // An `async` main on the main loop through AsyncRunLoopExecutorFactory. The flag makes the
    // compiler honour the program's `DefaultExecutorFactory` on Linux (Swift 6.3.1 ignores it
    // otherwise); SwiftPM allows unsafeFlags on a root package's targets.
    .executableTarget(
      name: "AsyncMainExample",
      dependencies: ["AsyncRunLoop", "CAsyncRunLoop"],
      path: "Examples/AsyncMain",
      swiftSettings: strictSettings + [.unsafeFlags(["-Xfrontend", "-disable-availability-checking"])]
    ),
    // The classic custom input source: a worker's command source registered with the main thread.
    .executableTarget(
      name: "CustomInputSourceExample",
      dependencies: ["AsyncRunLoop"],
      path: "Examples/CustomInputSource",
      swiftSettings: strictSettings
    ),
    // An observer log of one thread's passes: the order of one pass.
    .executableTarget(
      name: "ObserverLogExample",
      dependencies: ["AsyncRunLoop"],
      path: "Examples/ObserverLog",
      swiftSettings: strictSettings
    ),
    // A TCP echo server on a loop thread, one pinned actor per connection; its own loopback client.
    .executableTarget(
      name: "EchoServerExample",
      dependencies: ["AsyncRunLoop"],
      path: "Examples/EchoServer",
      swiftSettings: strictSettings
    ),
    // A process whose main thread runs the main loop; MainLoopProcessTests launch it per scenario
    // (Swift Testing runs tests, and exit-test bodies, on pool threads, never the main thread).
    .executableTarget(
      name: "MainLoopFixture",
      dependencies: ["AsyncRunLoop", "CAsyncRunLoop", "CTestChildProcess"],
      path: "Tests/MainLoopFixture",
      swiftSettings: strictSettings
    ),
    // A process whose main thread runs Foundation's and our main loops bridged;
    // AsyncRunLoopFoundationTests launch it per scenario (Foundation stays out of MainLoopFixture).
    .executableTarget(
      name: "FoundationBridgeFixture",
      dependencies: ["AsyncRunLoop", "AsyncRunLoopFoundation", "CTestChildProcess"],
      path: "Tests/FoundationBridgeFixture",
      swiftSettings: strictSettings
    ),
    .testTarget(
      name: "AsyncRunLoopFoundationTests",
      dependencies: ["AsyncRunLoop", "AsyncRunLoopFoundation", "CTestChildProcess", "FoundationBridgeFixture"],
      swiftSettings: strictSettings
    ),
    // An `async` main on AsyncRunLoopExecutorFactory; AsyncMainOnMainLoopTests launch it per
    // scenario. The flag as for AsyncMainExample.
    .executableTarget(
      name: "AsyncMainFixture",
      dependencies: ["AsyncRunLoop", "CAsyncRunLoop", "CTestChildProcess"],
      path: "Tests/AsyncMainFixture",
      swiftSettings: strictSettings + [.unsafeFlags(["-Xfrontend", "-disable-availability-checking"])]
    ),
    // Test harness settings applied before the test binary's main (see the file's comment).
    .target(name: "CTestHarness", dependencies: ["CTestChildProcess"], path: "Tests/CTestHarness"),
    // The fixtures' and exit tests' watchdog alarm, which fires whatever signal mask the process
    // inherited (see the file's comment).
    .target(name: "CTestChildProcess", path: "Tests/CTestChildProcess"),
    .testTarget(
      name: "AsyncRunLoopTests",
      // The executables are dependencies so that `swift test` builds them next to the test binary.
      dependencies: [
        "AsyncRunLoop", "AsyncRunLoopTesting", "CAsyncRunLoop", "CTestChildProcess", "CTestHarness", "MainLoopFixture",
        "MainThreadDelegateExample",
        "AsyncMainFixture", "AsyncMainExample",
        "CustomInputSourceExample", "ObserverLogExample", "EchoServerExample",
      ],
      swiftSettings: strictSettings
    ),
  ]
)
