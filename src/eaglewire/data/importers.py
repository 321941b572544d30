"""Import hidden states captured by distributed engines into eaglewire shards (with our manifest).

For targets that need many GPUs: capture with vLLM (speculators) or SGLang (SpecForge), train
here. The user states the engine and the layer ids they captured with; the ids are converted
to boundaries by `eaglewire.contract.numbering.to_boundaries`, never by arithmetic here.

Source layouts (read from their code; re-check when a version changes):

- speculators / vLLM `extract_hidden_states` (speculators `scripts/data_generation_offline.py`,
  `src/speculators/train/data.py`): one file per sample, `hs_<i>.safetensors`, with
  `token_ids [T]` and `hidden_states [T, n, Ht]`; slots are the layer ids in launch order
  (`--target-layer-ids`), the last slot being the final layer (`--include-last-layer`,
  default) which speculators trains on as the verifier's last hidden state. Ids are vLLM ids
  (= boundaries; L = last layer output, pre-norm). The loss mask is not in these files (it
  lives in the preprocessed dataset): pass `masks` (our tokenized dataset, or JSONL rows with
  `input_ids` and `loss_mask`, row i <-> hs_i), or `all_tokens_loss=True`.
- SpecForge offline (`scripts/prepare_hidden_states.py`, eagle3 `OfflineCaptureLayout`):
  `rows_<a>-<b>/data_<i>.ckpt` holding `input_ids [T]`, `loss_mask [T]`,
  `aux_hidden_state [1, T, A*Ht]` (aux layers in id order) and `hidden_state [1, T, Ht]`, the
  last layer's output AFTER the final norm (SGLang's logits-processor input; SpecForge's
  target head applies only lm_head to it). Ids are SpecForge ids (output of layer i).

Only safetensors is read. SpecForge writes `torch.save` pickles (`.ckpt`, `.ckpt.gz`); loading
a pickle can execute code, so they are refused with the conversion to run where the files
were made (`convert_command`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from eaglewire.contract.contract import Contract, FinalState, TargetIdentity
from eaglewire.contract.fingerprint import Fingerprint, StateKey, fingerprint_tensor, match_fingerprint
from eaglewire.contract.numbering import Numbering, to_boundaries
from eaglewire.data.batching import DEFAULT_SHARD_RECORDS
from eaglewire.data.records import TokenizedDataset
from eaglewire.data.shards import ShardWriter
from eaglewire.data.types import CapturedRecord, ShardContent
from eaglewire.errors import ConfigError, DataFormatError, FingerprintMismatchError
from eaglewire.io_utils import sha256_text
from eaglewire.safetensors_io import open_tensors
from eaglewire.target.capture import capture_all
from eaglewire.target.identity import chat_template_hash, compute_fingerprint, config_hash, tokenizer_hash
from eaglewire.target.loading import LoadedTarget, check_target_dir

log = logging.getLogger(__name__)

Engine = Literal["speculators", "specforge"]
ENGINES: dict[str, Numbering] = {"speculators": Numbering.SPECULATORS, "specforge": Numbering.SPECFORGE}
PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".ckpt.gz", ".pkl")
_INDEX = re.compile(r"(\d+)$")
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def convert_command(engine: str) -> str:
    keys = (
        "token_ids, hidden_states"
        if engine == "speculators"
        else "input_ids, loss_mask, aux_hidden_state, hidden_state"
    )
    return (
        'in the environment that wrote the files (you trust them there), convert each one: python -c "import sys, '
        "torch, gzip; from safetensors.torch import save_file; p = sys.argv[1]; f = gzip.open(p) if p.endswith('.gz') "
        "else open(p, 'rb'); d = torch.load(f, weights_only=True); save_file({k: v.contiguous() for k, v in d.items()}, "
        f"p.split('.ckpt')[0].split('.pt')[0] + '.safetensors')\" FILE   (keys: {keys})"
    )


def _file_index(path: Path) -> int:
    stem = path.name.split(".")[0]
    m = _INDEX.search(stem)
    if not m:
        raise DataFormatError(
            f"{path}: cannot read a sample index from the file name (expected hs_<i> / data_<i>)"
        )
    return int(m.group(1))


def find_source_files(engine: str, source: Path) -> list[Path]:
    """The source's per-sample safetensors files in sample order; pickles are refused."""
    source = Path(source)
    if not source.is_dir():
        raise DataFormatError(f"{source}: not a directory of captured hidden states")
    if engine == "speculators":
        base = source / "hidden_states" if (source / "hidden_states").is_dir() else source
        files, pickles = (
            list(base.glob("hs_*.safetensors")),
            [p for s in PICKLE_SUFFIXES for p in base.glob(f"hs_*{s}")],
        )
    else:
        files = list(source.rglob("data_*.safetensors"))
        pickles = [p for s in PICKLE_SUFFIXES for p in source.rglob(f"data_*{s}")]
    if pickles:
        raise DataFormatError(
            f"{source}: {len(pickles)} pickled files (e.g. {pickles[0].name}); eaglewire reads safetensors only, "
            "because unpickling a file can run arbitrary code",
            fix=convert_command(engine),
        )
    if not files:
        pattern = "hs_<i>.safetensors" if engine == "speculators" else "rows_*/data_<i>.safetensors"
        raise DataFormatError(f"{source}: no {pattern} files for engine {engine!r}")
    return sorted(files, key=_file_index)


