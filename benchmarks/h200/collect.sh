#!/usr/bin/env bash
# Device calls after the one that launched full_run.sh: wait (polling every 10 s) up to ${WAIT_S:-540} s
# for $SMOL/results/DONE, stop waiting early if full_run.sh is no longer running, show the log's last
# 40 lines (progress bars filtered), and copy the results to $OUT as at most 8 files: results.tgz holding
# everything (results/ and the filtered log), the trained draft once the quickstart's train stage has
# finished (benchmarks/h200/draft_parts.py pack: draft_part0.safetensors, draft_part1.safetensors, ~28 MiB
# for the GPU preset; LOSSY bf16, embed_tokens.weight left out; rebuild it here with
# `python benchmarks/h200/draft_parts.py unpack --parts DIR --target smollm2 --out DRAFT_DIR`), and as many
# key files flat as fit, in this order: DONE steps.tsv qs_summary.json best_setting.json capture_speed.json
# sweep_sweep.md (all of them are in results.tgz too). Partial results come back too, so a call can be the
# last one of the lease: it first reruns snapshot.sh, so a step still running brings back what it has written. Rerun it (a new call) while DONE is absent. Knobs: SMOL, WAIT_S, OUT, PY (python3,
# with PYTHONPATH=$SMOL/site:$SMOL/repo/src as full_run.sh), DRAFT_MAX_MIB (15).
set -uo pipefail
SMOL="${SMOL:-$HOME/smol}"
PY="${PY:-python3}"
results="$SMOL/results"
log="$SMOL/full.log"
wait_s="${WAIT_S:-540}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
max_files=8 max_file_bytes=$((16 * 1024 * 1024)) max_total_bytes=$((64 * 1024 * 1024))

running() { [ -f "$SMOL/full_run.pid" ] && kill -0 "$(cat "$SMOL/full_run.pid")" 2> /dev/null; }
# tqdm redraws with \r: split those, drop bar lines, keep the rest.
clean_log() { [ -f "$log" ] && tr '\r' '\n' < "$log" | grep -v -E '[0-9]+%\|.*\||\[[0-9:]+<[0-9:?]+|^[[:space:]]*$'; }
pyenv() { PYTHONPATH="$SMOL/site:$SMOL/repo/src${PYTHONPATH:+:$PYTHONPATH}" "$@"; } # as full_run.sh's
# The trained draft, from the quickstart's train stage marker (the GPU preset's, else any preset's).
# shellcheck source=benchmarks/h200/common.sh
source "$here/common.sh"
draft_dir() {
  local run
  for run in "$SMOL/runs/quickstart/gpu" "$SMOL"/runs/quickstart/*; do
    draft_dir_of "$run" && return
  done
  return 1
}
# pack_draft: the trained draft into $OUT as draft_part*.safetensors (at most 4 parts of ${DRAFT_MAX_MIB:-15}
# MiB, leaving room for results.tgz and the first flat files); prints the parts' names, none without a draft.
pack_draft() {
  local d script
  d=$(draft_dir) || return 0
  case "$d" in /*) ;; *) d="$SMOL/repo/$d" ;; esac # older runs recorded paths relative to the repo copy
  [ -f "$d/model.safetensors" ] || { echo "== draft: $d/model.safetensors missing; not packed" >&2; return 0; }
  script="$here/draft_parts.py"
  [ -f "$script" ] || script="$SMOL/repo/benchmarks/h200/draft_parts.py"
  pyenv "$PY" "$script" pack --draft "$d" --out "$OUT" --max-mib "${DRAFT_MAX_MIB:-15}" > "$results/draft_parts.txt" 2>&1
  local rc=$?
  if [ "$rc" != 0 ]; then
    echo "== draft: packing $d failed (rc $rc); its log's last lines:" >&2
    tail -n 5 "$results/draft_parts.txt" >&2
    rm -f "$OUT"/draft_part*.safetensors
    return 0
  fi
  local parts=("$OUT"/draft_part*.safetensors)
  if [ "${#parts[@]}" -gt 4 ]; then
    echo "== draft: ${#parts[@]} parts would leave too few files for the rest; not brought back" >&2
    rm -f "$OUT"/draft_part*.safetensors
    return 0
  fi
  grep -E 'packed ' "$results/draft_parts.txt" | sed 's/^/== draft: /' >&2
  local p
  for p in "${parts[@]}"; do basename "$p"; done
}

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
  # what the running step has written so far (the decode stage writes each prompt set as it ends)
  snap="$here/snapshot.sh"
  [ -f "$snap" ] || snap="$SMOL/repo/benchmarks/h200/snapshot.sh"
  pyenv env SMOL="$SMOL" PY="$PY" bash "$snap" || echo "== snapshot failed (rc $?); results as of the last step"
  clean_log > "$results/full_log.txt"
  mapfile -t draft_files < <(pack_draft)
  tar -C "$SMOL" -czf "$OUT/results.tgz" results
  # the flat files that fit beside results.tgz and the draft, most needed first
  flat=(DONE steps.tsv qs_summary.json best_setting.json capture_speed.json sweep_sweep.md)
  room=$((max_files - 1 - ${#draft_files[@]}))
  n=0 left=()
  for f in "${flat[@]}"; do
    [ -f "$results/$f" ] || continue
    if [ "$n" -lt "$room" ]; then cp "$results/$f" "$OUT/" && n=$((n + 1)); else left+=("$f"); fi
  done
  echo "== copied $n flat files + results.tgz ($(du -h "$OUT/results.tgz" | cut -f1), $(find "$results" -type f | wc -l) files)" \
    "+ ${#draft_files[@]} draft parts to \$OUT${left[*]:+; in results.tgz only: ${left[*]}}"
  total=0 count=0
  for f in "$OUT"/*; do
    [ -f "$f" ] || continue
    size=$(stat -c %s "$f")
    total=$((total + size)) count=$((count + 1))
    [ "$size" -gt "$max_file_bytes" ] && echo "== WARNING: $(basename "$f") is $size bytes, over the $max_file_bytes a file"
  done
  echo "== \$OUT: $count files, $((total / 1024)) KiB"
  [ "$count" -gt "$max_files" ] && echo "== WARNING: $count files in \$OUT, over $max_files"
  [ "$total" -gt "$max_total_bytes" ] && echo "== WARNING: $total bytes in \$OUT, over $max_total_bytes"
fi
[ -f "$results/DONE" ]
