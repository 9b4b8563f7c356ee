import Testing

@testable import AsyncRunLoop

/// `LoopDescriptors` as a plain value (no epoll): the silenced list knows each entry's index, a
/// mode switch re-arms only when the mode changes, and an unknown token seen in two waits in a row
/// asks for the epoll set to be rebuilt.
@Suite struct LoopDescriptorsTests {
  /// Records of descriptor registrations (never registered with epoll: the numbers are not used).
  static func registrations(_ count: Int, table: ModeTable) -> [MemberRecord] {
    (0..<count).map { index in
      let record = MemberRecord()
      let source = DescriptorSource(descriptor: Int32(1_000 + index)) { _, _ in }
      table.attach(record, .descriptor(DescriptorRegistration(source)))
      return record
    }
  }

  @Test func theSilencedListKeepsEachEntrysIndex() throws {
    let table = ModeTable()
    let records = Self.registrations(4, table: table)
    var descriptors = LoopDescriptors()
    for record in records { descriptors.listSilenced(record, try #require(record.registration)) }
    descriptors.listSilenced(records[0], try #require(records[0].registration))  // listed already: a no-op
    #expect(descriptors.silenced.count == 4)
    descriptors.unlistSilenced(try #require(records[1].registration))  // the last takes its place
    #expect(descriptors.silenced.map { ObjectIdentifier($0) } == [0, 3, 2].map { ObjectIdentifier(records[$0]) })
    for (index, record) in descriptors.silenced.enumerated() {
      #expect(record.registration?.silencedIndex == index)
    }
    #expect(records[1].registration?.silencedIndex == -1)
    descriptors.unlistSilenced(try #require(records[1].registration))  // not listed: a no-op
    descriptors.unlistSilenced(try #require(records[2].registration))  // the last one
    #expect(descriptors.silenced.map { ObjectIdentifier($0) } == [0, 3].map { ObjectIdentifier(records[$0]) })
  }

  @Test func aModeIsArmedOnceUntilForgotten() {
    var descriptors = LoopDescriptors()
    let first = descriptors.switchArmedMode(to: .default)
    let again = descriptors.switchArmedMode(to: .default)
    descriptors.forgetArmedMode()
    let afterForgetting = descriptors.switchArmedMode(to: .default)
    let other = descriptors.switchArmedMode(to: RunLoopMode("other"))
    #expect(first && !again && afterForgetting && other)
  }

  /// A token seen once (a registration removed by an earlier handler of the same wait) is
  /// forgotten after the next wait; one seen in two waits in a row (epoll keeps it for a closed
  /// number) asks for a purge, which forgets everything noted.
  @Test func anUnknownTokenSeenInTwoWaitsInARowAsksForAPurge() {
    var descriptors = LoopDescriptors()
    descriptors.noteUnknownToken(7)
    descriptors.endWait()
    #expect(!descriptors.needsPurge)
    descriptors.endWait()  // not seen in this wait
    descriptors.noteUnknownToken(7)
    #expect(!descriptors.needsPurge)  // the sighting before was two waits ago
    descriptors.endWait()
    descriptors.noteUnknownToken(7)
    #expect(descriptors.needsPurge)
    descriptors.beginPurge()
    #expect(!descriptors.needsPurge)
    descriptors.endWait()
    descriptors.noteUnknownToken(7)
    #expect(!descriptors.needsPurge)
  }
}
