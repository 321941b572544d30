"""Hidden-state shards on disk: the format, the writer (with resume), and the reader.

A shard directory holds:

- `shard_00000.safetensors`, ...: flat tensors of `shard_records` consecutive records:
  `input_ids [N]`, `loss_mask [N] bool`, `aux [N, A*Ht]` (aux states in contract order),
  `final [N, Ht]`, `offsets [R+1]`; the shard's record ids are in the safetensors metadata
  (`record_ids`, a JSON list).
- `contract.json`: the hidden-state contract (target identity, boundaries, fingerprint).
- `manifest.json`: the contract again, the source, record/token counts, and one entry per
  completed shard (file, first record, counts, bytes, sha256), rewritten atomically when a
  capture starts and when it finishes.
- `shards.jsonl`, while a capture runs: the journal, one line (the same entry) appended per
  shard completed since the manifest was last written. Rewriting the manifest after every shard
  instead costs O(shards) each time, under the writers' lock: 40 ms at 4,000 shards, ~80 s over a
  capture of that many. `load_manifest` reads the two together, so an interrupted run resumes at
  the first shard listed in neither (a torn last line from a kill is ignored: that shard is
  written again).

Shards are streamed to disk in one pass, hashed as they are written, and written atomically
(temporary file + rename). `ShardDataset` verifies each shard's sha256 the first time it is
opened and names the shard when it does not match.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from eaglewire.contract.contract import Contract, require_same_wiring
from eaglewire.data.safetensors_stream import write_safetensors_stream
from eaglewire.data.types import CapturedRecord, ShardContent
from eaglewire.errors import DataFormatError
from eaglewire.io_utils import atomic_path, atomic_write_json, sha256_file
from eaglewire.output_marker import OutputKind
from eaglewire.outputs import claim_output_dir
from eaglewire.safetensors_io import open_tensors, read_header
from eaglewire.typed_config import read_json_file

log = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
JOURNAL_FILE = "shards.jsonl"
# Threads hashing shards at once for verify='eager' (a training run's ~100 MB shards: ~0.1 s each on one).
VERIFY_WORKERS = 8
MANIFEST_SCHEMA = 1
MANIFEST_FORMAT = "eaglewire-hidden-state-shards"
SHARD_TENSORS = ("input_ids", "loss_mask", "aux", "final", "offsets")
MANIFEST_KEYS = ("complete", "total_records", "num_records", "contract", "shards")
SHARD_FIX = "delete this shard and its manifest entry, then rerun the capture to rewrite it"
SHARD_DTYPES = {"input_ids": torch.int64, "loss_mask": torch.bool}  # aux and final: the contract's dtype


def shard_file_name(index: int) -> str:
    return f"shard_{index:05d}.safetensors"


@dataclass(frozen=True)
class ShardInfo:
    index: int
    file: str
    first_record: int
    records: int
    tokens: int
    loss_tokens: int
    bytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def write_shard(path: Path, index: int, first_record: int, content: ShardContent) -> ShardInfo:
    """Write `content` as one shard atomically; return its manifest entry.

    Each tensor's parts are streamed into the file (and its sha256) one after another, never
    joined in memory: see `safetensors_stream.write_safetensors_stream`."""
    if not content.record_ids or len(content.record_ids) != len(content.lengths):
        raise DataFormatError(
            f"shard {path}: expected one length per record, got {len(content.record_ids)} record ids and "
            f"{len(content.lengths)} lengths"
        )
    lengths = torch.tensor(content.lengths, dtype=torch.long)
    offsets = torch.zeros(len(content.lengths) + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(lengths, 0)
    N = int(offsets[-1])
    for name, parts in content.tensors().items():
        want = SHARD_DTYPES.get(name)
        bad = [str(p.dtype) for p in parts if want is not None and p.dtype != want]
        if bad:
            raise DataFormatError(
                f"shard {path}: tensor {name!r}: expected {want}, got parts of {sorted(set(bad))}"
            )
        rows = sum(int(p.shape[0]) for p in parts)
        if rows != N:
            raise DataFormatError(
                f"shard {path}: tensor {name!r} has {rows} rows, expected {N} (the records' lengths summed: "
                f"{len(content.lengths)} records)"
            )
    tensors = {**content.tensors(), "offsets": [offsets]}  # [N], [N], [N, A*Ht], [N, Ht], [R+1]
    metadata = {"record_ids": json.dumps(content.record_ids), "format": MANIFEST_FORMAT}
    with atomic_path(path) as tmp:
        size, digest = write_safetensors_stream(tmp, tensors, metadata)
    return ShardInfo(
        index=index,
        file=path.name,
        first_record=first_record,
        records=len(content.record_ids),
        tokens=N,
        loss_tokens=sum(int(m.sum()) for m in content.loss_mask),
        bytes=size,
        sha256=digest,
    )


def load_manifest(directory: Path) -> dict[str, Any]:
    path = Path(directory) / MANIFEST_FILE
    if not path.exists():
        raise DataFormatError(
            f"{directory}: no {MANIFEST_FILE}; not a shard directory", fix="run `eaglewire data capture`"
        )
    manifest = read_json_file(path)
    if not isinstance(manifest, dict):
        raise DataFormatError(f"{path}: expected a JSON object, got {type(manifest).__name__}")
    if manifest.get("format") != MANIFEST_FORMAT or manifest.get("schema_version") != MANIFEST_SCHEMA:
        raise DataFormatError(
            f"{path}: format/schema expected {MANIFEST_FORMAT}/{MANIFEST_SCHEMA}, got "
            f"{manifest.get('format')}/{manifest.get('schema_version')}"
        )
    missing = sorted(k for k in MANIFEST_KEYS if k not in manifest)
    if missing or not isinstance(manifest["shards"], list):
        raise DataFormatError(
            f"{path}: keys {missing} missing" if missing else f"{path}: 'shards' is not a list",
            fix="rerun the same `eaglewire data capture` command to rewrite it",
        )
    for n, entry in enumerate(manifest["shards"]):
        if not isinstance(entry, dict) or sorted(entry) != sorted(ShardInfo.__dataclass_fields__):
            raise DataFormatError(
                f"{path}: shards[{n}]: expected keys {sorted(ShardInfo.__dataclass_fields__)}, got "
                f"{sorted(entry) if isinstance(entry, dict) else entry!r}",
                fix="rerun the same `eaglewire data capture` command to rewrite it",
            )
    manifest = dict(manifest)
    journaled = read_journal(Path(directory) / JOURNAL_FILE)
    if journaled:  # a capture running or interrupted: its shards since the manifest was written
        by_index = {s["index"]: s for s in manifest["shards"]}
        by_index.update((s.index, s.to_json()) for s in journaled)
        shards = [by_index[i] for i in sorted(by_index)]
        manifest.update(
            shards=shards,
            num_records=sum(s["records"] for s in shards),
            num_tokens=sum(s["tokens"] for s in shards),
            num_loss_tokens=sum(s["loss_tokens"] for s in shards),
            bytes=sum(s["bytes"] for s in shards),
        )
    return manifest


def read_journal(path: Path) -> list[ShardInfo]:
    """The shard entries in a capture's journal (none if there is no journal). A last line that does
    not parse is what a kill mid-append leaves: ignored, so its shard is written again; any other
    bad line is an error naming the file and line."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    out: list[ShardInfo] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(ShardInfo(**json.loads(line)))
        except (ValueError, TypeError) as e:
            if all(not rest.strip() for rest in lines[n:]):  # the last line: torn by a kill
                log.warning("%s:%d: incomplete last entry ignored (its shard will be written again)", path, n)
                break
            raise DataFormatError(
                f"{path}:{n}: not a shard entry ({e}): {line[:120]!r}",
                fix=f"delete {path.name} and rerun the capture: shards it listed are written again",
            ) from e
    return out


