"""Training checkpoints: safetensors + JSON only, each written into a temp dir and renamed into place.

    OUT/checkpoints/step-00000100/
        config.json, model.safetensors, contract.json   a loadable draft (eaglewire.draft.io.load_draft)
        optimizer.safetensors + optimizer.json          AdamW state by parameter name, param groups
        rng.safetensors                                 torch (CPU, CUDA) and numpy generator states
        trainer_state.json                              step, data position, scheduler, python RNG, config
    OUT/latest.json                                     {"checkpoint": "checkpoints/step-00000100", ...}

`latest.json` is replaced atomically after the directory is complete, so a crash mid-write leaves
the previous checkpoint as the latest one.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from eaglewire.contract.contract import Contract
from eaglewire.draft.config import DraftConfig
from eaglewire.draft.io import DRAFT_FILES, WEIGHTS_FILE, check_draft_matches_contract
from eaglewire.errors import CheckpointError, ConfigError, TrainingError
from eaglewire.io_utils import atomic_write_json
from eaglewire.output_marker import OutputKind, verify_files, write_marker
from eaglewire.outputs import check_resumable_dir, claim_output_dir
from eaglewire.safetensors_io import load_tensors, read_header
from eaglewire.tensor_checks import check_finite
from eaglewire.train.config import RESUME_MUTABLE, TrainConfig, config_diff
from eaglewire.typed_config import read_json_file

log = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
LATEST_FILE = "latest.json"
OPTIMIZER_TENSORS = "optimizer.safetensors"
OPTIMIZER_INDEX = "optimizer.json"
RNG_FILE = "rng.safetensors"
TRAINER_STATE_FILE = "trainer_state.json"
# How one optimizer step's rows are split into processes and micro-batches: a resume may change these
# (with the number of processes) while processes x grad_accum_steps x batch_size stays the same,
# since the epoch plans (`train.epoch_plans`) and the update depend on that product only.
RESUME_RESPLIT = frozenset({"batch_size", "grad_accum_steps"})
FORMAT = "eaglewire-train-checkpoint"
# What a checkpoint directory holds (its marker lists their sizes and sha256).
CHECKPOINT_FILES = (*DRAFT_FILES, OPTIMIZER_TENSORS, OPTIMIZER_INDEX, RNG_FILE, TRAINER_STATE_FILE)


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


# --- optimizer state <-> safetensors + JSON ---
def flatten_optimizer_state(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A full optimizer state dict keyed by parameter name -> (tensors, JSON index)."""
    names = sorted(state["state"])
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(names):
        for key, value in state["state"][name].items():
            if isinstance(value, torch.Tensor):
                tensors[f"{i}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(i), {})[key] = value
    groups = [
        {k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in state["param_groups"]
    ]
    return tensors, {"format": FORMAT, "params": names, "scalars": scalars, "param_groups": groups}


def unflatten_optimizer_state(tensors: dict[str, torch.Tensor], index: dict[str, Any]) -> dict[str, Any]:
    names = index["params"]
    state: dict[str, dict[str, Any]] = {name: {} for name in names}
    for key, value in tensors.items():
        i, _, field = key.partition(".")
        state[names[int(i)]][field] = value
    for i, values in index.get("scalars", {}).items():
        state[names[int(i)]].update(values)
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in index["param_groups"]]
    return {"state": state, "param_groups": groups}


# --- RNG ---
def capture_rng() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    tensors["numpy_keys"] = torch.from_numpy(np.asarray(keys, dtype=np.int64))
    py_version, py_state, py_gauss = random.getstate()
    meta = {
        "numpy": {
            "kind": kind,
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": {"version": py_version, "state": list(py_state), "gauss_next": py_gauss},
    }
    return tensors, meta


def restore_rng(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    if torch.cuda.is_available():
        states = [tensors[k] for k in sorted(k for k in tensors if k.startswith("torch_cuda_"))]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)
    np_meta = meta["numpy"]
    keys = tensors["numpy_keys"].numpy().astype(np.uint32)
    np.random.set_state(
        (np_meta["kind"], keys, np_meta["pos"], np_meta["has_gauss"], np_meta["cached_gaussian"])
    )
    py = meta["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss_next"]))


