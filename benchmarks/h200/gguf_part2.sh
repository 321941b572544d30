#!/usr/bin/env bash
# The last device call (carry the last .gguf_<letter>): join the parts, check the sha256, convert once
# to bf16 safetensors. The parts of the earlier calls (gguf_part1.sh, gguf_part.sh) wait in $SMOL.
set -euo pipefail
source benchmarks/h200/env.sh
cp .gguf_?/part[0-9][0-9] "$SMOL/"
gguf="$SMOL/SmolLM2-135M-Instruct.Q4_1.gguf"
ls "$SMOL"/part[0-9][0-9]
cat "$SMOL"/part[0-9][0-9] > "$gguf" # the glob sorts part00, part01, ...
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $gguf" | sha256sum -c - \
  || { echo "the joined parts do not match: was every call of split_gguf.py's plan made, in order?"; exit 1; }
python3 -c "from pathlib import Path; from eaglewire.target.reference import ensure_reference_target as e; print(e(gguf=Path('$gguf')))"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
