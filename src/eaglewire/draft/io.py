"""Save/load drafts as a directory: config.json + model.safetensors + contract.json. Never unpickles."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors.torch import save_file

from eaglewire.contract.contract import CONTRACT_FILE, Contract
from eaglewire.draft.config import DRAFT_CONFIG_FILE, DraftConfig
from eaglewire.draft.model import Eagle3Draft
from eaglewire.errors import CheckpointError, ContractMismatchError
from eaglewire.io_utils import atomic_path
from eaglewire.output_marker import MARKER_FILE, OutputKind, read_marker, verify_files, write_marker
from eaglewire.safetensors_io import load_tensors, read_header
from eaglewire.tensor_checks import check_finite, check_vocab_map

WEIGHTS_FILE = "model.safetensors"
# What a draft directory holds (and its marker lists, with their sizes and sha256).
DRAFT_FILES = (DRAFT_CONFIG_FILE, WEIGHTS_FILE, CONTRACT_FILE)
VOCAB_BUFFER = "draft_to_target"
NONFINITE_FIX = (
    "the draft was saved with these values (training diverged?): use an earlier checkpoint "
    "(RUN/checkpoints/step-* is a draft directory), or train again with a lower learning rate "
    "(`eaglewire train --learning-rate`)"
)
VOCAB_MAP_FIX = (
    "build the vocab map with `eaglewire data vocab` and create the draft from it "
    "(`eaglewire draft init --vocab-map`), then train it"
)

log = logging.getLogger(__name__)


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
    """Write the three files and the marker `eaglewire.json` (kind draft, the size and sha256 of
    each, which loading verifies); each write is atomic, the marker last. Writes into `directory` as
    it is: commands build a draft in a fresh directory (`outputs.fresh_output`), training replaces
    its own (`outputs.replacing_dir`)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    check_draft_matches_contract(model.config, contract, where=str(directory))
    model.config.save(directory)
    # a copy of each: a fused draft's weights share storage, which safetensors refuses
    state = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in model.state_dict().items()}
    with atomic_path(directory / WEIGHTS_FILE) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt", "producer": "eaglewire"})
    contract.save(directory)
    write_marker(directory, OutputKind.DRAFT, DRAFT_FILES)
    return directory


def load_draft_weights(model: Eagle3Draft, path: Path) -> None:
    """Load safetensors into `model`, naming every missing/unexpected/misshapen tensor, every tensor
    holding NaN or inf, and the first bad entry of the vocab map `draft_to_target`."""
    if not path.exists():
        raise CheckpointError(f"{path}: weights file missing")
    state = load_tensors(path, error=CheckpointError)
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
    check_finite(state, where=str(path), fix=NONFINITE_FIX)
    check_vocab_map(state[VOCAB_BUFFER], model.config.vocab_size, where=str(path), fix=VOCAB_MAP_FIX)
    model.load_state_dict(state)


def verify_draft_files(directory: Path) -> None:
    """Check a draft directory's files before reading them: the weights' safetensors header (a cut
    copy names the tensor it cuts), then each file the marker lists against its size and sha256 (a
    flipped byte is a named error). A draft saved before drafts carried a marker is loaded with a
    warning that it cannot be verified."""
    directory = Path(directory)
    marker = read_marker(directory)
    listed = sorted(n for n in (marker.files if marker else ()) if n.endswith(".safetensors"))
    for name in sorted({WEIGHTS_FILE, *listed}):
        if (directory / name).exists():
            read_header(directory / name, error=CheckpointError)
    if marker is None:
        log.warning(
            "draft %s has no %s (saved by an earlier eaglewire): its files cannot be verified against "
            "checksums; loading it as is",
            directory,
            MARKER_FILE,
        )
        return
    verify_files(directory, marker)


def load_draft(
    directory: Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> tuple[Eagle3Draft, Contract]:
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"draft {directory}: not a directory")
    verify_draft_files(directory)
    cfg = DraftConfig.load(directory)
    contract = Contract.load(directory)
    check_draft_matches_contract(cfg, contract, where=str(directory))
    model = Eagle3Draft(cfg)
    load_draft_weights(model, directory / WEIGHTS_FILE)
    return model.to(device=device, dtype=dtype).eval(), contract