# --- save / load ---
@dataclass
class Checkpoint:
    path: Path
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any]
    trainer_state: dict[str, Any]
    rng_tensors: dict[str, torch.Tensor]


def save_checkpoint(
    out_dir: Path,
    *,
    step: int,
    model_state: dict[str, torch.Tensor],
    draft_config: DraftConfig,
    contract: Contract,
    optimizer_state: dict[str, Any],
    trainer_state: dict[str, Any],
    keep: int,
) -> Path:
    """Write checkpoint `step` atomically, point latest.json at it, prune to the newest `keep`."""
    out_dir = Path(out_dir)
    root = out_dir / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(step)
    tmp = root / f".tmp-{checkpoint_name(step)}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        check_draft_matches_contract(draft_config, contract, where=str(final))
        draft_config.save(tmp)
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in model_state.items()},
            str(tmp / WEIGHTS_FILE),
            metadata={"format": "pt", "producer": "eaglewire"},
        )
        contract.save(tmp)
        opt_tensors, opt_index = flatten_optimizer_state(optimizer_state)
        save_file(opt_tensors, str(tmp / OPTIMIZER_TENSORS))
        atomic_write_json(tmp / OPTIMIZER_INDEX, opt_index)
        rng_tensors, rng_meta = capture_rng()
        save_file(rng_tensors, str(tmp / RNG_FILE))
        atomic_write_json(tmp / TRAINER_STATE_FILE, {"format": FORMAT, **trainer_state, "rng": rng_meta})
        write_marker(tmp, OutputKind.TRAIN_CHECKPOINT, CHECKPOINT_FILES)
        if final.exists():  # a re-run reaching the same step: keep the new one
            old = root / f".old-{checkpoint_name(step)}-{os.getpid()}"
            os.replace(final, old)
            shutil.rmtree(old)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_json(
        out_dir / LATEST_FILE, {"checkpoint": f"{CHECKPOINTS_DIR}/{final.name}", "optimizer_step": step}
    )
    prune_checkpoints(out_dir, keep=keep, protect=final)
    log.info("checkpoint written: %s", final)
    return final


def prune_checkpoints(out_dir: Path, *, keep: int, protect: Path) -> None:
    root = Path(out_dir) / CHECKPOINTS_DIR
    done = sorted(p for p in root.glob("step-*") if p.is_dir())
    for p in done[: max(0, len(done) - keep)]:
        if p.resolve() != protect.resolve():
            shutil.rmtree(p)


def find_latest(out_dir: Path) -> Path | None:
    """The checkpoint latest.json points to, or None when the run has none."""
    pointer = Path(out_dir) / LATEST_FILE
    if not pointer.exists():
        return None
    data = read_json_file(pointer)
    path = Path(out_dir) / str(data.get("checkpoint", ""))
    if not (path / TRAINER_STATE_FILE).exists():
        raise CheckpointError(
            f"{pointer}: points to {path}, which is not a complete checkpoint (no {TRAINER_STATE_FILE})",
            fix=f"point {LATEST_FILE} at an existing checkpoints/step-* directory",
        )
    return path


