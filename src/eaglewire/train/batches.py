"""Planning and assembling rows from variable-length records (padding, optional packing).

A *row* is one line of a micro-batch: one record (padded) or, with packing, several records
back to back. Every token carries a `doc_id` (its record's slot within the row, -1 on padding)
and a `position` that restarts at 0 in each record, so the TTT masks never let attention or a
shifted label cross from one record into the next.

The plan for an epoch depends only on (record lengths, seed, epoch, max_length, pack, and the
repeat count source_repeats gives each record), so a resumed run rebuilds exactly the same rows and
skips to its saved position.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

from eaglewire.errors import ConfigError, DataFormatError
from eaglewire.train.config import TrainConfig

log = logging.getLogger(__name__)

R_co = TypeVar("R_co", covariant=True)


class RecordSource(Protocol[R_co]):
    """What training reads: an indexable sequence of records (a list works; so do the on-disk datasets)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> R_co: ...


@dataclass(frozen=True)
class Slot:
    """One record (or its first `length` tokens) placed in a row at `offset`."""

    record: int  # index into the RecordSource
    offset: int
    length: int


Row = tuple[Slot, ...]


def record_lengths(source: RecordSource[Any]) -> list[int]:
    """Token count of every record without reading hidden states where the dataset allows it:
    `source.lengths` (a method or a sequence, e.g. TokenizedDataset), the `offsets` tensor of each
    shard file (ShardDataset's documented layout), else each record's input_ids."""
    lengths = getattr(source, "lengths", None)
    if lengths is not None:
        values = lengths() if callable(lengths) else lengths
        out = [int(n) for n in values]
    elif hasattr(source, "shards") and hasattr(source, "directory"):
        out = _shard_lengths(source)
    else:
        out = [int(source[i].input_ids.shape[0]) for i in range(len(source))]
    if len(out) != len(source):
        raise DataFormatError(
            f"dataset length index has {len(out)} entries but the dataset has {len(source)} records"
        )
    return out


def _shard_lengths(source: Any) -> list[int]:
    from eaglewire.safetensors_io import open_tensors

    out: list[int] = []
    for info in source.shards:
        with open_tensors(Path(source.directory) / info.file, error=DataFormatError) as f:
            offsets = f.get_tensor("offsets")
        out.extend(int(n) for n in offsets[1:] - offsets[:-1])
    return out


