"""Where the draft's inputs and labels come from: the live target (online) or stored states (offline).

Online: the target runs inside the loop on tokenized records (`TokenizedRecord`), in one forward
over the packed rows: an additive [B, 1, T, T] mask lets each token attend only to the earlier
tokens of its own record, at its position within the record, so every state equals that of the
record run alone. An H200 profile (benchmarks/train_profile.py) found a training step bound by
the host's kernel launches; running the records in length groups took several eager target
forwards of ~30 layers each per micro-batch, where this takes one.

Offline: captured records (`CapturedRecord`) carry aux and final states; the target's logits are
recomputed from `final` with only the target's final norm (when `final` is pre-norm) and
lm_head, loaded alone from the target's safetensors.

Both produce `TrainInputs`: the token tensors, aux [B, T, A*Ht] and the target distribution
restricted to the draft vocabulary [B, T, Vd].
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from eaglewire.contract.contract import Contract, FinalState, contract_diff
from eaglewire.errors import ConfigError, ContractMismatchError, DataFormatError, TargetFilesError
from eaglewire.nn.rmsnorm import RMSNorm
from eaglewire.target.architectures import sliding_window_of, target_parts
from eaglewire.target.capture import capture
from eaglewire.target.identity import check_fingerprint, target_identity
from eaglewire.target.loading import LoadedTarget, dtype_name, resolve_target_path
from eaglewire.train.batches import Batch, Row, assemble, row_length, slot_token_index
from eaglewire.train.loss import TargetDistribution, restrict_target_logits, target_to_draft
from eaglewire.train.ttt import prefix_mask

log = logging.getLogger(__name__)


@dataclass
class TrainInputs:
    batch: Batch  # token tensors [B, T], on the device
    aux: torch.Tensor  # [B, T, A*Ht] float32
    target: TargetDistribution  # [B, T, Vd]


def check_data_contract(draft_contract: Contract, data_contract: Contract) -> None:
    """Stop before step 1 when the data's hidden states are not the ones the draft is wired for."""
    diffs = contract_diff(draft_contract, data_contract, names=("draft", "data"))
    if diffs:
        both = [
            "draft contract:",
            *(f"    {x}" for x in draft_contract.describe()),
            "data contract:",
            *(f"    {x}" for x in data_contract.describe()),
        ]
        raise ContractMismatchError(
            "the training data does not carry the hidden states the draft is wired for:\n  "
            + "\n  ".join(diffs)
            + "\n  "
            + "\n  ".join(both),
            fix="capture the data from the same target with the draft's aux boundaries, or init the draft from the data's contract",
        )


def check_dataset_identity(data: Any, contract: Contract, *, name: str = "data") -> None:
    """A tokenized dataset records its tokenizer's identity (index.json); it must be the target's."""
    meta = getattr(data, "meta", None)
    if not isinstance(meta, dict):
        return
    ours = contract.target.tokenizer_hash
    if "tokenizer_hash" in meta and meta["tokenizer_hash"] != ours:
        raise ContractMismatchError(
            f"{name}: tokenized with another tokenizer: tokenizer_hash data={meta['tokenizer_hash']} "
            f"draft contract={ours} (target {contract.target.name or contract.target.architecture})",
            fix="rebuild the dataset with `eaglewire data build --target` set to this draft's target",
        )
    if "chat_template_hash" in meta and meta["chat_template_hash"] != contract.target.chat_template_hash:
        log.warning("%s: built with a chat template other than the target's own (an override?)", name)


class TargetSide(Protocol):
    """Turns the records of some rows into TrainInputs."""

    @property
    def data_contract(self) -> Contract: ...

    def verify(self, draft_contract: Contract) -> None:
        """Value-level checks beyond the contract comparison (e.g. the fingerprint)."""
        ...

    def prepare(self, rows: Sequence[Row], records: Sequence[Any], device: torch.device) -> TrainInputs: ...


