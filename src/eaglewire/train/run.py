"""What `eaglewire train` does: open the data directory, pick the online or offline target side, get
a draft, and call the loop (`eaglewire eval` opens its data and target side here too:
`eaglewire.predict.evaluation.run_eval`).

A data directory is either a tokenized dataset (`eaglewire data build`: online, the target runs
inside the loop) or a shard directory (`eaglewire data capture`: offline, only the target's final
norm and lm_head are loaded).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from eaglewire.contract.contract import Contract
from eaglewire.data.kind import data_dir_kind
from eaglewire.data.records import TokenizedDataset
from eaglewire.data.shards import ShardDataset
from eaglewire.draft.init import init_draft
from eaglewire.draft.io import load_draft
from eaglewire.draft.model import Eagle3Draft
from eaglewire.errors import ConfigError, ContractMismatchError, DataFormatError
from eaglewire.target.identity import build_contract, config_hash
from eaglewire.target.loading import LoadedTarget, load_target, resolve_target_path
from eaglewire.train.checkpoint import check_run_dir, find_latest, verify_checkpoint
from eaglewire.train.config import TrainConfig
from eaglewire.train.distributed import DistContext, init_distributed
from eaglewire.train.loop import TrainResult, train
from eaglewire.train.target_side import (
    OfflineTarget,
    OnlineTarget,
    TargetHead,
    TargetSide,
    check_data_contract,
)

log = logging.getLogger(__name__)

DataKind = Literal["online", "offline"]


@dataclass
class OpenedData:
    kind: DataKind
    records: Any  # TokenizedDataset or ShardDataset
    contract: Contract | None  # shards carry one; tokenized data does not (the live target defines it)
    path: Path


def open_data(path: Path) -> OpenedData:
    """Detect and open a tokenized dataset (online) or a shard directory (offline)."""
    path = Path(path)
    if data_dir_kind(path) == "shards":
        # every shard's sha256 before step 1, in parallel: checked lazily instead, each first read
        # would hash a whole shard inside a step's input preparation
        shards = ShardDataset(path, verify="eager")
        return OpenedData("offline", shards, shards.contract, path)
    return OpenedData("online", TokenizedDataset.load(path), None, path)


def default_target_dtype(device: torch.device) -> str:
    return "bfloat16" if device.type == "cuda" else "float32"


def offline_head_dtype(contract: Contract, device: torch.device) -> torch.dtype:
    """The dtype offline training recomputes the target's logits in: the one the target ran in when the
    shards were captured, on a GPU (the labels online training would get, on tensor cores); float32 on
    CPUs, where reduced-precision matmuls are slower, not faster."""
    return getattr(torch, contract.dtype) if device.type == "cuda" else torch.float32


def check_target_config(target: str | Path, contract: Contract) -> None:
    """The target directory given for the lm_head must be the target the data was captured from."""
    path = resolve_target_path(target)
    if path.suffix == ".gguf" or not (path / "config.json").exists():
        return
    from transformers import AutoConfig

    actual = config_hash(AutoConfig.from_pretrained(path))
    if actual != contract.target.config_hash:
        raise ContractMismatchError(
            f"--target {target}: config hash {actual[:12]}... differs from the data contract's target "
            f"({contract.target.name or contract.target.architecture}, {contract.target.config_hash[:12]}...)",
            fix="pass the target the shards were captured from",
        )


def make_target_side(
    data: OpenedData,
    target: str | Path,
    contract: Contract,
    draft: Eagle3Draft,
    *,
    device: torch.device,
    target_dtype: str,
    loaded: LoadedTarget | None = None,
) -> TargetSide:
    if data.kind == "online":
        live = loaded or load_target(target, dtype=target_dtype, device=device)
        return OnlineTarget(live, contract, draft.get_buffer("draft_to_target"))
    assert data.contract is not None
    check_target_config(target, data.contract)
    head = TargetHead.from_pretrained(
        target, data.contract.final, dtype=offline_head_dtype(data.contract, device)
    )
    return OfflineTarget(head, data.contract, draft.get_buffer("draft_to_target"), device=device)


def run_training(
    *,
    target: str,
    data_dir: Path,
    out_dir: Path,
    config: TrainConfig,
    draft_init: Path | None = None,
    eval_dir: Path | None = None,
    resume: bool = False,
    aux_boundaries: list[int] | None = None,
    draft_to_target: torch.Tensor | None = None,
    draft_intermediate_size: int | None = None,
    draft_num_attention_heads: int | None = None,
    device: str | None = None,
    target_dtype: str | None = None,
    progress: bool = True,
    ctx: DistContext | None = None,
) -> TrainResult:
    """Train a draft from `data_dir` into `out_dir` (see `eaglewire train --help`).
    draft_intermediate_size / draft_num_attention_heads: the fresh draft's MLP width and query heads
    (None: the target's); a draft that is resumed or given by `draft_init` must already have them."""
    check_run_dir(out_dir, resume=resume)  # first: a refusal costs nothing
    ctx = ctx or init_distributed(device)
    dtype = target_dtype or default_target_dtype(ctx.device)
    data = open_data(data_dir)
    eval_data = open_data(eval_dir) if eval_dir is not None else None
    if eval_data is not None and eval_data.kind != data.kind:
        raise DataFormatError(
            f"--eval-data {eval_dir} is {eval_data.kind} data but --data {data_dir} is {data.kind}"
        )
    loaded: LoadedTarget | None = None
    latest = find_latest(out_dir) if resume and Path(out_dir).exists() else None
    if latest is not None:
        verify_checkpoint(latest)  # every file, named with the resume fix, before any is read
        draft, contract = load_draft(latest)  # the loop restores weights and optimizer from it
    elif draft_init is not None:
        draft, contract = load_draft(draft_init)
    if latest is not None or draft_init is not None:
        source = f"checkpoint {latest}" if latest is not None else f"--draft-init {draft_init}"
        for name, asked in (
            ("intermediate_size", draft_intermediate_size),
            ("num_attention_heads", draft_num_attention_heads),
        ):
            have = getattr(draft.config, name)
            if asked is not None and asked != have:
                raise ConfigError(
                    f"draft {name} {asked} asked, but the {source} has {have}",
                    fix=f"drop the draft {name.replace('_', ' ')}, or train into a new --out without "
                    "--draft-init",
                )
    else:
        loaded = load_target(target, dtype=dtype, device=ctx.device)
        boundaries = aux_boundaries or (list(data.contract.aux_boundaries) if data.contract else None)
        norm = data.contract.final.norm if data.contract else "pre"
        contract = build_contract(loaded, boundaries, final_norm=norm)
        if data.contract is not None:
            check_data_contract(contract, data.contract)
        draft = init_draft(
            loaded,
            contract,
            draft_to_target=draft_to_target,
            intermediate_size=draft_intermediate_size,
            num_attention_heads=draft_num_attention_heads,
            seed=config.seed,
        )
    if data.kind == "offline" and loaded is not None:
        loaded = None  # offline needs only the head; free the full target
    side = make_target_side(
        data, target, contract, draft, device=ctx.device, target_dtype=dtype, loaded=loaded
    )
    return train(
        config,
        draft,
        contract,
        data.records,
        side,
        out_dir=Path(out_dir),
        eval_data=eval_data.records if eval_data is not None else None,
        resume=resume,
        progress=progress and ctx.is_main,
        ctx=ctx,
    )
