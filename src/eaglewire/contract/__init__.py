"""The hidden-state contract, boundary numbering and fingerprints (see docs/contract.md).

Import from the modules (`contract.contract`, `contract.fingerprint`, `contract.numbering`):
this package imports nothing, so the torch-free numbering stays cheap for `eaglewire ids`.
"""
