#!/usr/bin/env bash
# A middle device call (carry .carry/draft_parts): a draft brought back from an earlier run, as the bf16
# parts collect.sh packed (draft_part*.safetensors, ~28 MiB), copied into $SMOL/draft_parts. full_run.sh's
# draft_unpack step rebuilds it there against the converted target, so a run can time or score an earlier
# run's draft without training it again (SWEEP_DRAFT=$SMOL/runs/carried/draft).
#   here:   mkdir -p .carry/draft_parts && cp PARTS/draft_part*.safetensors .carry/draft_parts/
set -euo pipefail
source benchmarks/h200/env.sh
compgen -G ".carry/draft_parts/draft_part*.safetensors" > /dev/null \
  || { echo "no .carry/draft_parts/draft_part*.safetensors here: carry .carry"; exit 1; }
rm -rf "$SMOL/draft_parts" && mkdir -p "$SMOL/draft_parts"
cp .carry/draft_parts/draft_part*.safetensors "$SMOL/draft_parts/"
ls -la "$SMOL/draft_parts"
