"""`eaglewire draft relabel`: a copy of a draft whose contract names other aux boundaries.

For a draft trained on mislabelled data: its weights learned the states the data really held, while
its contract repeats the data's wrong labels. The doctor proves which by the draft's own accuracy
under both wirings (`doctor.wiring_verdict.wiring_verdict_findings`); the fix is a draft with the same
config and weights (copied byte for byte) and a contract rebuilt on the live target at the boundaries
it learned. The new draft is a one-shot output (`outputs.fresh_output`): built beside `--out`, its
marker lists the three files' checksums, and it is loaded back before it is put in place. The source
directory is never written.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from eaglewire.contract.contract import CONTRACT_FILE, Contract, FinalState
from eaglewire.contract.numbering import validate_boundaries
from eaglewire.doctor.draft_source import detect_kind
from eaglewire.draft.config import DRAFT_CONFIG_FILE, DRAFT_FORMAT, DraftConfig
from eaglewire.draft.io import DRAFT_FILES, WEIGHTS_FILE, load_draft
from eaglewire.errors import CheckpointError, ConfigError, ContractMismatchError
from eaglewire.output_marker import OutputKind, write_marker
from eaglewire.outputs import fresh_output
from eaglewire.relabel.data import check_aux_count, contract_on_target, identity_differences
from eaglewire.target.loading import LoadedTarget
from eaglewire.typed_config import read_json_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DraftRelabel:
    source: Path
    out: Path
    old: Contract
    new: Contract


def check_relabel_paths(draft: Path, out: Path) -> None:
    """--out is a new directory: never the draft itself, nor inside it (before any work)."""
    src, dst = Path(os.path.abspath(draft)), Path(os.path.abspath(out))
    if dst == src or src in dst.parents:
        raise ConfigError(
            f"--out {out}: {'is' if dst == src else 'is inside'} --draft {draft}; draft relabel writes a new "
            "draft and never writes into the one it reads",
            fix=f"choose another --out, e.g. --out {draft}-relabelled",
        )


def read_draft_config(draft: Path) -> DraftConfig:
    """The draft's config (cheap: no weights read), refusing a directory that is not an eaglewire draft."""
    draft = Path(draft)
    if not draft.is_dir():
        raise CheckpointError(f"--draft {draft}: not a directory", fix="pass an eaglewire draft directory")
    cfg_path = draft / DRAFT_CONFIG_FILE
    if not cfg_path.is_file():
        raise CheckpointError(
            f"--draft {draft}: no {DRAFT_CONFIG_FILE}; not a draft directory",
            fix="pass an eaglewire draft directory",
        )
    config = read_json_file(cfg_path)
    if not isinstance(config, dict):
        raise ConfigError(f"{cfg_path}: expected a JSON object, got {type(config).__name__}")
    kind = detect_kind(config, str(cfg_path))
    if kind != "eaglewire":
        raise CheckpointError(
            f"--draft {draft}: a {kind} export, not an eaglewire draft ({cfg_path} has no format "
            f"{DRAFT_FORMAT!r}); draft relabel reads eaglewire drafts",
            fix=f"import it first: `eaglewire import --format {kind} --src {draft} --target TARGET --out "
            f"{draft}-imported`, then relabel the imported draft",
        )
    return DraftConfig.load(draft)


def check_num_aux(cfg: DraftConfig, aux: Sequence[int], draft: Path) -> None:
    """The draft's fc reads `num_aux` concatenated states: a relabel names exactly that many."""
    check_aux_count(
        aux,
        cfg.num_aux,
        what=f"the draft {draft} reads",
        width=f"its fc.weight reads num_aux x target_hidden_size = {cfg.num_aux} x {cfg.target_hidden_size} "
        f"= {cfg.num_aux * cfg.target_hidden_size} inputs; config.json num_aux={cfg.num_aux}",
    )


def relabel_draft(
    draft: Path,
    target: LoadedTarget,
    aux_boundaries: Sequence[int],
    out: Path,
    *,
    final: FinalState | None = None,
    force: bool = False,
    target_arg: str | None = None,
) -> DraftRelabel:
    """Write `out`: `draft`'s config.json and model.safetensors (copied) with a contract built on `target`
    at `aux_boundaries` (final state: `final`, default the draft's; dtype: the target's, as loaded).

    Refuses before writing when `out` is `draft` or inside it, when the draft reads another number of aux
    states, or when `target` is not the draft's target (identity hashes)."""
    draft, out = Path(draft), Path(out)
    target_arg = target_arg if target_arg is not None else str(target.path)
    check_relabel_paths(draft, out)
    cfg = read_draft_config(draft)
    aux = validate_boundaries(aux_boundaries, target.num_layers, what="--aux-boundaries")
    check_num_aux(cfg, aux, draft)
    _model, old = load_draft(draft)  # checksums, header, finite weights, vocab map, config vs contract
    diffs = identity_differences(old, target)
    if diffs:
        raise ContractMismatchError(
            f"--target {target_arg}: not the target the draft {draft} was built for:\n  "
            + "\n  ".join(diffs),
            fix=f"pass the draft's own target (--target {old.target.name or '<its path>'}); a relabel changes "
            "which states the draft reads, never its target",
        )
    new = contract_on_target(target, aux, final if final is not None else old.final)
    with fresh_output(out, OutputKind.DRAFT, force=force) as tmp:
        for name in (DRAFT_CONFIG_FILE, WEIGHTS_FILE):
            shutil.copyfile(draft / name, tmp / name)
        new.save(tmp)
        write_marker(tmp, OutputKind.DRAFT, DRAFT_FILES)
        load_draft(tmp)  # what was written loads, as a whole, before it is put in place
    log.info(
        "%s: draft %s rewired from aux boundaries %s to %s (weights and config copied; %s rebuilt on %s)",
        out,
        draft,
        list(old.aux_boundaries),
        list(new.aux_boundaries),
        CONTRACT_FILE,
        target_arg,
    )
    return DraftRelabel(source=draft, out=out, old=old, new=new)
