#!/usr/bin/env bash
# Small, flat copies into $SMOL/results of everything worth keeping from the runs so far: the
# quickstart's stage results and each decoded prompt set's report (written as each set finishes),
# the sweep, the draft's best_setting.json, the training summary and the held-out records.
# full_run.sh runs it after every step; collect.sh runs it again before packing, so a lease that
# ends inside a long step (the quickstart's decode stage) still brings back the sets already done.
# Usage: SMOL=... [FULL_RUN_TINY=1] [PY=python3] bash benchmarks/h200/snapshot.sh
set -uo pipefail
SMOL="${SMOL:-$HOME/smol}"
PY="${PY:-python3}"
results="$SMOL/results"
preset=gpu
[ "${FULL_RUN_TINY:-0}" = 1 ] && preset=tiny
qs="$SMOL/runs/quickstart/$preset" # the CLI appends the preset's name to --out
sweep_out="$SMOL/runs/sweep"
mkdir -p "$results"
# shellcheck source=benchmarks/h200/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

for f in "$qs"/*.json; do [ -f "$f" ] && cp "$f" "$results/qs_$(basename "$f")"; done
for s in "$qs"/decode/*/; do
  [ -d "$s" ] || continue
  base=$(basename "$s")
  for f in "$s"*.md "$s"*.json "$s"*.png; do [ -f "$f" ] && cp "$f" "$results/${base}_$(basename "$f")"; done
done
for f in "$sweep_out"/*; do [ -f "$f" ] && cp "$f" "$results/sweep_$(basename "$f")"; done
d=$(draft_dir_of "$qs") && [ -f "$d/best_setting.json" ] && cp "$d/best_setting.json" "$results/best_setting.json"
[ -f "$qs/train/train_summary.json" ] && cp "$qs/train/train_summary.json" "$results/train_summary.json"
# the held-out tokenized records (well under 1 MB): with the draft that collect.sh brings back, the
# held-out replay of any chain or tree runs offline here (`eaglewire eval --data eval_data ...`)
if [ -d "$qs/data/eval" ] && [ ! -d "$results/eval_data" ]; then cp -r "$qs/data/eval" "$results/eval_data"; fi
exit 0
