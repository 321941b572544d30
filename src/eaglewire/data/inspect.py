"""Look at one record: its tokens, loss mask, and (for captured shards) per-boundary norms.

Works on a tokenized dataset directory or a shard directory (`data.kind` tells which).
Norms are the L2 norm of each token's vector at each stored boundary; a boundary whose norms
look like another's (or like the embedding's, which are small and flat) is the quickest sign
of a mislabelled capture.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from eaglewire.contract.numbering import describe_boundary
from eaglewire.data.kind import data_dir_kind
from eaglewire.data.records import TokenizedDataset
from eaglewire.data.shards import ShardDataset
from eaglewire.errors import DataFormatError

log = logging.getLogger(__name__)


def _pick(ids: list[str], index: int | None, record_id: str | None, where: Path) -> int:
    if record_id is not None:
        if record_id not in ids:
            raise DataFormatError(f"{where}: no record with id {record_id!r}")
        return ids.index(record_id)
    i = 0 if index is None else index
    if not 0 <= i < len(ids):
        raise DataFormatError(f"{where}: record index {i} out of range 0..{len(ids) - 1}")
    return i


def recorded_tokenizer_path(path: Path) -> str | None:
    """The tokenizer/target path recorded when the data was made, if it is a directory here."""
    path = Path(path)
    try:
        kind = data_dir_kind(path)
    except DataFormatError:
        return None  # inspect_record says what is wrong with it
    if kind == "shards":
        name = ShardDataset(path, verify="none", allow_incomplete=True).contract.target.name
    else:
        name = str(TokenizedDataset.load(path).meta.get("tokenizer", ""))
    return name if name and Path(name).is_dir() else None


def _stats(x: torch.Tensor) -> dict[str, float]:
    return {"mean": float(x.mean()), "min": float(x.min()), "max": float(x.max())}


def inspect_record(
    path: Path, *, index: int | None = None, record_id: str | None = None, tokenizer: Any = None
) -> dict[str, Any]:
    """A JSON-able description of one record (see module docstring)."""
    path = Path(path)
    norms: list[torch.Tensor] = []
    labels: list[str] = []
    if data_dir_kind(path) == "shards":
        shards = ShardDataset(path, allow_incomplete=True)
        i = _pick(shards.record_ids(), index, record_id, path)
        rec = shards[i]
        contract = shards.contract
        L, Ht = contract.target.num_layers, contract.target.hidden_size
        for a, b in enumerate(contract.aux_boundaries):
            labels.append(f"aux[{a}] b{b} ({describe_boundary(b, L)})")
            norms.append(rec.aux[:, a * Ht : (a + 1) * Ht].float().norm(dim=-1))  # [T]
        fb = contract.final
        labels.append(f"final b{fb.boundary} {fb.norm}-norm")
        norms.append(rec.final.float().norm(dim=-1))
        ids, mask, rid, kind = rec.input_ids, rec.loss_mask, rec.record_id, "shards"
    else:
        ds = TokenizedDataset.load(path)
        i = _pick(ds.record_ids, index, record_id, path)
        r = ds[i]
        ids, mask, rid, kind = r.input_ids, r.loss_mask, r.record_id, "tokens"
    pieces = [tokenizer.decode([int(t)]) for t in ids] if tokenizer is not None else [None] * len(ids)
    tokens = []
    for pos, (tid, piece, m) in enumerate(zip(ids.tolist(), pieces, mask.tolist(), strict=True)):
        row: dict[str, Any] = {"pos": pos, "id": tid, "text": piece, "loss": bool(m)}
        if norms:
            row["norms"] = [round(float(n[pos]), 4) for n in norms]
        tokens.append(row)
    out: dict[str, Any] = {
        "path": str(path),
        "kind": kind,
        "index": i,
        "record_id": rid,
        "num_tokens": len(tokens),
        "loss_tokens": int(mask.sum()),
        "boundaries": labels,
        "norm_summary": {lab: _stats(n) for lab, n in zip(labels, norms, strict=True)},
        "tokens": tokens,
    }
    if tokenizer is not None:
        out["loss_text"] = tokenizer.decode(ids[mask].tolist())
    return out
