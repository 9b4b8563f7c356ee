// swift-tools-version: 6.1
import PackageDescription

// AsyncRunLoop against SwiftNIO's event loop, in one process (Benchmarks/results/nio-comparison.md).
// Not part of the root package. Both dependencies are local paths: AsyncRunLoop is this
// repository, swift-nio a local checkout (NIO_PATH, default ../../../nio-src/swift-nio). NIO's
// manifest takes its own dependencies (swift-atomics, swift-collections, swift-system) from
// sibling directories when SWIFTCI_USE_LOCAL_DEPS is set; build with it set.
let nioPath = Context.environment["NIO_PATH"] ?? "../../../nio-src/swift-nio"

let package = Package(
  name: "NIOPeer",
  dependencies: [
    .package(name: "AsyncRunLoop", path: "../.."),
    .package(name: "swift-nio", path: nioPath),
  ],
  targets: [
    // futex, gettid and thread pinning (the root package's CAsyncRunLoop is not a product).
    .target(name: "CNIOPeer"),
    .executableTarget(
      name: "NIOPeer",
      dependencies: [
        "CNIOPeer",
        .product(name: "AsyncRunLoop", package: "AsyncRunLoop"),
        .product(name: "NIOCore", package: "swift-nio"),
        .product(name: "NIOPosix", package: "swift-nio"),
      ],
      swiftSettings: [.swiftLanguageMode(.v6)]
    ),
  ]
)
