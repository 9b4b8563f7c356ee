// swift-tools-version: 6.2
import PackageDescription

/// Every target is Swift 6 language mode with warnings treated as errors.
let strictSettings: [SwiftSetting] = [
  .swiftLanguageMode(.v6),
  .treatAllWarnings(as: .error),
]

let package = Package(
  name: "AsyncRunLoop",
  products: [
    .library(name: "AsyncRunLoop", targets: ["AsyncRunLoop"])
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
    .executableTarget(
      name: "AsyncRunLoopBenchmarks",
      dependencies: ["AsyncRunLoop", "CAsyncRunLoop"],
      path: "Benchmarks/AsyncRunLoopBenchmarks",
      swiftSettings: strictSettings
    ),
    // The delegate-wrapper idiom (FORCE_MAIN_THREAD): delegate callouts always on the main thread.
    .executableTarget(
      name: "MainThreadDelegateExample",
      dependencies: ["AsyncRunLoop"],
      path: "Examples/MainThreadDelegate",
      swiftSettings: strictSettings
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
      dependencies: ["AsyncRunLoop", "CAsyncRunLoop"],
      path: "Tests/MainLoopFixture",
      swiftSettings: strictSettings
    ),
    // Test harness settings applied before the test binary's main (see the file's comment).
    .target(name: "CTestHarness", path: "Tests/CTestHarness"),
    .testTarget(
      name: "AsyncRunLoopTests",
      // The executables are dependencies so that `swift test` builds them next to the test binary.
      dependencies: [
        "AsyncRunLoop", "CAsyncRunLoop", "CTestHarness", "MainLoopFixture", "MainThreadDelegateExample",
        "CustomInputSourceExample", "ObserverLogExample", "EchoServerExample",
      ],
      swiftSettings: strictSettings
    ),
  ]
)
