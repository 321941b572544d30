#!/usr/bin/env bash
# Device calls after the one that launched full_run.sh: wait (polling every 10 s) up to ${WAIT_S:-540} s
# for $SMOL/results/DONE, stop waiting early if full_run.sh is no longer running, show the log's last
# 40 lines (progress bars filtered), and copy the results to $OUT as at most 8 files: a few key files
# flat plus results.tgz holding everything (results/ and the filtered log). Partial results come back
# too, so a call can be the last one of the lease. Rerun it (a new call) while DONE is absent.
set -uo pipefail
SMOL="${SMOL:-$HOME/smol}"
results="$SMOL/results"
log="$SMOL/full.log"
wait_s="${WAIT_S:-540}"

running() { [ -f "$SMOL/full_run.pid" ] && kill -0 "$(cat "$SMOL/full_run.pid")" 2> /dev/null; }
# tqdm redraws with \r: split those, drop bar lines, keep the rest.
clean_log() { [ -f "$log" ] && tr '\r' '\n' < "$log" | grep -v -E '[0-9]+%\|.*\||\[[0-9:]+<[0-9:?]+|^[[:space:]]*$'; }

start=$(date +%s)
while [ ! -f "$results/DONE" ] && [ $(($(date +%s) - start)) -lt "$wait_s" ]; do
  running || { echo "full_run.sh is not running and DONE is absent"; break; }
  sleep 10
done
waited=$(($(date +%s) - start))
if [ -f "$results/DONE" ]; then status="DONE $(cat "$results/DONE")"; else status="NOT DONE"; fi
echo "== collect: $status after waiting ${waited}s; full_run running: $(running && echo yes || echo no)"
echo "== last 40 lines of $log (progress bars filtered)"
clean_log | tail -n 40
[ -f "$results/steps.tsv" ] && { echo "== steps (name rc seconds end)"; cat "$results/steps.tsv"; }

if [ -n "${OUT:-}" ] && [ -d "$results" ]; then
  clean_log > "$results/full_log.txt"
  flat=(steps.tsv capture_speed.json qs_summary.json sweep_sweep.md best_setting.json DONE)
  n=0
  for f in "${flat[@]}"; do
    [ -f "$results/$f" ] && cp "$results/$f" "$OUT/" && n=$((n + 1))
  done
  tar -C "$SMOL" -czf "$OUT/results.tgz" results
  echo "== copied $n flat files + results.tgz ($(du -h "$OUT/results.tgz" | cut -f1), $(find "$results" -type f | wc -l) files) to \$OUT"
fi
[ -f "$results/DONE" ]
