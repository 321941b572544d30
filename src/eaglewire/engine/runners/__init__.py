"""Target runners: what runs the target model for the decoding loops in `eaglewire.engine`.

    protocol.py   TargetRunner (and LaunchAheadRunner): forward N provisional tokens, commit the accepted
    factory.py    make_runner: the one place a runner is chosen (auto | fast | hf)
    fast/         FastTargetRunner: Llama-family targets over a static KV cache, CUDA graphs
    recompute.py  RecomputeRunner: any transformers causal LM, no cache, every forward recomputed

Everything here sits below the loops (speculative, pipelined, plain, continuous) and above
`eaglewire.target` (loading, hooks); the fast runner's in-graph greedy verification reads
`eaglewire.engine.verify`.
"""
