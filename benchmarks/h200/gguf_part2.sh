#!/usr/bin/env bash
# Device call 2 of 2 (carry .gguf_b): join the halves, check the sha256, convert once to bf16 safetensors.
set -euo pipefail
source benchmarks/h200/env.sh
cp .gguf_b/part01 "$SMOL/"
gguf="$SMOL/SmolLM2-135M-Instruct.Q4_1.gguf"
cat "$SMOL/part00" "$SMOL/part01" > "$gguf"
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $gguf" | sha256sum -c -
python3 -c "from pathlib import Path; from eaglewire.target.reference import ensure_reference_target as e; print(e(gguf=Path('$gguf')))"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