def epoch_order(
    num_records: int, *, seed: int, epoch: int, repeats: Sequence[int] | None = None
) -> list[int]:
    """A permutation of the records, a pure function of (seed, epoch); with `repeats`, record i
    appears repeats[i] times (TrainConfig.source_repeats), all of them shuffled together."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    if repeats is None:
        return [int(i) for i in torch.randperm(num_records, generator=gen)]
    if len(repeats) != num_records:
        raise ValueError(f"epoch_order: {len(repeats)} repeat counts for {num_records} records")
    slots = [i for i, n in enumerate(repeats) for _ in range(n)]
    return [slots[int(j)] for j in torch.randperm(len(slots), generator=gen)]


def record_repeats(source: RecordSource[Any], config: TrainConfig) -> list[int] | None:
    """Per record, how many times an epoch holds it (`config.source_repeats`, by the source prefix of
    its id); None when every record is seen once. A named source no record comes from is refused:
    a misspelt name would otherwise weigh nothing."""
    by_source = config.repeats_by_source()
    if not by_source:
        return None
    ids = getattr(source, "record_ids", None)  # TokenizedDataset: a list; ShardDataset: a method
    ids = ids() if callable(ids) else ids
    if ids is None:  # a list of records
        ids = [source[i].record_id for i in range(len(source))]
    sources = [str(rid).partition(":")[0] for rid in ids]
    missing = sorted(set(by_source) - set(sources))
    if missing:
        raise ConfigError(
            f"source_repeats names {missing}, but no training record comes from them "
            f"(the sources here: {sorted(set(sources))})"
        )
    return [by_source.get(s, 1) for s in sources]


# Rows a packed plan keeps open at once. Next-fit (one open row, closed when the next record does
# not fit) filled ~83% of each 1,024-token row on the H200 quickstart's data (13.6k real tokens of
# 16 x 1,024 per step), and a step costs its padded tokens; with a few open rows each record goes
# into the first one with room, and short records fill the gaps long ones leave.
PACK_OPEN_ROWS = 8


def plan_rows(
    lengths: Sequence[int],
    order: Sequence[int],
    *,
    max_length: int,
    pack: bool,
    open_rows: int = PACK_OPEN_ROWS,
) -> list[Row]:
    """Rows from the records in `order`, each record truncated to max_length.

    Without `pack`, one record per row, in order. With `pack`, first-fit over at most `open_rows`
    open rows: a record goes into the first open row it fits in, else into a new row; when that
    would make more than `open_rows` open rows, the fullest one is closed first (the earliest
    opened of equally full ones). Rows come out in the order they close, then the still open ones
    in the order they opened. A pure function of its arguments, so a resumed run plans the same
    rows; `open_rows=1` is next-fit."""
    if open_rows < 1:
        raise ValueError(f"plan_rows: open_rows must be >= 1, got {open_rows}")
    rows: list[Row] = []
    shelf: list[tuple[list[Slot], int]] = []  # open rows, in the order they opened: (slots, tokens used)
    truncated = 0
    for idx in order:
        n = min(int(lengths[idx]), max_length)
        truncated += int(lengths[idx]) > max_length
        if n == 0:
            continue
        if not pack:
            rows.append((Slot(record=idx, offset=0, length=n),))
            continue
        k = next((k for k, (_, used) in enumerate(shelf) if used + n <= max_length), None)
        if k is None:
            if len(shelf) == open_rows:
                fullest = max(range(len(shelf)), key=lambda j: (shelf[j][1], -j))
                rows.append(tuple(shelf.pop(fullest)[0]))
            shelf.append(([], 0))
            k = len(shelf) - 1
        slots, used = shelf[k]
        slots.append(Slot(record=idx, offset=used, length=n))
        shelf[k] = (slots, used + n)
    rows.extend(tuple(slots) for slots, _ in shelf)
    if truncated:
        log.info("%d records longer than max_length=%d were truncated", truncated, max_length)
    return rows


@dataclass
class Batch:
    """Token-side tensors of one micro-batch (all [B, T])."""

    input_ids: torch.Tensor  # [B, T] int64, 0 on padding
    loss_mask: torch.Tensor  # [B, T] bool: the token at this position is a training token
    positions: torch.Tensor  # [B, T] int64, restarting at 0 in each record
    doc_ids: torch.Tensor  # [B, T] int64: slot index of the record within its row, -1 on padding
    rows: tuple[Row, ...]
    record_ids: tuple[str, ...]
    # The host-memory batch this one was copied from (`to`): masks and counts are derived from it
    # without a device->host sync. None for a batch that is itself in host memory.
    host: Batch | None = None

    @property
    def num_tokens(self) -> int:
        src = self.host if self.host is not None else self
        return int((src.doc_ids >= 0).sum())

    def to(self, device: torch.device | str) -> Batch:
        on_host = self.doc_ids.device.type == "cpu"
        host = self.host if self.host is not None else (self if on_host else None)

        def move(x: torch.Tensor) -> torch.Tensor:
            # host -> device copies need not block the host (the source is staged or pinned at once)
            return x.to(device, non_blocking=on_host)

        return Batch(
            input_ids=move(self.input_ids),
            loss_mask=move(self.loss_mask),
            positions=move(self.positions),
            doc_ids=move(self.doc_ids),
            rows=self.rows,
            record_ids=self.record_ids,
            host=host if torch.device(device).type != "cpu" else None,
        )


def row_length(rows: Sequence[Row]) -> int:
    return max(s.offset + s.length for row in rows for s in row)


def assemble(rows: Sequence[Row], records: Sequence[Any]) -> Batch:
    """Build the [B, T] token tensors; `records[i]` is the record for the i-th slot in row order."""
    B, T = len(rows), row_length(rows)
    input_ids = torch.zeros(B, T, dtype=torch.long)
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    positions = torch.zeros(B, T, dtype=torch.long)
    doc_ids = torch.full((B, T), -1, dtype=torch.long)
    ids: list[str] = []
    k = 0
    for b, row in enumerate(rows):
        for d, slot in enumerate(row):
            rec = records[k]
            k += 1
            check_record_tokens(rec)
            sl = slice(slot.offset, slot.offset + slot.length)
            input_ids[b, sl] = rec.input_ids[: slot.length]
            loss_mask[b, sl] = rec.loss_mask[: slot.length].bool()
            positions[b, sl] = torch.arange(slot.length)
            doc_ids[b, sl] = d
            ids.append(str(rec.record_id))
    return Batch(input_ids, loss_mask, positions, doc_ids, tuple(rows), tuple(ids))


def check_record_tokens(rec: Any) -> None:
    ids, mask = rec.input_ids, rec.loss_mask
    if ids.dim() != 1 or mask.shape != ids.shape:
        raise DataFormatError(
            f"record {rec.record_id}: input_ids {tuple(ids.shape)} and loss_mask {tuple(mask.shape)} "
            "must both be [T]"
        )


def slot_token_index(rows: Sequence[Row]) -> torch.Tensor:
    """[N] int64: the flat position b*T + offset + p in the [B, T] layout (T = row_length(rows)) of
    token p of every slot, slots in row order (the order of `fetch_rows`)."""
    T = row_length(rows)
    parts = [
        torch.arange(b * T + slot.offset, b * T + slot.offset + slot.length)
        for b, row in enumerate(rows)
        for slot in row
    ]
    return torch.cat(parts)


def fetch_rows(source: RecordSource[Any], rows: Sequence[Row]) -> list[Any]:
    """The records of `rows`, in slot order."""
    return [source[slot.record] for row in rows for slot in row]


def split_for_rank(
    group: Sequence[Row], *, rank: int, world_size: int, batch_size: int, accum: int
) -> list[list[Row]]:
    """The micro-batches (lists of rows) this process runs for one optimizer step.

    The group holds world_size*accum*batch_size rows. Micro-batch a of rank r gets rows
    [(a*world_size + r)*batch_size, +batch_size): one process with batch_size*world_size sees the
    same rows per micro-batch as world_size processes together. A short final group is split the
    same way; micro-batches that come out empty are dropped.
    """
    out = []
    for a in range(accum):
        start = (a * world_size + rank) * batch_size
        part = list(group[start : start + batch_size])
        if part:
            out.append(part)
    return out
