#!/usr/bin/env bash
# A short diagnostic session (the last call of split_gguf.py's plan, carrying its last .gguf_<letter>): convert, then where decoding loops spend
# their time (benchmarks/loop_profile.py) and a look at Magpie prompts sampled from the target.
set -uo pipefail
bash benchmarks/h200/gguf_part2.sh || exit 1
source benchmarks/h200/env.sh
export PYTHONPATH="$PYTHONPATH:$PWD"
mkdir -p "$OUT"
timeout 300 python3 benchmarks/loop_profile.py --out "$OUT/loop_profile.json" 2>&1 | grep -v USDT | tail -n 30
timeout 120 python3 - <<'PY' 2>&1 | grep -v USDT | tail -n 40
import json, os, time
from eaglewire.data.generation import SamplingConfig
from eaglewire.data.magpie import generate_magpie_prompts
from eaglewire.target.loading import load_target
t = load_target("smollm2", dtype="bfloat16", device="cuda")
t0 = time.perf_counter()
convs = generate_magpie_prompts(t, 1000, sampling=SamplingConfig(max_new_tokens=96, temperature=1.0, top_p=1.0, seed=0, batch_size=256), show_progress=False)
dt = time.perf_counter() - t0
print(f"magpie: {len(convs)} prompts in {dt:.1f}s")
with open(os.path.join(os.environ["OUT"], "magpie_sample.jsonl"), "w") as f:
    for c in convs[:200]:
        f.write(json.dumps(c.to_json()) + "\n")
for c in convs[:12]:
    print(repr(c.messages[0].content[:160]))
PY