# Token rows per offline lm_head call (float32 [rows, V] logits: 1.6 GB at V = 49152).
HEAD_CHUNK_TOKENS = 8192


def _to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """x on `device`; copies from host memory do not block the host (device->host ones must)."""
    return x.to(device, non_blocking=x.device.type == "cpu")


class _Placed:
    """The micro-batch's [B*T, ...] label and aux tensors, filled per token by flat index."""

    def __init__(self, rows: Sequence[Row], vocab: int, aux_width: int, device: torch.device) -> None:
        self.B, self.T = len(rows), row_length(rows)
        n = self.B * self.T
        self.probs = torch.zeros(n, vocab, dtype=torch.float32, device=device)
        self.token = torch.zeros(n, dtype=torch.long, device=device)
        self.in_vocab = torch.zeros(n, dtype=torch.bool, device=device)
        self.aux = torch.zeros(n, aux_width, dtype=torch.float32, device=device)

    def put(self, dst: torch.Tensor, dist: TargetDistribution, aux: torch.Tensor) -> None:
        """dst [N] flat positions; dist [N, Vd]; aux [N, A*Ht]."""
        dst = _to_device(dst, self.probs.device)
        self.probs.index_copy_(0, dst, dist.probs)
        self.token.index_copy_(0, dst, dist.token)
        self.in_vocab.index_copy_(0, dst, dist.in_vocab)
        self.aux.index_copy_(0, dst, _to_device(aux, self.aux.device).float())

    def inputs(self, batch: Batch, device: torch.device) -> TrainInputs:
        B, T = self.B, self.T
        target = TargetDistribution(
            self.probs.view(B, T, -1).to(device),
            self.token.view(B, T).to(device),
            self.in_vocab.view(B, T).to(device),
        )
        return TrainInputs(batch=batch.to(device), aux=self.aux.view(B, T, -1).to(device), target=target)


class OnlineTarget:
    """Run the live target on each micro-batch (no gradients)."""

    def __init__(self, target: LoadedTarget, contract: Contract, draft_to_target: torch.Tensor) -> None:
        self.target = target
        self.aux_boundaries = tuple(contract.aux_boundaries)
        self.final = contract.final
        self._data_contract = Contract(
            target=target_identity(target),
            aux_boundaries=self.aux_boundaries,
            final=contract.final,
            dtype=dtype_name(target.dtype),
        )
        self.d2t = draft_to_target.to(target.device)
        self.t2d = target_to_draft(self.d2t, target.vocab_size)
        self.sliding_window = sliding_window_of(target.model.config)

    @property
    def data_contract(self) -> Contract:
        return self._data_contract

    def verify(self, draft_contract: Contract) -> None:
        if draft_contract.fingerprint is not None:
            check_fingerprint(draft_contract, self.target)

    @torch.no_grad()
    def prepare(self, rows: Sequence[Row], records: Sequence[Any], device: torch.device) -> TrainInputs:
        batch = assemble(rows, records)
        window = self.sliding_window
        if window is not None and batch.input_ids.shape[1] > window:
            # a custom mask replaces transformers' own, window included
            raise ConfigError(
                f"online training packs records into rows of {batch.input_ids.shape[1]} tokens, but the "
                f"target's config.sliding_window={window} limits some layers' attention to fewer",
                fix=f"train with max_length <= {window}, or capture the data offline (eaglewire data capture)",
            )
        dev = self.target.device
        docs = _to_device(batch.doc_ids, dev)  # [B, T] record of each slot, -1 = padding
        real = docs >= 0
        allowed = prefix_mask(docs)[:, None]  # [B, 1, T, T] earlier tokens of the same record
        # additive, as transformers takes a custom 4D mask for every attention implementation
        mask = torch.zeros(allowed.shape, dtype=self.target.dtype, device=dev)
        mask.masked_fill_(~allowed, torch.finfo(self.target.dtype).min)
        states = capture(
            self.target.model,
            _to_device(batch.input_ids, dev),
            aux_boundaries=self.aux_boundaries,
            final=self.final,
            attention_mask=mask,
            position_ids=_to_device(batch.positions, dev),
            return_logits=True,
        )
        assert states.logits is not None
        dist = restrict_target_logits(states.logits, self.d2t, self.t2d)  # [B, T, Vd]
        # padding slots hold no distribution and no states (as offline data places them)
        target = TargetDistribution(
            dist.probs.masked_fill_(~real[..., None], 0.0).to(device),
            torch.where(real, dist.token, 0).to(device),
            (dist.in_vocab & real).to(device),
        )
        aux = states.aux.float().masked_fill_(~real[..., None], 0.0)  # [B, T, A*Ht]
        return TrainInputs(batch=batch.to(device), aux=aux.to(device), target=target)


