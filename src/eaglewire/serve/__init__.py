"""`eaglewire serve`: an OpenAI-compatible HTTP server on eaglewire's speculative decoder.

    eaglewire serve --target T [--draft D] [--host 127.0.0.1] [--port 8000]

One module per concern:

    protocol.py    request bodies -> a checked GenerationRequest; OpenAI-style error bodies (400)
    loading.py     the target, the draft (eaglewire, or an SGLang / vLLM export read as that engine
                   reads it), the decoder; prompt tokenization and the context-length check
    worker.py      the one decode thread and the bounded queue in front of it (503 + Retry-After)
    streaming.py   server-sent events; the text a stream may show before the end
    responses.py   response bodies and chunks (OpenAI, SGLang's sglext, vLLM's token ids)
    spec_stats.py  SGLang's per-response spec fields and vLLM's spec-decode counters, with sources
    metrics.py     the server's counters and GET /metrics (Prometheus text)
    app.py         routes, error mapping, the access log
    server.py      listening, signals (SIGINT -> 130, SIGTERM -> 0), shutdown

Queue and overload: one request decodes at a time (batch 1); at most `--max-queue` more wait
(first come, first served); a request beyond that is answered at once with HTTP 503, an
OpenAI-style error body (code "queue_full") and a `Retry-After` header (seconds: the mean decode
time so far times the requests ahead, at least 1). A client that disconnects cancels its request:
a waiting one leaves the queue, a decoding one stops at the end of the current round.

Nothing is written to disk: no files in the working directory, no caches; logs go to stderr.
Importing this package loads no torch (the modules that need it import it when they run).
"""
