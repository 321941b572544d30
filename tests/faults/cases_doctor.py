"""The doctor's verdicts, both ways (issue 43 items 2 and 5, and the check families that had no case).

- An export read the way its engine reads it, with no serving arguments: the quickstart's clean
  SGLang and vLLM exports pass; an edited id list, ids past the target's last layer, ids edited with
  no --target (export vs its contract) and a norm flag vLLM reads differently are findings.
- Mislabelled data (labels [2, 4, 5], columns really [3, 5, 6]) checked with two drafts whose contracts
  both say [2, 4, 5] and match the live target: one learned [2, 4, 5] ("this data is mislabelled": leave
  the draft alone), one learned the data's real [3, 5, 6] ("this draft was trained on mislabelled data":
  its wiring must change). Only the draft's own accuracy under both wirings tells them apart.
- The serving lint (SGLang's silent rewrite of --speculative-num-draft-tokens), draft vs target, and the
  quickstart's draft against its own data and target.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.faults.harness import Case

LABELS = (2, 4, 5)  # the tiny 8-layer target's default aux boundaries: what the data's labels say
STORED = (3, 5, 6)  # what the mislabelled data's columns really are
MISLABEL = "doctor-mislabel"
SGLANG = "{ws}/qs/export/sglang"
VLLM = "{ws}/qs/export/vllm"
REWRITTEN = (
    "--speculative-algorithm EAGLE3 --speculative-num-steps 1 --speculative-eagle-topk 1 "
    "--speculative-num-draft-tokens 16"
)
CHAIN = (
    "--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
    "--speculative-num-draft-tokens 4"
)


def build(base: Path) -> None:
    """The two drafts and their data (real capture, real drafts, the library's writers; ~2 s)."""
    from eaglewire.data.shards import ShardWriter
    from eaglewire.data.types import ShardContent
    from eaglewire.draft.io import save_draft
    from eaglewire.target.loading import load_target
    from tests.unit.doctor.pipeline import mislabelled_world

    target = load_target(str(base / "target"), dtype="float32")
    for name, learned in (("fine", LABELS), ("learned", STORED)):
        world = mislabelled_world(target, labels=LABELS, stored=STORED, learned=learned)
        save_draft(world.draft, world.draft_contract, base / MISLABEL / f"draft_{name}")
        writer = ShardWriter(
            base / MISLABEL / f"data_{name}",
            world.data_contract,
            plan={"test": f"doctor mislabelled data ({name})"},
            total_records=len(world.records),
        )
        writer.write(0, 0, ShardContent.from_records(world.records))
        writer.finish()


def _edit_config(rel: str, **changes: Any) -> Callable[[Path], None]:
    """Edit keys of an export's config.json by hand (a dotted key edits a nested one; None deletes)."""

    def setup(ws: Path) -> None:
        path = ws / rel / "config.json"
        config = json.loads(path.read_text(encoding="utf-8"))
        for dotted, value in changes.items():
            *parents, key = dotted.split("__")
            holder = config
            for p in parents:
                holder = holder[p]
            if value is None:
                holder.pop(key, None)
            else:
                holder[key] = value
        path.write_text(json.dumps(config, indent=2), encoding="utf-8")

    return setup


def _mislabel(name: str) -> str:
    return (
        f"doctor --draft {{ws}}/{MISLABEL}/draft_{name} --data {{ws}}/{MISLABEL}/data_{name} "
        "--target {ws}/target --accuracy-labels tokens"
    )


CASES = [
    # item 2: an export read the way its engine reads it
    Case(
        "doctor:export-sglang-clean",
        f"doctor --draft {SGLANG} --target {{ws}}/target",
        0,
        says=("export: sglang", "everything matches"),
    ),
    Case(
        "doctor:export-vllm-clean",
        f"doctor --draft {VLLM} --target {{ws}}/target",
        0,
        says=("export: vllm", "everything matches"),
    ),
    Case(
        "doctor:export-vllm-edited-ids",
        f"doctor --draft {VLLM} --target {{ws}}/target",
        1,
        setup=_edit_config("qs/export/vllm", eagle_aux_hidden_state_layer_ids=[3, 5, 6]),
        says=(
            "export.vllm.layer_ids",
            "eagle_aux_hidden_state_layer_ids = [3, 5, 6]",
            "captures boundaries 3 (output of layer 2), 5 (output of layer 4), 6 (output of layer 5)",
            "trained on boundaries 2 (output of layer 1), 4 (output of layer 3), 5 (output of layer 4)",
            "by values",
            "fix: set eagle_aux_hidden_state_layer_ids to [2, 4, 5] in {ws}/qs/export/vllm/config.json",
        ),
    ),
    Case(
        "doctor:export-vllm-ids-past-the-last-layer",
        f"doctor --draft {VLLM} --target {{ws}}/target",
        1,
        setup=_edit_config("qs/export/vllm", eagle_aux_hidden_state_layer_ids=[100, 200, 300]),
        says=(
            "eagle_aux_hidden_state_layer_ids = [100, 200, 300]",
            "valid are ids naming boundaries 0..8",
            "fix: set eagle_aux_hidden_state_layer_ids to [2, 4, 5]",
        ),
    ),
    Case(
        "doctor:export-sglang-edited-ids-no-target",
        f"doctor --draft {SGLANG}",
        1,
        setup=_edit_config("qs/export/sglang", eagle_config__eagle_aux_hidden_state_layer_ids=[2, 3, 4]),
        says=(
            "eagle_config.eagle_aux_hidden_state_layer_ids = [2, 3, 4]",
            "SGLang 0.5.10-0.5.23 (every release read) captures boundaries 3 (output of layer 2)",
            "(the draft's contract)",
            "set eagle_config.eagle_aux_hidden_state_layer_ids to [1, 3, 4]",
        ),
    ),
    Case(
        "doctor:export-vllm-norm-flag-absent",
        f"doctor --draft {VLLM} --target {{ws}}/target",
        1,
        setup=_edit_config("qs/export/vllm", norm_before_residual=None),
        says=(
            "export.vllm.norm_before_residual",
            "absent (vLLM reads it as true)",
            'set "norm_before_residual": false',
        ),
    ),
    # item 5: mislabelled data, and a draft that was or was not trained on it
    Case(
        "doctor:data-mislabelled-draft-fine",
        _mislabel("fine"),
        1,
        says=(
            "data.aux",
            "this data is mislabelled: its columns are boundaries [3, 5, 6], its labels say [2, 4, 5]",
            "the draft is fine",
            "100.0% (104/104) with its contract's boundaries [2, 4, 5]",
            "do not change the draft",
            f"relabel the data: eaglewire data relabel --data {{ws}}/{MISLABEL}/data_fine --target {{ws}}/target "
            "--aux-boundaries 3,5,6",
        ),
    ),
    Case(
        "doctor:draft-trained-on-mislabelled-data",
        _mislabel("learned"),
        1,
        says=(
            "this draft was trained on mislabelled data: it learned the data's real boundaries [3, 5, 6]",
            "100.0% (104/104) on the data's columns [3, 5, 6]",
            "correct its wiring to aux_boundaries [3, 5, 6]",
            "vLLM/speculators [3, 5, 6]",
            f"eaglewire draft relabel --draft {{ws}}/{MISLABEL}/draft_learned --target {{ws}}/target "
            f"--aux-boundaries 3,5,6 --out {{ws}}/{MISLABEL}/draft_learned-relabelled",
        ),
    ),
    # the other check families, both ways
    Case(
        "doctor:sglang-args-silent-rewrite",
        f'doctor --sglang-args "{REWRITTEN}"',
        1,
        says=("serving.sglang.num_draft_tokens", "rewrites --speculative-num-draft-tokens 16 to 2"),
    ),
    Case("doctor:sglang-args-chain", f'doctor --sglang-args "{CHAIN}"', 0, says=("everything matches",)),
    Case(
        "doctor:draft-and-data-clean",
        "doctor --draft {ws}/qs/train/draft --target {ws}/target --data {ws}/qs/data/train_shards",
        0,
        says=("data vs target", "draft vs target", "draft vs data", "everything matches"),
    ),
    Case(
        "doctor:draft-vs-another-target",
        "doctor --draft {ws}/qs/train/draft --target {ws}/target5",
        1,
        says=("draft.target.num_layers", "num_layers=8", "num_layers=5"),
    ),
]
