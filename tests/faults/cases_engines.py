"""Issue 44: exports the engine releases read as trained (the engine table in contract/numbering.py).

- boundary L (the 8-layer target's last layer output) for SGLang 0.5.23: refused, naming SGLang's layer
  loop, the L-1 alternative and the vLLM format; the same draft exported for vLLM, which captures it;
- `ids` on a Qwen3 target with SGLang 0.5.23: ids are layer outputs (+1), as in every release read;
- boundary 0 on a Llama target without --sglang-version: releases before 0.5.22 crash on it, so the
  export is refused showing each release's reading; with --sglang-version 0.5.23 it is written;
- a vLLM export whose verifier would be a relative path that is no directory here: refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.faults.harness import Case

LAST, EMBED = "engines/draft_last", "engines/draft_embed"


def build(base: Path) -> None:
    """Two drafts of the workspace's target: one reading boundary L = 8, one reading the embedding."""
    from eaglewire.draft.init import init_draft
    from eaglewire.draft.io import save_draft
    from eaglewire.target.identity import build_contract
    from eaglewire.target.loading import load_target

    target = load_target(str(base / "target"), dtype="float32")
    for rel, boundaries in ((LAST, (2, 4, 8)), (EMBED, (0, 3, 5))):
        contract = build_contract(target, boundaries)
        save_draft(init_draft(target, contract), contract, base / rel)


def _verifier_is_absolute(ws: Path) -> None:
    config = json.loads((ws / "out_vllm/config.json").read_text())
    # the contract's target (the base workspace's), written absolute
    verifier = Path(config["speculators_config"]["verifier"]["name_or_path"])
    assert verifier.is_absolute() and (verifier / "config.json").is_file(), verifier
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 8]


CASES = [
    Case(
        "engines:sglang-boundary-l-refused",
        f"export --draft {{ws}}/{LAST} --format sglang --sglang-version 0.5.23 --out {{ws}}/out_sglang",
        2,
        says=(
            "boundary 8 = output of layer 7 (last layer, pre-norm)",
            "range(self.start_layer, self.end_layer)",
            "the draft gets 2 of its 3 aux states",
            "--aux-boundaries 2,4,7",
            "eaglewire export --format vllm",
        ),
    ),
    Case(
        "engines:vllm-boundary-l-accepted",
        f"export --draft {{ws}}/{LAST} --format vllm --out {{ws}}/out_vllm",
        0,
        says=("[2, 4, 8]", "vLLM 0.33.0: ids [2, 4, 8] -> boundaries [2, 4, 8]"),
        then=_verifier_is_absolute,
    ),
    Case(
        "engines:ids-qwen3-sglang-0.5.23",
        "ids --num-layers 8 --from sglang --arch Qwen3ForCausalLM --sglang-version 0.5.23 3,4,5",
        0,
        says=("ids [3, 4, 5] -> boundaries [4, 5, 6]", "output of layer 3"),
    ),
    Case(
        "engines:sglang-releases-read-apart-refused",
        f"export --draft {{ws}}/{EMBED} --format sglang --out {{ws}}/out_sglang",
        2,
        says=(
            "no single id list works for every SGLang release eaglewire has read",
            "SGLang 0.5.10-0.5.21: ids [-1, 2, 4]",
            "TypeError",
            "SGLang 0.5.22-0.5.23 captures them from ids [-1, 2, 4]",
            "--sglang-version 0.5.23",
        ),
    ),
    Case(
        "engines:sglang-named-release-accepted",
        f"export --draft {{ws}}/{EMBED} --format sglang --sglang-version 0.5.23 --out {{ws}}/out_sglang",
        0,
        says=("[-1, 2, 4]", "SGLang 0.5.23"),
    ),
    Case(
        "engines:vllm-verifier-not-portable-refused",
        "export --draft {ws}/qs/train/draft --format vllm --target-path models/target --out {ws}/out_vllm",
        2,
        says=("'models/target' (--target-path)", "not a directory from {ws}", "--verifier"),
    ),
]