class TargetHead(nn.Module):
    """final state [..., Ht] -> target logits [..., V] (returned as float32): final norm (pre-norm
    data) + lm_head, computed in `dtype`.

    float32 (the default) is exact and what CPUs want. On a GPU, training passes the dtype the target
    ran in (the data contract's): then the labels come from the same bf16 matmul the live target
    computes online, on tensor cores, where float32 runs as plain FMA (H200: 18 of a 126 ms offline
    step for 16k tokens x V = 49152; docs/history/benchmarks-log.md §2n)."""

    def __init__(
        self, lm_head_weight: torch.Tensor, norm: nn.Module | None, *, dtype: torch.dtype = torch.float32
    ) -> None:
        super().__init__()
        self.dtype = dtype
        self.lm_head_weight = nn.Parameter(lm_head_weight.detach().to(dtype), requires_grad=False)
        self.norm = norm.to(dtype).requires_grad_(False) if norm is not None else None

    @torch.no_grad()
    def forward(self, final: torch.Tensor) -> torch.Tensor:
        x = _to_device(final, self.lm_head_weight.device).to(self.dtype)
        if self.norm is not None:
            x = self.norm(x)  # float32 inside, as the target's norm; back in `dtype`
        return (x @ self.lm_head_weight.T).float()

    @classmethod
    def from_target(
        cls, target: LoadedTarget, final: FinalState, *, dtype: torch.dtype = torch.float32
    ) -> TargetHead:
        parts = target_parts(target.model)
        norm = copy.deepcopy(parts.final_norm) if final.norm == "pre" else None
        weight = parts.lm_head.weight
        assert isinstance(weight, torch.Tensor)
        return cls(weight, norm, dtype=dtype)

    @classmethod
    def from_pretrained(
        cls, target: str | Path, final: FinalState, *, dtype: torch.dtype = torch.float32
    ) -> TargetHead:
        """Load only the final norm and lm_head (or the tied embedding) from a safetensors directory."""
        path = resolve_target_path(target)
        if path.suffix == ".gguf":
            from eaglewire.target.loading import load_target

            return cls.from_target(
                load_target(path, dtype="float32", with_tokenizer=False), final, dtype=dtype
            )
        cfg_path = path / "config.json"
        if not cfg_path.exists():
            raise TargetFilesError(
                f"target {path}: config.json missing", fix="point --target at the model directory"
            )
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        tied = bool(cfg.get("tie_word_embeddings", False))
        names = {
            "norm": "model.norm.weight",
            "lm_head": "lm_head.weight",
            "embed": "model.embed_tokens.weight",
        }
        tensors = _load_named(path, [names["norm"], names["lm_head"], names["embed"]])
        head = tensors.get(names["lm_head"]) if not tied else None
        if head is None:
            head = tensors.get(names["embed"])
        if head is None or names["norm"] not in tensors:
            raise TargetFilesError(
                f"target {path}: could not find {names['norm']} and lm_head.weight/model.embed_tokens.weight "
                f"(found {sorted(tensors)})"
            )
        norm = None
        if final.norm == "pre":
            norm = RMSNorm(int(head.shape[1]), float(cfg.get("rms_norm_eps", 1e-6)))
            with torch.no_grad():
                norm.weight.copy_(tensors[names["norm"]].float())
        return cls(head, norm, dtype=dtype)


