import Glibc
import Testing

@testable import AsyncRunLoop

/// `RunLoopThread.start(named:)` starts a new loop thread on every call: it is not a lookup.
@Suite struct StartNamedLoopTests {
  @Test func everyCallStartsAnotherLoopOnAThreadOfItsOwn() throws {
    let first = RunLoopThread.start(named: "start-named")
    let second = RunLoopThread.start(named: "start-named")
    #expect(first !== second)
    #expect(first.name == "start-named" && second.name == "start-named")
    #expect(threadCount(named: "start-named") == 2)
    let firstThread = try first.performAndWait { pthread_self() }
    let secondThread = try second.performAndWait { pthread_self() }
    #expect(pthread_equal(firstThread, secondThread) == 0)
    first.shutdownAndWait()
    second.shutdownAndWait()
    #expect(threadCount(named: "start-named") == 0)
  }
}
