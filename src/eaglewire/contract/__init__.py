"""The hidden-state contract, boundary numbering and fingerprints (see DESIGN.md)."""

from eaglewire.contract.contract import (
    CONTRACT_FILE,
    Contract,
    FinalState,
    TargetIdentity,
    contract_diff,
    require_same_wiring,
)
from eaglewire.contract.fingerprint import (
    Fingerprint,
    FingerprintMatch,
    StateKey,
    TensorFingerprint,
    match_fingerprint,
)
from eaglewire.contract.numbering import (
    Numbering,
    default_boundaries,
    describe_boundary,
    from_boundaries,
    to_boundaries,
    validate_boundaries,
)

__all__ = [
    "CONTRACT_FILE",
    "Contract",
    "FinalState",
    "Fingerprint",
    "FingerprintMatch",
    "Numbering",
    "StateKey",
    "TargetIdentity",
    "TensorFingerprint",
    "contract_diff",
    "default_boundaries",
    "describe_boundary",
    "from_boundaries",
    "match_fingerprint",
    "require_same_wiring",
    "to_boundaries",
    "validate_boundaries",
]
