"""What a rerun of the quickstart in the same run directory may reuse.

A rerun resumes: every stage whose `<stage>.json` marker exists is skipped, and the data and train
stages continue from what they wrote. That is only right while the preset values feeding those
stages are the ones they ran with. A preset nests one sub-config per stage (`data`, `train`,
`decode`), so a changed value feeds its sub-config's stage and every later one; the few values an
earlier stage also reads are named in FEEDS_EARLIER. A changed value feeding a stage that already
ran (or, for the data and train stages, that started) is refused before anything runs, naming the
value, both settings and the markers to delete. Silently reusing them would report a draft trained
with other settings.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

from eaglewire.errors import ConfigError
from eaglewire.recipes.presets import STAGE_CONFIGS, QuickstartPreset
from eaglewire.typed_config import to_dict

STAGES = ("target", "data", "train", "eval", "decode", "export", "doctor")

# Values read by a stage before their sub-config's own (a top-level value feeds "target" unless named).
FEEDS_EARLIER: dict[str, str] = {
    "train.max_length": "data",  # the data stage tokenizes (and cuts regeneration prompts) to the row length
    "draft_intermediate_size": "train",  # the draft the train stage creates
    # the eval stage predicts tau for the decode stage's chain and tree depth, at its horizon
    "decode.chain_steps": "eval",
    "decode.tree_num_steps": "eval",
    "decode.max_new_tokens": "eval",
}

# Values that set how fast or how far a resumable stage goes, not what it computes: a stage that
# started but did not finish may continue under new values (a longer regeneration or training
# budget, another batch of rows answered at once).
PACE = frozenset(
    {
        "data.regen_max_seconds",
        "data.regen_batch_size",
        "data.regen_continuous",
        "data.regen_rows",
        "data.long_regen_batch_size",
        "data.long_regen_max_seconds",
        "train.max_seconds",
        "train.compile",
        "train.ttt_attention",
    }
)

# Stages that continue from what they wrote when rerun (the others start over).
RESUMABLE = ("data", "train")


def first_stage(path: str) -> str:
    """The first stage the preset value at dotted `path` feeds."""
    part = path.partition(".")[0] if "." in path else ""
    return FEEDS_EARLIER.get(path) or (part if part in STAGE_CONFIGS else "target")


def flat_values(preset_json: dict[str, Any]) -> dict[str, Any]:
    """preset.json as {dotted path: value}. A preset.json written before the preset nested its
    sub-configs (one flat object) is read by the names it had then: a key is the field of that name in
    one sub-config, or `<sub>_<field>` (`train_max_seconds` -> `train.max_seconds`)."""
    nested = all(isinstance(preset_json.get(part), dict) for part in STAGE_CONFIGS)
    out: dict[str, Any] = {}
    for key, value in preset_json.items():
        if nested and key in STAGE_CONFIGS:
            out.update({f"{key}.{name}": v for name, v in value.items()})
        else:
            out[key if nested else _nested_path(key)] = value
    return out


def _nested_path(flat_key: str) -> str:
    top = {f.name for f in dataclasses.fields(QuickstartPreset)} - set(STAGE_CONFIGS)
    if flat_key in top:
        return flat_key
    hints = typing.get_type_hints(QuickstartPreset)
    for part in STAGE_CONFIGS:
        names = {f.name for f in dataclasses.fields(hints[part])}
        if flat_key in names:
            return f"{part}.{flat_key}"
        if flat_key.startswith(part + "_") and flat_key[len(part) + 1 :] in names:
            return f"{part}.{flat_key[len(part) + 1 :]}"
    return flat_key  # a value of an older release no preset has now: never compared


def check_resume(out_dir: Path, old: dict[str, Any], new: QuickstartPreset) -> None:
    """Refuse `new` for the run in `out_dir`, made with the preset `old` (its preset.json), when a
    changed value feeds a stage that has run (its marker exists) or, outside PACE, one of the
    RESUMABLE stages that has started (its folder exists)."""
    before_values, after_values = flat_values(old), flat_values(preset_json(new))
    stale = []
    for path, after in after_values.items():
        if path not in before_values or before_values[path] == after:
            continue  # an older preset.json without this value, or the same value
        later = STAGES[STAGES.index(first_stage(path)) :]
        done = [s for s in later if (out_dir / f"{s}.json").exists()]
        started = [
            s
            for s in later
            if s in RESUMABLE and s not in done and path not in PACE and (out_dir / s).exists()
        ]
        if done or started:
            stale.append((path, before_values[path], after, done, started))
    if not stale:
        return
    lines = [
        f"{path}: {before!r} -> {after!r} (feeds {first_stage(path)}; "
        + ", ".join([f"{s} done" for s in done] + [f"{s} started" for s in started])
        + ")"
        for path, before, after, done, started in stale
    ]
    first = min(STAGES.index(first_stage(path)) for path, *_ in stale)
    redo = [f"{s}.json" for s in STAGES[first:] if (out_dir / f"{s}.json").exists()]
    redo += [f"{s}/" for s in STAGES[first:] if s in RESUMABLE and (out_dir / s).exists()]
    raise ConfigError(
        f"quickstart run {out_dir}: its stages ran with other preset values than asked now: "
        + "; ".join(lines),
        fix=f"pass a new --out, or delete {', '.join(redo)} in {out_dir} to redo those stages with the new "
        "values (or rerun with the old ones)",
    )


def preset_json(preset: QuickstartPreset) -> dict[str, Any]:
    """The preset as preset.json stores it (its sub-configs nested)."""
    result: dict[str, Any] = to_dict(preset)
    return result
