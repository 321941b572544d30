"""GGUF targets through transformers (dequantized), and conversion to a plain safetensors directory.

transformers refuses to `save_pretrained` a GGUF-loaded model, so conversion copies the state
dict into a fresh model built from the same config without `quantization_config`.
"""

from __future__ import annotations

import logging
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

import torch

from eaglewire.errors import TargetFilesError

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"


def load_gguf(path: Path, *, dtype: torch.dtype) -> tuple[Any, Any]:
    """(model, tokenizer) from a .gguf file; the model is a plain (unquantized) HF model."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if not path.exists():
        raise TargetFilesError(f"GGUF file {path}: not found")
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise TargetFilesError(
            f"reading {path} needs the 'gguf' package", fix="pip install 'eaglewire[gguf]'"
        ) from None
    check_gguf_file(path)
    kwargs = {"gguf_file": path.name}
    try:
        loaded = AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, **kwargs)
        config = AutoConfig.from_pretrained(path.parent, **kwargs)
    except (ValueError, OSError, EOFError, IndexError, KeyError, struct.error) as e:
        # the gguf reader's own errors for a cut or edited file: a reshape that does not fit, a read past the end
        raise TargetFilesError(
            f"GGUF file {path}: cannot be read ({type(e).__name__}: {e})",
            fix="the file is damaged or not a GGUF model: download or copy it again",
        ) from None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    fresh = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings make lm_head.weight legitimately absent from the state dict.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise TargetFilesError(
            f"GGUF {path}: state dict mismatch, missing={missing[:5]} unexpected={unexpected[:5]}"
        )
    if config.tie_word_embeddings:
        fresh.tie_weights()
    return fresh.to(dtype), tokenizer


def check_gguf_file(path: Path) -> None:
    """The GGUF magic and version before transformers reads the file (cheap: 8 bytes and a stat)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) < 8 or head[:4] != GGUF_MAGIC:
        raise TargetFilesError(
            f"GGUF file {path}: does not start with the GGUF magic {GGUF_MAGIC!r} (got {head[:4]!r}, {size} bytes): "
            "not a GGUF file",
            fix="pass a .gguf model file, or a Hugging Face model directory as --target",
        )
    (version,) = struct.unpack("<I", head[4:8])
    if version not in (2, 3):
        raise TargetFilesError(
            f"GGUF file {path}: version {version}, expected 2 or 3 (the versions transformers reads)",
            fix="the file is damaged or from another GGUF generation: download or copy it again",
        )


def convert_gguf_to_safetensors(
    src: Path, dst: Path, *, dtype: torch.dtype, eos_token: str | None = None
) -> Path:
    """Write `dst/` (config.json, model.safetensors, tokenizer files) atomically: all or nothing."""
    model, tokenizer = load_gguf(src, dtype=dtype)
    if eos_token is not None:
        tokenizer.eos_token = eos_token
        eos_id = tokenizer.convert_tokens_to_ids(eos_token)
        model.config.eos_token_id = eos_id
        if model.generation_config is not None:
            model.generation_config.eos_token_id = eos_id
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if dst.exists():
            shutil.rmtree(dst)
        tmp.rename(dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("converted %s -> %s (%s)", src, dst, dtype)
    return dst
