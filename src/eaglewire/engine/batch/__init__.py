"""Speculative decoding at batch > 1: a batched drafter and a continuous-batching round loop."""
