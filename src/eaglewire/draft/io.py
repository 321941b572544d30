"""Save/load drafts as a directory: config.json + model.safetensors + contract.json. Never unpickles."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eaglewire.contract.contract import Contract
from eaglewire.draft.config import DraftConfig
from eaglewire.draft.model import Eagle3Draft
from eaglewire.errors import CheckpointError, ContractMismatchError
from eaglewire.io_utils import atomic_path

WEIGHTS_FILE = "model.safetensors"


def check_draft_matches_contract(cfg: DraftConfig, contract: Contract, *, where: str = "draft") -> None:
    t = contract.target
    problems = []
    if cfg.num_aux != contract.num_aux:
        problems.append(
            f"num_aux: config={cfg.num_aux} contract aux_boundaries={list(contract.aux_boundaries)}"
        )
    if cfg.target_hidden_size != t.hidden_size:
        problems.append(
            f"target_hidden_size: config={cfg.target_hidden_size} contract target.hidden_size={t.hidden_size}"
        )
    if cfg.vocab_size != t.vocab_size:
        problems.append(f"vocab_size: config={cfg.vocab_size} contract target.vocab_size={t.vocab_size}")
    if problems:
        raise ContractMismatchError(
            f"{where}: config.json and contract.json disagree:\n  " + "\n  ".join(problems)
        )


def save_draft(model: Eagle3Draft, contract: Contract, directory: Path) -> Path:
    """Write the three files; each write is atomic, weights last-but-one, contract last."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    check_draft_matches_contract(model.config, contract, where=str(directory))
    model.config.save(directory)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    with atomic_path(directory / WEIGHTS_FILE) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt", "producer": "eaglewire"})
    contract.save(directory)
    return directory


def load_draft_weights(model: Eagle3Draft, path: Path) -> None:
    """Load safetensors into `model`, naming every missing/unexpected/misshapen tensor."""
    if not path.exists():
        raise CheckpointError(f"{path}: weights file missing")
    state = load_file(str(path))
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = [
        f"{k}: expected {tuple(expected[k].shape)}, got {tuple(state[k].shape)}"
        for k in sorted(set(state) & set(expected))
        if tuple(state[k].shape) != tuple(expected[k].shape)
    ]
    if missing or unexpected or shapes:
        lines = [f"missing tensors: {missing}"] if missing else []
        lines += [f"unexpected tensors: {unexpected}"] if unexpected else []
        lines += shapes
        raise CheckpointError(f"{path}: weights do not fit the draft config:\n  " + "\n  ".join(lines))
    model.load_state_dict(state)


def load_draft(
    directory: Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> tuple[Eagle3Draft, Contract]:
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"draft {directory}: not a directory")
    cfg = DraftConfig.load(directory)
    contract = Contract.load(directory)
    check_draft_matches_contract(cfg, contract, where=str(directory))
    model = Eagle3Draft(cfg)
    load_draft_weights(model, directory / WEIGHTS_FILE)
    return model.to(device=device, dtype=dtype).eval(), contract
