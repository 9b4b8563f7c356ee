import Glibc
import Testing

@testable import AsyncRunLoop

// Helpers for the tests of the mode check of 41c75bb (`MemberBinding.keeps` asks the loop's common set),
// the per-loop last sent numbers (`SentSequences`), and step 2 stopping at the oldest collected
// signal (65f8f2a).