def load_checkpoint(path: Path) -> Checkpoint:
    """Read a checkpoint, checking every file first: each safetensors header against its size (a cut
    file names the tensor), the marker's sizes and sha256 when the checkpoint has one, the JSON
    files, and that the optimizer index and its tensors name the same parameters and states."""
    path = Path(path)
    verify_checkpoint(path)
    trainer_state = _json_object(path / TRAINER_STATE_FILE)
    if trainer_state.get("format") != FORMAT:
        raise CheckpointError(
            f"{path / TRAINER_STATE_FILE}: format expected {FORMAT!r}, got {trainer_state.get('format')!r}",
            fix=RESUME_FIX,
        )
    model_state = load_tensors(path / WEIGHTS_FILE, error=CheckpointError, fix=RESUME_FIX)
    check_finite(model_state, where=str(path / WEIGHTS_FILE), fix=RESUME_FIX)
    opt_tensors = load_tensors(path / OPTIMIZER_TENSORS, error=CheckpointError, fix=RESUME_FIX)
    check_finite(opt_tensors, where=str(path / OPTIMIZER_TENSORS), fix=RESUME_FIX)
    optimizer_state = _optimizer_state(path, opt_tensors, _json_object(path / OPTIMIZER_INDEX))
    rng_tensors = load_tensors(path / RNG_FILE, error=CheckpointError, fix=RESUME_FIX)
    if "torch_cpu" not in rng_tensors or "numpy_keys" not in rng_tensors:
        raise CheckpointError(
            f"{path / RNG_FILE}: tensors 'torch_cpu' and 'numpy_keys' expected, found {sorted(rng_tensors)}",
            fix=RESUME_FIX,
        )
    return Checkpoint(
        path=path,
        model_state=model_state,
        optimizer_state=optimizer_state,
        trainer_state=trainer_state,
        rng_tensors=rng_tensors,
    )


RESUME_FIX = (
    "the checkpoint is damaged: point latest.json at an earlier checkpoints/step-* directory, or start "
    "a new run (`eaglewire train` with another --out, without --resume)"
)


def verify_checkpoint(path: Path) -> None:
    """Every file of checkpoint `path` present, each safetensors header against its file's size (a cut
    file names the tensor), then the sizes and sha256 its marker records (a checkpoint written before
    markers has none to verify). Cheap next to training: call it before reading anything from it."""
    path = Path(path)
    for name in (WEIGHTS_FILE, OPTIMIZER_TENSORS, OPTIMIZER_INDEX, RNG_FILE, TRAINER_STATE_FILE):
        if not (path / name).exists():
            raise CheckpointError(f"checkpoint {path}: {name} missing", fix=RESUME_FIX)
    for name in (WEIGHTS_FILE, OPTIMIZER_TENSORS, RNG_FILE):
        read_header(path / name, error=CheckpointError, fix=RESUME_FIX)
    try:
        verify_files(path)
    except CheckpointError as e:
        raise CheckpointError(str(e).split("\n  fix: ")[0], fix=RESUME_FIX) from None


def _json_object(path: Path) -> dict[str, Any]:
    obj = read_json_file(path)
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(obj).__name__}", fix=RESUME_FIX)
    return obj


def _optimizer_state(path: Path, tensors: dict[str, torch.Tensor], index: dict[str, Any]) -> dict[str, Any]:
    """`unflatten_optimizer_state`, with every disagreement between optimizer.json and
    optimizer.safetensors named (a tensor for a parameter the index does not list, a malformed index)."""
    where = f"{path / OPTIMIZER_TENSORS} + {OPTIMIZER_INDEX}"
    params = index.get("params")
    if not isinstance(params, list) or not isinstance(index.get("param_groups"), list):
        raise CheckpointError(
            f"{path / OPTIMIZER_INDEX}: 'params' and 'param_groups' lists expected, got keys {sorted(index)}",
            fix=RESUME_FIX,
        )
    for key in sorted(tensors):
        i, dot, field = key.partition(".")
        if not (dot and field and i.isdigit() and int(i) < len(params)):
            raise CheckpointError(
                f"{where}: tensor {key!r} names no parameter of the index ({len(params)} parameters: "
                "expected '<parameter number>.<state>')",
                fix=RESUME_FIX,
            )
    try:
        return unflatten_optimizer_state(tensors, index)
    except (KeyError, IndexError, ValueError, TypeError, AttributeError) as e:
        raise CheckpointError(
            f"{path / OPTIMIZER_INDEX}: malformed ({type(e).__name__}: {e})", fix=RESUME_FIX
        ) from None