class ShardWriter:
    """Writes shards, journals each one (`shards.jsonl`) and writes `manifest.json` at the start and
    at `finish`; resumes a compatible earlier run.

    `plan` identifies what is being written (dataset ids hash, shard size, source); a rerun
    with another plan or contract is refused rather than mixed into the same directory.
    """

    def __init__(
        self, directory: Path, contract: Contract, *, plan: dict[str, Any], total_records: int
    ) -> None:
        self.directory = Path(directory)
        # missing, empty, or an earlier shard directory (marker, or manifest.json from before markers)
        claim_output_dir(self.directory, OutputKind.SHARDS)
        self.contract = contract
        self.shards: dict[int, ShardInfo] = {}
        manifest_path = self.directory / MANIFEST_FILE
        if manifest_path.exists():
            old = load_manifest(self.directory)
            old_contract = Contract.from_json(old["contract"], where=str(manifest_path))
            require_same_wiring(
                old_contract, contract, names=("existing shards", "this capture"), check_dtype=True
            )
            diffs = [
                f"{k}: existing={old['plan'].get(k)!r} now={v!r}"
                for k, v in plan.items()
                if old["plan"].get(k) != v
            ]
            if diffs:
                raise DataFormatError(
                    f"{self.directory}: holds shards of another capture:\n  " + "\n  ".join(diffs),
                    fix="capture into a new --out directory, or rerun with the original settings",
                )
            for s in old["shards"]:
                info = ShardInfo(**s)
                p = self.directory / info.file
                if p.exists() and p.stat().st_size == info.bytes:
                    self.shards[info.index] = info
                else:
                    log.warning("%s: listed in the manifest but missing or resized; it will be rewritten", p)
            if self.shards:
                log.info("resuming: %d shards already complete in %s", len(self.shards), self.directory)
        self.plan = dict(plan)
        self.total_records = total_records
        self._lock = threading.Lock()  # shards may be written from several threads at once
        contract.save(self.directory)
        self._save(complete=False)

    def done(self, index: int) -> bool:
        return index in self.shards

    def write(self, index: int, first_record: int, content: ShardContent) -> ShardInfo:
        """Write one shard (safe to call from several threads: the files are independent and the
        journal append is serialised; resume keys on shard index, so completion order is free)."""
        info = write_shard(self.directory / shard_file_name(index), index, first_record, content)
        line = json.dumps(info.to_json()) + "\n"
        with self._lock:
            self.shards[index] = info
            with open(self.directory / JOURNAL_FILE, "a", encoding="utf-8") as journal:
                journal.write(line)
        return info

    def finish(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._save(complete=True, extra=extra)

    def _save(self, *, complete: bool, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        shards = [self.shards[i] for i in sorted(self.shards)]
        manifest = {
            "format": MANIFEST_FORMAT,
            "schema_version": MANIFEST_SCHEMA,
            "complete": complete,
            "plan": self.plan,
            "total_records": self.total_records,
            "num_records": sum(s.records for s in shards),
            "num_tokens": sum(s.tokens for s in shards),
            "num_loss_tokens": sum(s.loss_tokens for s in shards),
            "bytes": sum(s.bytes for s in shards),
            **(extra or {}),
            "contract": self.contract.to_json(),
            "shards": [s.to_json() for s in shards],
        }
        atomic_write_json(self.directory / MANIFEST_FILE, manifest)
        # every journaled shard is in the manifest now (a kill before this line leaves duplicates,
        # which load_manifest merges by index)
        (self.directory / JOURNAL_FILE).unlink(missing_ok=True)
        return manifest


class ShardDataset:
    """Captured records read back from a shard directory, as `CapturedRecord`s.

    verify='lazy' checks a shard's sha256 the first time one of its records is read; 'eager'
    checks every shard now, `verify_workers` at a time (hashlib releases the GIL, so threads hash
    in parallel); 'none' skips it. An incomplete capture is refused unless `allow_incomplete`.
    """

    def __init__(
        self,
        directory: Path,
        *,
        verify: Literal["lazy", "eager", "none"] = "lazy",
        allow_incomplete: bool = False,
        verify_workers: int = VERIFY_WORKERS,
    ) -> None:
        self.directory = Path(directory)
        self.manifest = load_manifest(self.directory)
        if not self.manifest["complete"] and not allow_incomplete:
            raise DataFormatError(
                f"{self.directory}: capture incomplete ({self.manifest['num_records']} of "
                f"{self.manifest['total_records']} records)",
                fix="rerun the same `eaglewire data capture` command to resume it",
            )
        self.contract = Contract.from_json(
            self.manifest["contract"], where=str(self.directory / MANIFEST_FILE)
        )
        self.shards = [ShardInfo(**s) for s in self.manifest["shards"]]
        self._starts = []
        n = 0
        for s in self.shards:
            self._starts.append(n)
            n += s.records
        self._len = n
        self.verify = verify
        self._verified: set[int] = set()
        self._open: dict[int, tuple[Any, torch.Tensor, list[str]]] = {}
        if verify == "eager":
            with ThreadPoolExecutor(max_workers=max(1, verify_workers)) as pool:
                list(pool.map(self.verify_shard, range(len(self.shards))))  # the first bad shard raises

    def __len__(self) -> int:
        return self._len

    def verify_shard(self, k: int) -> None:
        info = self.shards[k]
        path = self.directory / info.file
        if not path.exists():
            raise DataFormatError(f"shard {path}: missing (listed in {MANIFEST_FILE})")
        size = path.stat().st_size
        if size != info.bytes:
            read_header(path, error=DataFormatError, fix=SHARD_FIX)  # a cut file: names the tensor it cuts
            raise DataFormatError(
                f"shard {path}: size: expected {info.bytes} bytes (manifest), got {size}; the file was cut short "
                "or replaced after capture",
                fix=SHARD_FIX,
            )
        actual = sha256_file(path)
        if actual != info.sha256:
            raise DataFormatError(
                f"shard {path}: sha256 mismatch: expected {info.sha256} (manifest), got {actual}; the file is "
                "corrupt or was changed after capture",
                fix="delete this shard and its manifest entry, then rerun the capture to rewrite it",
            )
        self._verified.add(k)

    def _shard(self, k: int) -> tuple[Any, torch.Tensor, list[str]]:
        if k not in self._open:
            if self.verify != "none" and k not in self._verified:
                self.verify_shard(k)
            path = self.directory / self.shards[k].file
            handle = open_tensors(path, error=DataFormatError, fix=SHARD_FIX)
            missing = sorted(set(SHARD_TENSORS) - set(handle.keys()))
            if missing:
                raise DataFormatError(f"shard {path}: missing tensors {missing}", fix=SHARD_FIX)
            try:
                ids = json.loads((handle.metadata() or {}).get("record_ids", "[]"))
            except json.JSONDecodeError as e:
                raise DataFormatError(
                    f"shard {path}: metadata 'record_ids' is not valid JSON ({e})", fix=SHARD_FIX
                ) from None
            self._open[k] = (handle, handle.get_tensor("offsets"), ids)
        return self._open[k]

    def locate(self, i: int) -> tuple[int, int]:
        if not 0 <= i < self._len:
            raise IndexError(f"record {i} out of range 0..{self._len - 1}")
        k = bisect.bisect_right(self._starts, i) - 1
        return k, i - self._starts[k]

    def __getitem__(self, i: int) -> CapturedRecord:
        k, j = self.locate(i)
        handle, offsets, ids = self._shard(k)
        s, e = int(offsets[j]), int(offsets[j + 1])
        return CapturedRecord(
            record_id=ids[j],
            input_ids=handle.get_slice("input_ids")[s:e].long(),
            loss_mask=handle.get_slice("loss_mask")[s:e].bool(),
            aux=handle.get_slice("aux")[s:e],
            final=handle.get_slice("final")[s:e],
        )

    def record_ids(self) -> list[str]:
        out: list[str] = []
        for k in range(len(self.shards)):
            out.extend(self._shard(k)[2])
        return out
