"""Draft vocabulary: the Vd target ids the draft's lm_head predicts, chosen by frequency.

Rule (deterministic):
1. the tokenizer's special ids (`all_special_ids`, those < V) are always kept;
2. then loss-masked target tokens by descending count, ties broken by ascending id;
3. if fewer than Vd distinct tokens were seen, the rest is filled with the unseen ids in
   ascending order (reported as `filled_unseen`);
4. the map is sorted ascending: `draft_to_target[d]` is the absolute target id of draft id d.

Saved beside the dataset as `draft_vocab.safetensors` (`draft_to_target [Vd] int64`) and
`draft_vocab.json` (the counts that led to it). Pure tensor math; no model code.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from eaglewire.data.records import TokenizedDataset
from eaglewire.errors import ConfigError, DataFormatError
from eaglewire.io_utils import atomic_path, atomic_write_json
from eaglewire.output_marker import OutputKind, recognise, update_marker, write_marker
from eaglewire.outputs import fresh_output
from eaglewire.safetensors_io import load_tensors
from eaglewire.tensor_checks import check_vocab_map
from eaglewire.typed_config import read_json_file

log = logging.getLogger(__name__)

DRAFT_VOCAB_TENSORS = "draft_vocab.safetensors"
DRAFT_VOCAB_JSON = "draft_vocab.json"
VOCAB_FILE_FIX = "create the vocabulary again with `eaglewire data vocab`"
VOCAB_FILES = (DRAFT_VOCAB_TENSORS, DRAFT_VOCAB_JSON)


@dataclass
class DraftVocab:
    draft_to_target: torch.Tensor  # [Vd] int64, ascending absolute target ids
    stats: dict[str, Any]

    @property
    def size(self) -> int:
        return int(self.draft_to_target.numel())


def token_frequencies(dataset: TokenizedDataset, vocab_size: int) -> torch.Tensor:
    """[V] int64 counts of target tokens at loss-masked positions."""
    ids = dataset.input_ids[dataset.loss_mask].long()
    if ids.numel() and int(ids.max()) >= vocab_size:
        raise DataFormatError(
            f"dataset holds token id {int(ids.max())} >= vocab size {vocab_size}",
            fix="build the dataset with this target's tokenizer, or pass the target's --vocab-size",
        )
    return torch.bincount(ids, minlength=vocab_size)


def select_draft_vocab(
    counts: torch.Tensor, draft_vocab_size: int, special_ids: Sequence[int] = ()
) -> tuple[torch.Tensor, dict[str, Any]]:
    """counts [V] -> (draft_to_target [Vd] ascending, stats). See the module docstring for the rule."""
    V = int(counts.numel())
    Vd = int(draft_vocab_size)
    if not 1 <= Vd <= V:
        raise ConfigError(f"draft_vocab_size: expected 1..{V} (the target vocab size V), got {Vd}")
    specials = sorted({int(s) for s in special_ids if 0 <= int(s) < V})
    if len(specials) > Vd:
        raise ConfigError(
            f"draft_vocab_size {Vd} is smaller than the {len(specials)} special tokens that must be kept",
            fix=f"use draft_vocab_size >= {len(specials)}",
        )
    chosen = set(specials)
    ids = torch.arange(V)
    seen = ids[counts > 0]
    # descending count, ascending id on ties: sort by id first, then a stable sort by -count
    order = torch.sort(-counts[seen], stable=True).indices
    ranked = [int(i) for i in seen[order] if int(i) not in chosen]
    picked_frequent = ranked[: Vd - len(chosen)]
    chosen.update(picked_frequent)
    filled: list[int] = []
    if len(chosen) < Vd:
        need = Vd - len(chosen)
        for i in range(V):
            if i not in chosen:
                filled.append(i)
                if len(filled) == need:
                    break
        chosen.update(filled)
    d2t = torch.tensor(sorted(chosen), dtype=torch.long)
    total = int(counts.sum())
    covered = int(counts[d2t].sum())
    stats = {
        "vocab_size": V,
        "draft_vocab_size": Vd,
        "loss_tokens": total,
        "distinct_loss_tokens": int(seen.numel()),
        "special_ids_kept": specials,
        "picked_by_frequency": len(picked_frequent),
        "filled_unseen": len(filled),
        "fill_rule": "unseen ids in ascending order" if filled else None,
        "coverage": covered / total if total else 0.0,
    }
    if filled:
        log.warning(
            "draft vocab: only %d distinct loss tokens (+%d specials) for Vd=%d; filled %d unseen ids in ascending order",
            int(seen.numel()),
            len(specials),
            Vd,
            len(filled),
        )
    return d2t, stats


def build_draft_vocab(
    dataset: TokenizedDataset,
    draft_vocab_size: int,
    *,
    vocab_size: int | None = None,
    special_ids: Sequence[int] | None = None,
) -> DraftVocab:
    """Choose Vd ids from `dataset`. V and special ids default to those recorded at build time."""
    V = vocab_size if vocab_size is not None else dataset.meta.get("tokenizer_vocab_size")
    if V is None:
        raise ConfigError("vocab_size: not recorded in the dataset index; pass the target's vocab size")
    specials = special_ids if special_ids is not None else dataset.meta.get("special_ids", [])
    counts = token_frequencies(dataset, int(V))
    d2t, stats = select_draft_vocab(counts, draft_vocab_size, specials)
    log.info(
        "draft vocab: Vd=%d of V=%d covers %.2f%% of %d loss tokens",
        stats["draft_vocab_size"],
        stats["vocab_size"],
        100 * stats["coverage"],
        stats["loss_tokens"],
    )
    return DraftVocab(d2t, stats)


def _write_vocab_files(vocab: DraftVocab, directory: Path) -> None:
    with atomic_path(directory / DRAFT_VOCAB_TENSORS) as tmp:
        save_file({"draft_to_target": vocab.draft_to_target.long().contiguous()}, str(tmp))
    atomic_write_json(directory / DRAFT_VOCAB_JSON, vocab.stats)


def save_draft_vocab(vocab: DraftVocab, directory: Path, *, force: bool = False, flag: str = "--out") -> Path:
    """Write a vocabulary directory (draft_vocab.safetensors + .json + the marker): `directory` must
    be missing, empty, or (with `force`) an earlier vocabulary, replaced whole (`outputs.fresh_output`)."""
    directory = Path(directory)
    with fresh_output(directory, OutputKind.VOCAB, force=force, flag=flag) as tmp:
        _write_vocab_files(vocab, tmp)
        write_marker(tmp, OutputKind.VOCAB, VOCAB_FILES)
    return directory / DRAFT_VOCAB_TENSORS


def check_vocab_beside_dataset(dataset_dir: Path, *, force: bool, flag: str = "--dataset") -> None:
    """May `data vocab` write the vocabulary into the dataset directory it was counted from? The
    directory must be a tokenized dataset; a vocabulary already there is replaced only with `force`.
    Writes nothing: call it before any work."""
    dataset_dir = Path(dataset_dir)
    found = recognise(dataset_dir) if dataset_dir.is_dir() else None
    if found is None or found.kind != OutputKind.DATASET:
        return  # loading the dataset names what is wrong with it
    there = [n for n in VOCAB_FILES if (dataset_dir / n).exists()]
    if there and not force:
        raise ConfigError(
            f"{flag} {dataset_dir}: already holds a draft vocabulary ({', '.join(there)})",
            fix="pass --force to replace it, or write the new one elsewhere with --out DIR",
        )


def save_vocab_beside_dataset(vocab: DraftVocab, dataset_dir: Path, *, force: bool = False) -> Path:
    """Write draft_vocab.* into the tokenized dataset directory it was counted from (each file
    atomically) and add them to the dataset's marker, so that `data build --force` replaces them
    with the data and a changed file is seen. An existing vocabulary is replaced only with `force`."""
    dataset_dir = Path(dataset_dir)
    found = recognise(dataset_dir)
    if found is None or found.kind != OutputKind.DATASET:
        raise ConfigError(
            f"{dataset_dir}: not a tokenized dataset directory", fix="write the vocabulary with --out DIR"
        )
    check_vocab_beside_dataset(dataset_dir, force=force)
    _write_vocab_files(vocab, dataset_dir)
    update_marker(dataset_dir, OutputKind.DATASET, VOCAB_FILES)
    return dataset_dir / DRAFT_VOCAB_TENSORS


def read_vocab_map(
    path: Path, *, vocab_size: int | None = None, flag: str | None = None
) -> tuple[torch.Tensor, dict[str, Any], Path]:
    """(draft_to_target [Vd] int64, stats, the file read) from `draft_vocab.safetensors` or a directory
    holding it. Checked as it is read: the file's safetensors header, the tensor, its ids within
    [0, V) (V: `vocab_size`, else the stats' `vocab_size` when recorded) and each id once; every
    error names the file (after `flag`, when it came from one) and the first bad entry."""
    path = Path(path)
    if path.is_dir():
        path = path / DRAFT_VOCAB_TENSORS
    shown = f"{flag} {path}" if flag else str(path)
    if not path.exists():
        raise DataFormatError(
            f"{shown}: no such file" if flag else f"{path}: no draft vocabulary",
            fix="create it with `eaglewire data vocab` (it writes draft_vocab.safetensors)",
        )
    t = load_tensors(path, error=DataFormatError, fix=VOCAB_FILE_FIX)
    if "draft_to_target" not in t:
        raise DataFormatError(
            f"{shown}: missing tensor 'draft_to_target' (found {sorted(t)})", fix=VOCAB_FILE_FIX
        )
    stats_path = path.with_name(DRAFT_VOCAB_JSON)
    stats = read_json_file(stats_path) if stats_path.exists() else {}
    if not isinstance(stats, dict):
        raise DataFormatError(f"{stats_path}: expected a JSON object, got {type(stats).__name__}")
    recorded = stats.get("vocab_size")
    V = vocab_size if vocab_size is not None else (recorded if isinstance(recorded, int) else None)
    d2t = t["draft_to_target"]
    check_vocab_map(d2t, V, where=shown, error=DataFormatError, fix=VOCAB_FILE_FIX)
    return d2t.long(), stats, path


def load_draft_vocab(directory: Path, *, flag: str | None = None) -> DraftVocab:
    """Read `draft_vocab.safetensors` (+ stats) from a dataset directory (or the file itself); the ids
    must also be ascending (as `eaglewire data vocab` writes them)."""
    d2t, stats, path = read_vocab_map(directory, flag=flag)
    down = (d2t[1:] <= d2t[:-1]).nonzero().flatten()
    if down.numel():
        i = int(down[0]) + 1
        raise DataFormatError(
            f"{f'{flag} ' if flag else ''}{path}: draft_to_target[{i}] = {int(d2t[i])} follows "
            f"draft_to_target[{i - 1}] = {int(d2t[i - 1])}: expected strictly ascending absolute target ids",
            fix=VOCAB_FILE_FIX,
        )
    return DraftVocab(d2t, stats)
