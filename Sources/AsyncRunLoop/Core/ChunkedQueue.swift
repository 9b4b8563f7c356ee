/// A first-in, first-out list that other threads fill under a loop's inbox lock, in chunks of
/// fixed capacity, and that the loop thread takes whole.
///
/// One growing array would copy everything queued so far at each doubling, inside the lock: a
/// burst of 100k changes or blocks held every producer, and the loop, for milliseconds. Here an
/// append never moves what is queued (a full chunk is set aside, a new one begun), and taking the
/// queue moves chunks, not elements, so the loop holds the lock for O(chunks) and copies
/// elements, if at all, after releasing it.
///
/// A pure value; not thread-safe (the inbox lock guards it).
struct ChunkedQueue<Element> {
  /// Elements per chunk.
  static var chunkCapacity: Int { 1_024 }

  /// The set-aside chunks, oldest first; none is empty, and each holds at most `chunkCapacity`
  /// elements (exactly that many, unless put back with `prepend`).
  private(set) var fullChunks: [[Element]] = []
  /// The chunk being filled (the newest elements).
  private(set) var tail: [Element] = []

  var isEmpty: Bool { tail.isEmpty && fullChunks.isEmpty }
  /// O(chunks).
  var count: Int { fullChunks.reduce(tail.count) { $0 + $1.count } }

  mutating func append(_ element: Element) {
    if tail.count >= Self.chunkCapacity {
      fullChunks.append(tail)
      tail = []
      tail.reserveCapacity(Self.chunkCapacity)
    }
    tail.append(element)
  }

  /// Takes every element, oldest first, as non-empty chunks appended to `chunks`; the queue is
  /// left empty, its new tail the emptied `spare` (so the next appends reuse that capacity).
  mutating func takeAll(appendingTo chunks: inout [[Element]], spare: inout [Element]) {
    if !fullChunks.isEmpty {
      chunks.append(contentsOf: fullChunks)
      fullChunks.removeAll(keepingCapacity: true)
    }
    guard !tail.isEmpty else { return }
    spare.removeAll(keepingCapacity: true)
    swap(&spare, &tail)
    chunks.append(spare)
    spare = []
  }

  /// Takes every element into `elements`, which must be empty, in O(1) when they all sit in the
  /// tail (then `elements`' storage becomes the new tail, so a warm pair of arrays allocates
  /// nothing); false, and nothing changes, when chunks were set aside (take them with `takeAll`).
  mutating func takeTail(swappingWith elements: inout [Element]) -> Bool {
    precondition(elements.isEmpty, "AsyncRunLoop: taking a queue into a non-empty array")
    guard fullChunks.isEmpty else { return false }
    swap(&tail, &elements)
    return true
  }

  /// Puts `chunks` (oldest first, none empty, none over `chunkCapacity`) back in front of what is
  /// queued, in O(chunks): elements taken and not used go back ahead of those that arrived since.
  mutating func prepend(_ chunks: [[Element]]) {
    guard !chunks.isEmpty else { return }
    if fullChunks.isEmpty && tail.isEmpty && chunks.count == 1 {
      tail = chunks[0]
      return
    }
    fullChunks.insert(contentsOf: chunks, at: 0)
  }

  /// `elements` cut into chunks for `prepend`.
  static func chunks(of elements: some Collection<Element>) -> [[Element]] {
    var chunks: [[Element]] = []
    var index = elements.startIndex
    while index != elements.endIndex {
      let end = elements.index(index, offsetBy: chunkCapacity, limitedBy: elements.endIndex) ?? elements.endIndex
      chunks.append(Array(elements[index..<end]))
      index = end
    }
    return chunks
  }

  /// Keeps a taken chunk's storage, emptied, as the `spare` for the next `takeAll` (when there is
  /// none yet and the chunk is not oversized), so that the next burst's first chunk allocates
  /// nothing. Loop thread.
  static func recycle(_ chunk: inout [Element], asSpare spare: inout [Element]) {
    guard spare.capacity == 0, chunk.capacity <= 2 * chunkCapacity else { return }
    swap(&spare, &chunk)
    spare.removeAll(keepingCapacity: true)
  }

  /// Whether any element satisfies `predicate`, oldest first.
  func contains(where predicate: (Element) throws -> Bool) rethrows -> Bool {
    for chunk in fullChunks where try chunk.contains(where: predicate) { return true }
    return try tail.contains(where: predicate)
  }

  /// Every element, oldest first (a copy: for a drain, and tests).
  var elements: [Element] { fullChunks.flatMap { $0 } + tail }

  mutating func removeAll() {
    fullChunks.removeAll()
    tail.removeAll()
  }
}
