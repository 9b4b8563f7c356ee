enum TimerSequenceSupport {
  static func peer(pin: PinPlan) -> PeerSpec<any LatencySession> { PeerSpec(name: "asyncrunloop", open: nil) }
}