def identity_from_dir(target_dir: Path) -> TargetIdentity:
    """TargetIdentity from a model directory's config and tokenizer, without loading weights."""
    from transformers import AutoConfig, AutoTokenizer

    target_dir = Path(target_dir)
    check_target_dir(target_dir)
    config = AutoConfig.from_pretrained(target_dir)
    tok = AutoTokenizer.from_pretrained(target_dir)
    return TargetIdentity(
        architecture=str((config.architectures or ["unknown"])[0]),
        num_layers=int(config.num_hidden_layers),
        hidden_size=int(config.hidden_size),
        vocab_size=int(config.vocab_size),
        config_hash=config_hash(config),
        tokenizer_hash=tokenizer_hash(tok),
        chat_template_hash=chat_template_hash(tok),
        name=str(target_dir),
    )


@dataclass(frozen=True)
class ImportLayout:
    aux_boundaries: tuple[int, ...]
    final: FinalState


def resolve_layout(
    engine: str, layer_ids: Sequence[int] | None, num_layers: int, slots: int | None
) -> ImportLayout:
    """Boundaries of the stored states. speculators: `slots` = n states per token in the files."""
    if engine not in ENGINES:
        raise ConfigError(f"engine: expected one of {sorted(ENGINES)}, got {engine!r}")
    numbering = ENGINES[engine]
    if engine == "specforge":
        aux = to_boundaries(layer_ids, numbering, num_layers)
        return ImportLayout(aux, FinalState(boundary=num_layers, norm="post"))
    assert slots is not None
    if layer_ids is None:
        aux = to_boundaries(None, numbering, num_layers)
        final_b = num_layers
    elif len(layer_ids) == slots:
        aux = to_boundaries(layer_ids[:-1], numbering, num_layers)
        final_b = to_boundaries(layer_ids[-1:], numbering, num_layers)[0]
    elif len(layer_ids) == slots - 1:  # aux ids only; the final layer was appended (--include-last-layer)
        aux = to_boundaries(layer_ids, numbering, num_layers)
        final_b = num_layers
    else:
        raise ConfigError(
            f"--layer-ids {list(layer_ids)}: the files hold {slots} states per token; give all {slots} ids in "
            f"launch order (aux ids then the last layer) or the {slots - 1} aux ids"
        )
    if len(aux) + 1 != slots:
        raise ConfigError(
            f"the files hold {slots} states per token but the layout has {len(aux)} aux + 1 final"
        )
    return ImportLayout(aux, FinalState(boundary=final_b, norm="pre"))


def _tensors(path: Path, keys: Sequence[str]) -> dict[str, torch.Tensor]:
    with open_tensors(path, error=DataFormatError) as f:
        have = set(f.keys())
        missing = [k for k in keys if k not in have]
        if missing:
            raise DataFormatError(f"{path}: missing tensors {missing} (found {sorted(have)})")
        return {k: f.get_tensor(k) for k in keys}


