#!/usr/bin/env bash
# Device call 3 (after gguf_part1/2 on the same warm machine): the full quickstart recipe on the H200.
# Reruns resume (each stage is skipped once done). Results are copied to $OUT.
set -uo pipefail
source benchmarks/h200/env.sh
run="$SMOL/runs/quickstart"
timeout "${BUDGET_S:-560}" python3 -m eaglewire quickstart --preset gpu --out "$SMOL/runs/quickstart" "$@" 2>&1 \
  | grep -v -E "it/s\]$|s/it\]$" | tail -n 80
rc=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ]; then
  cp "$run"/gpu/summary.json "$run"/gpu/*.json "$OUT"/ 2>/dev/null || true
  for s in mt-bench-all user-eval-all chitchat-eval humaneval-eval mt-bench; do
    [ -f "$run/gpu/decode/$s/bench.md" ] && cp "$run/gpu/decode/$s/bench.md" "$OUT/bench-$s.md"
  done
  tar -C "$run/gpu" -czf "$OUT/decode.tgz" decode 2>/dev/null || true
fi
exit "$rc"
