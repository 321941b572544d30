"""Tensor names between eaglewire's draft and each engine's layout, and safe reading of a weights directory.

eaglewire state dict            engine checkpoint
  embed_tokens.weight     <->     embed_tokens.weight
  fc.weight               <->     fc.weight                    [H, A*Ht]
  layer.<name>            <->     midlayer.<name> (SGLang, EAGLE) | layers.0.<name> (vLLM)
  norm.weight, lm_head.weight <-> same names
  draft_to_target [Vd]    <->     d2t [Vd] offsets + t2d [V] bool (see vocab_map)

Reading never unpickles: `.bin`/`.pt` checkpoints are refused with the conversion command.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from eaglewire.errors import CheckpointError
from eaglewire.export.keys import (
    D2T,
    EAGLEWIRE_LAYER_PREFIX,
    EAGLEWIRE_VOCAB_BUFFER,
    EMBED,
    LAYER_PREFIX,
    LAYER_TENSORS,
    T2D,
    TOP_TENSORS,
    EngineFormat,
)
from eaglewire.export.vocab_map import absolute_to_offsets
from eaglewire.safetensors_io import open_tensors

log = logging.getLogger(__name__)

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
CONVERT_HINT = (
    'convert it once, on a machine where you trust the file (torch.load unpickles): python -c "import torch; '
    "from safetensors.torch import save_file; sd = torch.load('pytorch_model.bin', map_location='cpu', "
    "weights_only=True); save_file({k: v.contiguous() for k, v in sd.items()}, 'model.safetensors')\""
)


def eaglewire_to_engine_name(name: str, fmt: EngineFormat) -> str:
    if name.startswith(EAGLEWIRE_LAYER_PREFIX):
        return LAYER_PREFIX[fmt] + name[len(EAGLEWIRE_LAYER_PREFIX) :]
    return name


def engine_to_eaglewire_names(fmt: EngineFormat) -> dict[str, str]:
    """Engine tensor name -> eaglewire parameter name, for every weight (vocab tensors excluded)."""
    out = {EMBED: EMBED}
    out.update({n: n for n in TOP_TENSORS})
    out.update({LAYER_PREFIX[fmt] + n: EAGLEWIRE_LAYER_PREFIX + n for n in LAYER_TENSORS})
    return out


def engine_tensors(
    state: dict[str, torch.Tensor],
    fmt: EngineFormat,
    *,
    dtype: torch.dtype,
    with_vocab_map: bool,
    vocab_size: int,
) -> dict[str, torch.Tensor]:
    """eaglewire state dict -> the engine's tensors (weights cast to `dtype`; d2t int64, t2d bool)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name == EAGLEWIRE_VOCAB_BUFFER:
            continue
        # a copy each: the engine's fused draft keeps q/k/v and gate/up in shared storage, which
        # safetensors refuses to write
        out[eaglewire_to_engine_name(name, fmt)] = tensor.detach().to("cpu", dtype, copy=True).contiguous()
    if with_vocab_map:
        d2t, t2d = absolute_to_offsets(state[EAGLEWIRE_VOCAB_BUFFER], vocab_size)
        out[D2T], out[T2D] = d2t, t2d
    return out


def find_weight_files(directory: Path) -> list[Path]:
    """The *.safetensors files of a checkpoint directory; pickle checkpoints are refused."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory")
    files = sorted(directory.glob("*.safetensors"))
    if files:
        return files
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise CheckpointError(
            f"{directory}: weights only in pickle format ({', '.join(pickles)}); eaglewire never unpickles "
            "(loading a pickle can run arbitrary code)",
            fix=CONVERT_HINT,
        )
    raise CheckpointError(f"{directory}: no *.safetensors weights file")


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every *.safetensors file in `directory` (a name twice is an error)."""
    out: dict[str, torch.Tensor] = {}
    origin: dict[str, str] = {}
    for path in find_weight_files(directory):
        with open_tensors(path, error=CheckpointError) as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                if name in out:
                    raise CheckpointError(
                        f"{directory}: tensor {name!r} appears in both {origin[name]} and {path.name}"
                    )
                out[name] = f.get_tensor(name)
                origin[name] = path.name
    log.debug("read %d tensors from %s", len(out), directory)
    return out