def _mask_source(masks: Path | None) -> Iterator[tuple[str | None, torch.Tensor, torch.Tensor]] | None:
    """Yields (record id or None, input_ids, loss_mask) per sample, in order."""
    if masks is None:
        return None
    masks = Path(masks)
    if masks.is_dir():
        ds = TokenizedDataset.load(masks)
        return ((r.record_id, r.input_ids, r.loss_mask) for r in (ds[i] for i in range(len(ds))))

    if not masks.is_file():
        raise DataFormatError(f"--masks {masks}: no such file or directory")

    def rows() -> Iterator[tuple[str | None, torch.Tensor, torch.Tensor]]:
        # utf-8-sig: a byte-order mark opening the file is not part of the first row
        with open(masks, encoding="utf-8-sig") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    yield (
                        str(row["id"]) if "id" in row else None,
                        torch.tensor(row["input_ids"], dtype=torch.long),
                        torch.tensor(row["loss_mask"], dtype=torch.long).bool(),
                    )
                except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                    raise DataFormatError(
                        f"{masks}:{lineno}: expected a row with input_ids and loss_mask ({e})"
                    ) from None

    return rows()


def read_records(
    engine: str, files: list[Path], layout: ImportLayout, masks: Path | None, all_tokens_loss: bool
) -> Iterator[CapturedRecord]:
    """Our records from the source files, in sample order."""
    mask_iter = _mask_source(masks)
    if engine == "speculators" and mask_iter is None and not all_tokens_loss:
        raise ConfigError(
            "speculators hidden-state files carry no loss mask",
            fix="pass --masks (the tokenized dataset or JSONL rows with input_ids and loss_mask, row i = hs_i), "
            "or --all-tokens-loss to train on every token",
        )
    for path in files:
        idx = _file_index(path)
        if engine == "speculators":
            t = _tensors(path, ("token_ids", "hidden_states"))
            ids, hs = t["token_ids"].long(), t["hidden_states"]  # [T], [T, n, Ht]
            if hs.ndim != 3 or hs.shape[0] != ids.numel() or hs.shape[1] != len(layout.aux_boundaries) + 1:
                raise DataFormatError(
                    f"{path}: hidden_states expected [T={ids.numel()}, {len(layout.aux_boundaries) + 1}, Ht], "
                    f"got {list(hs.shape)}"
                )
            aux = hs[:, :-1].reshape(hs.shape[0], -1)  # [T, A*Ht] slots in id order
            final = hs[:, -1]  # [T, Ht]
            loss = torch.ones_like(ids, dtype=torch.bool)
            rid = f"speculators:hs_{idx}"
        else:
            t = _tensors(path, ("input_ids", "loss_mask", "aux_hidden_state", "hidden_state"))
            ids, loss = t["input_ids"].reshape(-1).long(), t["loss_mask"].reshape(-1).bool()
            aux = t["aux_hidden_state"].reshape(ids.numel(), -1)  # [1, T, A*Ht] -> [T, A*Ht]
            final = t["hidden_state"].reshape(ids.numel(), -1)  # [1, T, Ht] -> [T, Ht]
            rid = f"specforge:data_{idx}"
        if mask_iter is not None:
            try:
                mid, mids, mmask = next(mask_iter)
            except StopIteration:
                raise DataFormatError(
                    f"{masks}: fewer mask rows than hidden-state files (none for {path.name})"
                ) from None
            if not torch.equal(mids, ids):
                raise DataFormatError(
                    f"{path}: token ids differ from mask row {mid or idx} ({mids.numel()} vs {ids.numel()} tokens); "
                    "the masks are not in the same order as the hidden-state files"
                )
            loss, rid = mmask, (mid or rid)
        yield CapturedRecord(rid, ids, loss, aux, final)


def verify_by_values(record: CapturedRecord, layout: ImportLayout, target: LoadedTarget) -> None:
    """Recompute every boundary on one imported record; fail if a stored state is another boundary."""
    Ht = record.final.shape[-1]
    entries = [
        fingerprint_tensor(f"aux[{i}]", StateKey(b), record.aux[:, i * Ht : (i + 1) * Ht])
        for i, b in enumerate(layout.aux_boundaries)
    ]
    entries.append(
        fingerprint_tensor("final", StateKey(layout.final.boundary, layout.final.norm), record.final)
    )
    fp = Fingerprint(
        probe_ids=tuple(record.input_ids.tolist()),
        dtype=DTYPE_NAMES.get(record.aux.dtype, "bfloat16"),
        tensors=tuple(entries),
    )
    states = {k: v[0] for k, v in capture_all(target.model, record.input_ids[None].to(target.device)).items()}
    bad = [m for m in match_fingerprint(fp, states) if not m.ok]
    if bad:
        raise FingerprintMismatchError(
            f"imported record {record.record_id}: stored states are not the boundaries the stated ids give:\n  "
            + "\n  ".join(m.explain() for m in bad),
            fix="pass the layer ids the engine was launched with, in its own numbering (see `eaglewire ids`)",
        )


