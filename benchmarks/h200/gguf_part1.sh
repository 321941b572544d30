#!/usr/bin/env bash
# Device call 1 (carry .gguf_a and .whl): the first part of the reference GGUF + wheels missing there.
set -euo pipefail
source benchmarks/h200/env.sh
mkdir -p "$SMOL"
cp .gguf_a/part00 "$SMOL/"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SMOL/site" .whl/*.whl
ls -la "$SMOL"
