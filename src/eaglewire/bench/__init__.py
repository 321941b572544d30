"""Benchmarks: the decoding harness (`harness`), sweeps (`sweep`), the prediction check (`prediction`).

Entry point: `eaglewire bench` (`eaglewire.cli.bench`); see benchmarks/README.md.
"""
