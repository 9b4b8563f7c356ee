import AsyncRunLoop
import CoreFoundation

/// One mode on both sides: our `.default` is CF's default mode (`RunLoop.Mode.default`), our
/// `.common` is CF's common-modes set (`RunLoop.Mode.common`), and every other mode has the same
/// name on both sides.
extension RunLoopMode {
  /// CF's name for this mode.
  var coreFoundationMode: CFRunLoopMode {
    switch self {
    case .default: return CFPlatform.defaultMode
    case .common: return CFPlatform.commonModes
    default: return CFPlatform.mode(named: rawValue)
    }
  }

  /// Our mode for CF's mode `name`.
  init(coreFoundationName name: String) {
    switch name {
    case CFPlatform.name(of: CFPlatform.defaultMode): self = .default
    case CFPlatform.name(of: CFPlatform.commonModes): self = .common
    default: self.init(name)
    }
  }
}