@dataclass
class ImportStats:
    records: int = 0
    tokens: int = 0
    shards: int = 0


def import_hidden_states(
    engine: str,
    source: Path,
    output: Path,
    *,
    target_dir: Path,
    layer_ids: Sequence[int] | None = None,
    masks: Path | None = None,
    all_tokens_loss: bool = False,
    shard_records: int = DEFAULT_SHARD_RECORDS,
    verify_target: LoadedTarget | None = None,
) -> ImportStats:
    """Convert `source` (engine layout) into eaglewire shards under `output`; writes manifest + contract."""
    if engine not in ENGINES:
        raise ConfigError(f"engine: expected one of {sorted(ENGINES)}, got {engine!r}")
    identity = identity_from_dir(target_dir)
    files = find_source_files(engine, source)
    slots = None
    if engine == "speculators":
        with open_tensors(files[0], error=DataFormatError) as f:
            names = set(f.keys())
            if "hidden_states" not in names:
                raise DataFormatError(f"{files[0]}: missing tensor 'hidden_states' (found {sorted(names)})")
            shape = f.get_slice("hidden_states").get_shape()
        if len(shape) != 3:
            raise DataFormatError(f"{files[0]}: hidden_states expected [T, n, Ht], got {shape}")
        slots = int(shape[1])
    layout = resolve_layout(engine, layer_ids, identity.num_layers, slots)
    records = read_records(engine, files, layout, masks, all_tokens_loss)
    stats = ImportStats()
    writer: ShardWriter | None = None
    buf: list[CapturedRecord] = []
    first = 0
    plan = {
        "imported_from": engine,
        "source": str(Path(source).resolve()),
        "layer_ids": None if layer_ids is None else list(layer_ids),
        "files_sha256": sha256_text("\n".join(p.name for p in files)),
        "shard_records": shard_records,
        "records": len(files),
    }
    for rec in records:
        if writer is None:
            dtype = DTYPE_NAMES.get(rec.aux.dtype)
            if dtype is None or rec.final.shape[-1] != identity.hidden_size:
                raise DataFormatError(
                    f"{files[0]}: states dtype {rec.aux.dtype} / width {rec.final.shape[-1]}: expected float32/bfloat16/"
                    f"float16 and Ht={identity.hidden_size} (target {target_dir})"
                )
            fingerprint = None
            if verify_target is not None:
                verify_by_values(rec, layout, verify_target)
                fingerprint = compute_fingerprint(verify_target, layout.aux_boundaries, layout.final)
            contract = Contract(
                target=identity,
                aux_boundaries=layout.aux_boundaries,
                final=layout.final,
                dtype=dtype,
                fingerprint=fingerprint,
            )
            writer = ShardWriter(output, contract, plan=plan, total_records=len(files))
        buf.append(rec)
        if len(buf) == shard_records:
            k = first // shard_records
            if not writer.done(k):
                writer.write(k, first, ShardContent.from_records(buf))
            first += len(buf)
            stats.shards += 1
            buf = []
        stats.records += 1
        stats.tokens += int(rec.input_ids.numel())
    if writer is None:
        raise DataFormatError(f"{source}: no records")
    if buf:
        k = first // shard_records
        if not writer.done(k):
            writer.write(k, first, ShardContent.from_records(buf))
        stats.shards += 1
    writer.finish({"import_stats": stats.__dict__, "verified_by_values": verify_target is not None})
    log.info(
        "imported %d records (%d tokens) from %s (%s) into %d shards; aux boundaries %s, final boundary %d %s-norm",
        stats.records,
        stats.tokens,
        source,
        engine,
        stats.shards,
        list(layout.aux_boundaries),
        layout.final.boundary,
        layout.final.norm,
    )
    return stats
