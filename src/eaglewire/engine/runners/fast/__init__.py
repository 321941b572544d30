"""The fast target runtime: a compact Llama-family model over a static KV cache, CUDA graphs and
compiled code (`runner.FastTargetRunner`); model math in `model`, weights in `weights`, the cache in
`kv_cache`, graph capture in `graphs`, the decode attention kernel in `attention_triton`."""
