"""eaglewire: EAGLE-3 speculative decoding with a hidden-state contract you can check."""

__version__ = "0.1.0"