def check_run_dir(out_dir: Path, *, resume: bool) -> None:
    """Before any work: `out_dir` must be missing, empty or a training run (a marker, or
    train_config.json from before markers); a run with a checkpoint continues only with --resume,
    and --resume needs one. Writes nothing."""
    out_dir = Path(out_dir)
    found = check_resumable_dir(out_dir, OutputKind.TRAIN_RUN)
    latest = find_latest(out_dir) if found is not None else None
    if not resume and latest is not None:
        raise ConfigError(
            f"{out_dir} already holds a training run (latest: {latest})",
            fix="pass --resume to continue it, or choose another --out",
        )
    if resume and latest is None:
        raise CheckpointError(
            f"--resume: {out_dir} has no checkpoint (latest.json)", fix="drop --resume to start a new run"
        )


def start_or_resume(
    out_dir: Path,
    config: TrainConfig,
    *,
    resume: bool,
    is_main: bool,
    barrier: Callable[[], None],
    world_size: int = 1,
) -> Checkpoint | None:
    """A new run writes train_config.json (refusing a directory that already holds a run); a resumed
    run loads its latest checkpoint after checking the config is the run's own. Fields that do not
    change what is computed (RESUME_MUTABLE: logging, eval and checkpoint cadence) may change on
    resume, and so may RESUME_RESPLIT's when `world_size` x grad_accum_steps x batch_size equals the
    checkpoint's rows per step; they are written back to train_config.json."""
    out_dir = Path(out_dir)
    latest = find_latest(out_dir) if out_dir.exists() else None
    if not resume:
        if latest is not None:
            raise ConfigError(
                f"{out_dir} already holds a training run (latest: {latest})",
                fix="pass --resume to continue it, or choose another --out",
            )
        if is_main:
            claim_output_dir(out_dir, OutputKind.TRAIN_RUN)
            config.save(out_dir)
        barrier()
        return None
    if latest is None:
        raise CheckpointError(
            f"--resume: {out_dir} has no checkpoint (latest.json)", fix="drop --resume to start a new run"
        )
    stored = TrainConfig.load(out_dir)
    diffs = config_diff(stored, config, names=("stored", "given"), ignore=RESUME_MUTABLE | RESUME_RESPLIT)
    if diffs:
        raise ConfigError(
            "--resume: the training config differs from the run's:\n  " + "\n  ".join(diffs),
            fix="resume with the run's own settings (train_config.json in the run directory)",
        )
    ckpt = load_checkpoint(latest)
    check_rows_per_step(ckpt, config, world_size)
    if is_main:
        claim_output_dir(out_dir, OutputKind.TRAIN_RUN)  # a run from before markers gets one now
        config.save(out_dir)
    barrier()
    return ckpt


def check_rows_per_step(ckpt: Checkpoint, config: TrainConfig, world_size: int) -> None:
    """Refuse a resume whose optimizer steps would hold another number of rows than the checkpoint's:
    its saved data position (epoch, step of the epoch) would then point at other records."""
    saved = ckpt.trainer_state["rows_per_step"]
    now = world_size * config.grad_accum_steps * config.batch_size
    if saved != now:
        was = ckpt.trainer_state.get("world_size", "?")
        raise TrainingError(
            f"{ckpt.path}: saved with {saved} rows per optimizer step ({was} processes), this launch has {now} "
            f"({world_size} processes x grad_accum_steps={config.grad_accum_steps} x batch_size={config.batch_size}); "
            "the data position would not line up",
            fix=f"choose batch_size and grad_accum_steps so that processes x grad_accum_steps x batch_size = {saved}, "
            "or start a new run (another --out)",
        )
