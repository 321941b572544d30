"""Load a target: a Hugging Face causal-LM directory (safetensors), a GGUF file, or `smollm2`.

`trust_remote_code` is off unless asked. Missing files are named before transformers is asked
to load anything, so the user sees which file is missing rather than a stack trace.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from eaglewire.errors import TargetFilesError
from eaglewire.safetensors_io import read_header
from eaglewire.target.architectures import check_architecture
from eaglewire.typed_config import read_json_file

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
REFERENCE_ALIASES = ("smollm2", "reference")


def torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise TargetFilesError(f"dtype: expected one of {sorted(DTYPES)}, got {name!r}") from None


def dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in DTYPES.items()}[dtype]


@dataclass
class LoadedTarget:
    model: nn.Module
    tokenizer: Any  # PreTrainedTokenizerBase, or None when the directory has none
    path: Path

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def architecture(self) -> str:
        return str((self.config.architectures or [type(self.model).__name__])[0])

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """End-of-generation ids, sorted: the generation config's, the model config's and the tokenizer's eos."""
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.config):
            eos = getattr(source, "eos_token_id", None)
            if isinstance(eos, int):
                ids.add(eos)
            elif isinstance(eos, list | tuple):
                ids.update(int(e) for e in eos)
        tok_eos = getattr(self.tokenizer, "eos_token_id", None) if self.tokenizer is not None else None
        if isinstance(tok_eos, int):
            ids.add(tok_eos)
        return tuple(sorted(ids))

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def resolve_target_path(target: str | Path) -> Path:
    """`smollm2` (or `reference`) means the reference target, converted once into the cache."""
    if str(target) in REFERENCE_ALIASES:
        from eaglewire.target.reference import ensure_reference_target

        return ensure_reference_target()
    return Path(target)


def check_target_dir(path: Path) -> dict[str, Any]:
    """Verify a HF directory has a config with a supported architecture and weights; return the config."""
    if not path.exists():
        raise TargetFilesError(f"target {path}: no such file or directory")
    if not path.is_dir():
        raise TargetFilesError(f"target {path}: expected a Hugging Face model directory or a .gguf file")
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise TargetFilesError(
            f"target {path}: config.json missing", fix="point --target at the model directory"
        )
    cfg = read_json_file(cfg_path)
    archs = cfg.get("architectures") or [None]
    check_architecture(archs[0], where=str(cfg_path))
    weights = list(path.glob("*.safetensors"))
    if not weights:
        found = sorted(p.name for p in path.iterdir())
        raise TargetFilesError(
            f"target {path}: no *.safetensors weights (found {found}); eaglewire never unpickles .bin files",
            fix="convert the weights to safetensors (save_pretrained(safe_serialization=True))",
        )
    index = path / "model.safetensors.index.json"
    weight_map: dict[str, str] = {}
    if index.exists():
        weight_map = dict(read_json_file(index).get("weight_map", {}))
        shards = set(weight_map.values())
        missing = sorted(s for s in shards if not (path / s).exists())
        if missing:
            raise TargetFilesError(f"target {path}: shards listed in {index.name} are missing: {missing}")
    check_weight_headers(path, sorted(weights), weight_map)
    return dict(cfg)


def check_weight_headers(path: Path, files: list[Path], weight_map: dict[str, str]) -> None:
    """Every *.safetensors file's header against its size (a cut copy, a pickle or an LFS pointer is a
    named error before transformers opens it), and every tensor the index lists in the file it names.
    Reads the headers only: no hashing of target weights on load."""
    names: dict[str, set[str]] = {}
    for file in files:
        names[file.name] = set(read_header(file, error=TargetFilesError).tensors)
    for tensor, file_name in sorted(weight_map.items()):
        if file_name in names and tensor not in names[file_name]:
            raise TargetFilesError(
                f"target {path}: model.safetensors.index.json lists tensor {tensor!r} in {file_name}, "
                f"whose header has no such tensor",
                fix="copy the model directory again (the index and its weight files are from different versions)",
            )


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    has_tok = any((path / n).exists() for n in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"))
    if not has_tok:
        log.warning("target %s has no tokenizer files; text input and chat templates are unavailable", path)
        return None
    return AutoTokenizer.from_pretrained(path)


@dataclass(frozen=True)
class TargetPreview:
    """What a target directory says without its weights: its config.json and tokenizer, enough to
    tokenize prompts and check them against the target's positions before the weights load."""

    path: Path
    config: dict[str, Any]
    tokenizer: Any  # None when the directory has none


def preview_target(target: str | Path) -> TargetPreview | None:
    """A Hugging Face directory's config and tokenizer, read without loading its weights (seconds where
    the weights take minutes); None for a .gguf file, whose tokenizer is inside the weights file."""
    path = resolve_target_path(target)
    if path.suffix == ".gguf":
        return None
    config = check_target_dir(path)
    return TargetPreview(path, config, load_tokenizer(path))


def load_target(
    target: str | Path,
    *,
    dtype: str = "bfloat16",
    device: str | torch.device = "cpu",
    trust_remote_code: bool = False,
    with_tokenizer: bool = True,
    tokenizer: Any = None,
) -> LoadedTarget:
    """Load a target in `dtype` on `device`, in eval mode with gradients off. tokenizer: this target's
    tokenizer already loaded (`preview_target`'s), used instead of loading it again (HF directories)."""
    from transformers import AutoModelForCausalLM

    path = resolve_target_path(target)
    if path.suffix == ".gguf":
        from eaglewire.target.gguf import load_gguf

        model, tokenizer = load_gguf(path, dtype=torch_dtype(dtype))
    else:
        check_target_dir(path)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch_dtype(dtype), trust_remote_code=trust_remote_code
        )
        if tokenizer is None and with_tokenizer:
            tokenizer = load_tokenizer(path)
    model.to(device).eval().requires_grad_(False)
    return LoadedTarget(model=model, tokenizer=tokenizer, path=path)
