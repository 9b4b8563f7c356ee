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
    .testTarget(
      name: "AsyncRunLoopTests",
      dependencies: ["AsyncRunLoop", "CAsyncRunLoop"],
      swiftSettings: strictSettings
    ),
  ]
)
