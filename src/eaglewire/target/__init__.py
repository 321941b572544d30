"""Targets: loading (HF directories, GGUF, the reference SmolLM2), hook-based capture, identity."""