def _load_named(path: Path, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """The tensors among `names` that exist in the directory's safetensors files (only those are read)."""
    from eaglewire.safetensors_io import open_tensors

    out: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        with open_tensors(file, error=TargetFilesError) as f:
            for name in set(names) & set(f.keys()):
                out[name] = f.get_tensor(name)
    return out


def _joined(parts: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """parts [n_i, W] joined along dim 0 on `device` (rows of host records); on CUDA joined into
    pinned host memory first, so the one copy to the device does not block the host."""
    if device.type != "cuda" or any(p.device.type != "cpu" for p in parts):
        return torch.cat(list(parts)).to(device)
    rows = sum(int(p.shape[0]) for p in parts)
    staged = torch.empty((rows, *parts[0].shape[1:]), dtype=parts[0].dtype, pin_memory=True)
    torch.cat(list(parts), out=staged)
    return staged.to(device, non_blocking=True)  # the caching host allocator keeps `staged` until copied


class OfflineTarget:
    """Captured records: aux from the record, labels from the target head applied to `final`."""

    def __init__(
        self,
        head: TargetHead,
        data_contract: Contract,
        draft_to_target: torch.Tensor,
        *,
        device: torch.device | str = "cpu",
    ) -> None:
        c = data_contract
        if c.final.boundary != c.target.num_layers:
            raise ConfigError(
                f"data contract final.boundary={c.final.boundary}: offline training recomputes the target's "
                f"logits from the final state, which must be boundary L={c.target.num_layers}",
                fix="capture the shards with the final state at boundary L (the default)",
            )
        self.head = head.to(device)
        self._data_contract = c
        self.d2t = draft_to_target.to(device)
        self.t2d = target_to_draft(self.d2t, int(head.lm_head_weight.shape[0]))

    @property
    def data_contract(self) -> Contract:
        return self._data_contract

    def verify(self, draft_contract: Contract) -> None:
        return None

    def _check(self, rec: Any) -> None:
        T = int(rec.input_ids.shape[0])
        c = self._data_contract
        if tuple(rec.aux.shape) != (T, c.aux_width):
            raise DataFormatError(
                f"record {rec.record_id}: aux is {tuple(rec.aux.shape)}, expected [T, A*Ht] = "
                f"({T}, {c.num_aux}*{c.target.hidden_size}) per the data contract"
            )
        if tuple(rec.final.shape) != (T, c.target.hidden_size):
            raise DataFormatError(
                f"record {rec.record_id}: final is {tuple(rec.final.shape)}, expected [T, Ht] = ({T}, {c.target.hidden_size})"
            )

    @torch.no_grad()
    def prepare(self, rows: Sequence[Row], records: Sequence[Any], device: torch.device) -> TrainInputs:
        for rec in records:
            self._check(rec)
        batch = assemble(rows, records)
        lengths = [s.length for row in rows for s in row]
        dest = slot_token_index(rows)  # [N] flat position of every token, slots in order
        on = self.d2t.device
        # Joined in pinned memory when the head is on a GPU: a copy from pageable memory makes the
        # host wait for the stream, and the loop prepares the next step while this one's kernels run.
        final = _joined([rec.final[:k] for rec, k in zip(records, lengths, strict=True)], on)  # [N, Ht]
        aux = _joined([rec.aux[:k] for rec, k in zip(records, lengths, strict=True)], on)  # [N, A*Ht]
        placed = _Placed(rows, len(self.d2t), self._data_contract.aux_width, on)
        for a in range(0, len(dest), HEAD_CHUNK_TOKENS):
            b = a + HEAD_CHUNK_TOKENS
            dist = restrict_target_logits(self.head(final[a:b]), self.d2t, self.t2d)  # [n, Vd]
            placed.put(dest[a:b], dist, aux[a:b])
        return placed.inputs(batch, device)
