#!/usr/bin/env bash
# The last device call of split_gguf.py's plan when device time is short: join + convert the GGUF, then run the quickstart.
set -uo pipefail
bash benchmarks/h200/gguf_part2.sh 2>&1 | grep -v "it/s\]" || exit 1
BUDGET_S="${BUDGET_S:-470}" bash benchmarks/h200/quickstart.sh
