"""The target runtime: a compact Llama-family model over a static KV cache (`FastTargetRunner`),
a slow generic transformers path for other architectures (`GenericTargetRunner`), and
`make_target_runner` choosing between them. Both implement `eaglewire.engine.interfaces.TargetRunner`."""
