"""A tokenized dataset on disk: one safetensors file of flat tensors + a JSON index.

Layout of a dataset directory:

- `tokens.safetensors`: `input_ids [N] int32|int64`, `loss_mask [N] bool`, `offsets [R+1] int64`
  (record r spans `offsets[r]:offsets[r+1]` of the flat tensors).
- `index.json`: `record_ids` (R strings, in order), `split` ('train' | 'eval'), build `stats`,
  and the tokenizer's identity (`tokenizer_hash`, `chat_template_hash`, `vocab_size`,
  `special_ids`) so later stages can check they use the same tokenizer.

Loading never unpickles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from eaglewire.data.types import TokenizedRecord
from eaglewire.errors import DataFormatError
from eaglewire.io_utils import atomic_path, atomic_write_json
from eaglewire.safetensors_io import load_tensors
from eaglewire.typed_config import read_json_file

TOKENS_FILE = "tokens.safetensors"
INDEX_FILE = "index.json"
INDEX_SCHEMA = 1
INT32_MAX = 2**31 - 1
_DERIVED_KEYS = ("num_records", "num_tokens", "num_loss_tokens")


@dataclass
class TokenizedDataset:
    record_ids: list[str]
    input_ids: torch.Tensor  # [N] flat
    loss_mask: torch.Tensor  # [N] bool flat
    offsets: torch.Tensor  # [R+1] int64
    meta: dict[str, Any] = field(default_factory=dict)  # split, stats, tokenizer identity

    def __post_init__(self) -> None:
        R = len(self.record_ids)
        if self.offsets.shape != (R + 1,):
            raise DataFormatError(
                f"offsets: expected shape ({R + 1},) for {R} records, got {tuple(self.offsets.shape)}"
            )
        n = int(self.offsets[-1]) if R else 0
        if self.input_ids.shape != (n,) or self.loss_mask.shape != (n,):
            raise DataFormatError(
                f"input_ids/loss_mask: expected shape ({n},) from offsets, got "
                f"{tuple(self.input_ids.shape)} / {tuple(self.loss_mask.shape)}"
            )
        if len(set(self.record_ids)) != R:
            raise DataFormatError("record_ids: duplicated ids in the index")

    # --- construction ---
    @classmethod
    def from_records(
        cls, records: list[TokenizedRecord], meta: dict[str, Any] | None = None
    ) -> TokenizedDataset:
        lengths = [int(r.input_ids.numel()) for r in records]
        offsets = torch.zeros(len(records) + 1, dtype=torch.long)
        if records:
            offsets[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.long), 0)
        ids = (
            torch.cat([r.input_ids.long() for r in records]) if records else torch.zeros(0, dtype=torch.long)
        )
        mask = (
            torch.cat([r.loss_mask.bool() for r in records]) if records else torch.zeros(0, dtype=torch.bool)
        )
        return cls([r.record_id for r in records], ids, mask, offsets, dict(meta or {}))

    # --- access ---
    def __len__(self) -> int:
        return len(self.record_ids)

    def __getitem__(self, i: int) -> TokenizedRecord:
        if not -len(self) <= i < len(self):
            raise IndexError(f"record {i} out of range 0..{len(self) - 1}")
        i = i % len(self)
        s, e = int(self.offsets[i]), int(self.offsets[i + 1])
        return TokenizedRecord(self.record_ids[i], self.input_ids[s:e].long(), self.loss_mask[s:e].bool())

    def index_of(self, record_id: str) -> int:
        try:
            return self.record_ids.index(record_id)
        except ValueError:
            raise KeyError(f"record id {record_id!r} not in this dataset") from None

    def lengths(self) -> torch.Tensor:
        """[R] tokens per record."""
        return self.offsets[1:] - self.offsets[:-1]

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())

    # --- disk ---
    def save(self, directory: Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        small = self.num_tokens == 0 or int(self.input_ids.max()) <= INT32_MAX
        tensors = {
            "input_ids": self.input_ids.to(torch.int32 if small else torch.int64).contiguous(),
            "loss_mask": self.loss_mask.bool().contiguous(),
            "offsets": self.offsets.long().contiguous(),
        }
        with atomic_path(directory / TOKENS_FILE) as tmp:
            save_file(tensors, str(tmp))
        index = {
            "schema_version": INDEX_SCHEMA,
            **{k: v for k, v in self.meta.items() if k not in _DERIVED_KEYS},
            "num_records": len(self),
            "num_tokens": self.num_tokens,
            "num_loss_tokens": self.num_loss_tokens,
            "record_ids": list(self.record_ids),
        }
        atomic_write_json(directory / INDEX_FILE, index)
        return directory

    @classmethod
    def load(cls, directory: Path) -> TokenizedDataset:
        directory = Path(directory)
        tokens, index_path = directory / TOKENS_FILE, directory / INDEX_FILE
        for p in (tokens, index_path):
            if not p.exists():
                raise DataFormatError(
                    f"{directory}: not a tokenized dataset ({p.name} missing)",
                    fix="create it with `eaglewire data build`",
                )
        index = read_json_file(index_path)
        if index.get("schema_version") != INDEX_SCHEMA:
            raise DataFormatError(
                f"{index_path}: schema_version expected {INDEX_SCHEMA}, got {index.get('schema_version')}"
            )
        t = load_tensors(tokens, error=DataFormatError, fix="rebuild the dataset with `eaglewire data build`")
        missing = sorted({"input_ids", "loss_mask", "offsets"} - set(t))
        if missing:
            raise DataFormatError(f"{tokens}: missing tensors {missing}")
        meta = {k: v for k, v in index.items() if k not in (*_DERIVED_KEYS, "record_ids", "schema_version")}
        try:
            return cls(
                list(index["record_ids"]), t["input_ids"], t["loss_mask"].bool(), t["offsets"].long(), meta
            )
        except DataFormatError as e:
            raise DataFormatError(f"{directory}: {e}") from None
