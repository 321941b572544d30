"""What a rerun of the quickstart in the same run directory may reuse.

A rerun resumes: every stage whose `<stage>.json` marker exists is skipped, and the data and train
stages continue from what they wrote. That is only right while the preset fields feeding those
stages are the ones they ran with. A changed field feeding a stage that already ran (or, for the
data and train stages, that started) is refused before anything runs, naming the field, both
values and the markers to delete. Silently reusing them would report a draft trained with other
settings.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from eaglewire.errors import ConfigError
from eaglewire.recipes.presets import QuickstartPreset

STAGES = ("target", "data", "train", "eval", "decode", "export", "doctor")

# The first stage each preset field feeds (that stage and every later one depend on it).
FIELD_STAGE: dict[str, str] = {
    "name": "target",
    "device": "target",
    "target_dtype": "target",
    **dict.fromkeys(
        (
            "chitchat_conversations",
            "humaneval_problems",
            "magpie_prompts",
            "magpie_opened_fraction",
            "user_turns",
            "regenerate",
            "regen_max_seconds",
            "regen_max_new_tokens",
            "regen_temperature",
            "regen_batch_size",
            "regen_continuous",
            "regen_rows",
            "eval_conversations",
            "draft_vocab_size",
            "max_length",
            "train_from_shards",
            "capture_max_batch_tokens",
        ),
        "data",
    ),
    **dict.fromkeys(
        (
            "ttt_steps",
            "epochs",
            "learning_rate",
            "batch_size",
            "train_max_seconds",
            "train_compile",
            "train_ttt_attention",
            "draft_intermediate_size",
            "hard_label_weight",
            "source_repeats",
        ),
        "train",
    ),
    **dict.fromkeys(("chain_steps", "tree_num_steps", "decode_max_new_tokens"), "eval"),
    **dict.fromkeys(
        (
            "decode_prompts",
            "prompt_sets",
            "tree_topk",
            "tree_num_draft_tokens",
            "hf_baseline_sets",
            "hf_baseline_prompts",
            "timing_repeats",
            "whole_sets",
        ),
        "decode",
    ),
}

# Fields that set how fast or how far a resumable stage goes, not what it computes: a stage that
# started but did not finish may continue under new values (a longer regeneration or training
# budget, another batch of rows answered at once).
PACE_FIELDS = frozenset(
    {
        "regen_max_seconds",
        "regen_batch_size",
        "regen_continuous",
        "regen_rows",
        "train_max_seconds",
        "train_compile",
        "train_ttt_attention",
    }
)

# Stages that continue from what they wrote when rerun (the others start over).
RESUMABLE = ("data", "train")


def _json_value(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def check_resume(out_dir: Path, old: dict[str, Any], new: QuickstartPreset) -> None:
    """Refuse `new` for the run in `out_dir`, made with the preset `old` (its preset.json), when a
    changed field feeds a stage that has run (its marker exists) or, outside PACE_FIELDS, one of the
    RESUMABLE stages that has started (its folder exists)."""
    stale = []
    for f in fields(new):
        before, after = old.get(f.name), _json_value(getattr(new, f.name))
        if f.name not in old or before == after:
            continue
        first = STAGES.index(FIELD_STAGE[f.name])
        done = [s for s in STAGES[first:] if (out_dir / f"{s}.json").exists()]
        started = [
            s
            for s in STAGES[first:]
            if s in RESUMABLE and s not in done and f.name not in PACE_FIELDS and (out_dir / s).exists()
        ]
        if done or started:
            stale.append((f.name, before, after, done, started))
    if not stale:
        return
    lines = [
        f"{name}: {before!r} -> {after!r} (feeds {FIELD_STAGE[name]}; "
        + ", ".join([f"{s} done" for s in done] + [f"{s} started" for s in started])
        + ")"
        for name, before, after, done, started in stale
    ]
    first = min(STAGES.index(FIELD_STAGE[name]) for name, *_ in stale)
    redo = [f"{s}.json" for s in STAGES[first:] if (out_dir / f"{s}.json").exists()]
    redo += [f"{s}/" for s in STAGES[first:] if s in RESUMABLE and (out_dir / s).exists()]
    raise ConfigError(
        f"quickstart run {out_dir}: its stages ran with other preset values than asked now: "
        + "; ".join(lines),
        fix=f"pass a new --out, or delete {', '.join(redo)} in {out_dir} to redo those stages with the new "
        "values (or rerun with the old ones)",
    )


def preset_json(preset: QuickstartPreset) -> dict[str, Any]:
    """The preset as preset.json stores it."""
    return {k: _json_value(v) for k, v in asdict(preset).items()}
