#!/usr/bin/env bash
# A middle device call (carry the next .gguf_<letter>, as split_gguf.py printed): one more part of the
# reference GGUF into $SMOL; the last call's gguf_part2.sh joins them.
set -euo pipefail
source benchmarks/h200/env.sh
mkdir -p "$SMOL"
cp .gguf_?/part[0-9][0-9] "$SMOL/"
ls -la "$SMOL"
