"""Launch commands for an export: one consistent set of speculative arguments, printed and written to a script.

The three knobs have SGLang's meaning (`eaglewire.engine.spec_args.SpecArgs`, which refuses the
combinations SGLang would silently rewrite, e.g. topk=1 with num_draft_tokens != num_steps + 1).
Where they come from, in order: explicit flags; `--best-setting FILE`; `best_setting.json` in
the draft directory (written by the benchmark); the default chain of DEFAULT_NUM_STEPS tokens.
vLLM drafts a chain: `num_speculative_tokens = num_steps`.
"""

from __future__ import annotations

import json
import logging
import shlex
from dataclasses import dataclass
from pathlib import Path

from eaglewire.engine.spec_args import SpecArgs
from eaglewire.errors import ConfigError
from eaglewire.io_utils import atomic_write_text
from eaglewire.typed_config import help_field, load_config

log = logging.getLogger(__name__)

BEST_SETTING_FILE = "best_setting.json"
DEFAULT_NUM_STEPS = 3
LAUNCH_FILES = {"sglang": "launch_sglang.sh", "vllm": "launch_vllm.sh"}
SGLANG_SERVER = ("python", "-m", "sglang.launch_server")
VLLM_SERVER = ("vllm", "serve")


@dataclass(frozen=True)
class BestSetting:
    """The benchmark's recorded best speculative setting (best_setting.json)."""

    num_steps: int = help_field("SGLang --speculative-num-steps")
    topk: int = help_field("SGLang --speculative-eagle-topk")
    num_draft_tokens: int = help_field("SGLang --speculative-num-draft-tokens")
    source: str = help_field("where the numbers came from (benchmark run, file)", default="")
    batch_size: int = help_field("batch size the setting was measured at", default=1)
    tokens_per_s: float = help_field("measured decode throughput of this setting", default=0.0)
    tau: float = help_field("measured acceptance length of this setting", default=0.0)


def load_best_setting(path: Path) -> tuple[SpecArgs, str]:
    best = load_config(BestSetting, Path(path))
    try:
        spec = SpecArgs(num_steps=best.num_steps, topk=best.topk, num_draft_tokens=best.num_draft_tokens)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    return spec, f"{path}" + (f" ({best.source})" if best.source else "")


def resolve_spec_args(
    *,
    draft_dir: Path,
    best_setting: Path | None = None,
    num_steps: int | None = None,
    topk: int | None = None,
    num_draft_tokens: int | None = None,
) -> tuple[SpecArgs, str]:
    """(speculative arguments, where they came from). Explicit values win over any recorded setting."""
    if num_steps is not None or topk is not None or num_draft_tokens is not None:
        if num_steps is None:
            raise ConfigError("--num-steps is required when --topk or --num-draft-tokens is given")
        k = 1 if topk is None else topk
        if num_draft_tokens is None:
            if k != 1:
                raise ConfigError(f"--topk={k} needs --num-draft-tokens (tree nodes verified per round)")
            num_draft_tokens = num_steps + 1
        return SpecArgs(num_steps=num_steps, topk=k, num_draft_tokens=num_draft_tokens), "command-line flags"
    if best_setting is not None:
        return load_best_setting(best_setting)
    recorded = Path(draft_dir) / BEST_SETTING_FILE
    if recorded.exists():
        return load_best_setting(recorded)
    log.info(
        "no %s in %s and no flags: using a chain of %d draft tokens",
        BEST_SETTING_FILE,
        draft_dir,
        DEFAULT_NUM_STEPS,
    )
    return SpecArgs.chain(
        DEFAULT_NUM_STEPS
    ), f"default chain ({DEFAULT_NUM_STEPS} steps; no recorded best setting)"


def vllm_speculative_tokens(spec: SpecArgs) -> int:
    if not spec.is_chain:
        log.warning(
            "vLLM drafts a chain: the tree setting topk=%d/num_draft_tokens=%d becomes %d speculative tokens",
            spec.topk, spec.num_draft_tokens, spec.num_steps,
        )  # fmt: skip
    return spec.num_steps


def sglang_command(target: str, draft: Path, spec: SpecArgs, *, dtype: str) -> list[str]:
    return [
        *SGLANG_SERVER,
        "--model-path", target,
        "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", str(draft),
        *spec.sglang_flags(),
        "--dtype", dtype,
    ]  # fmt: skip


def vllm_command(target: str, draft: Path, spec: SpecArgs, *, dtype: str) -> list[str]:
    speculative = {
        "method": "eagle3",
        "model": str(draft),
        "num_speculative_tokens": vllm_speculative_tokens(spec),
    }
    return [*VLLM_SERVER, target, "--speculative-config", json.dumps(speculative), "--dtype", dtype]


def render(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def write_launch_script(path: Path, argv: list[str], comments: list[str]) -> Path:
    """An executable bash script running `argv` (extra arguments are passed through)."""
    lines = [
        "#!/usr/bin/env bash",
        *(f"# {c}" for c in comments),
        "set -euo pipefail",
        f'exec {render(argv)} "$@"',
        "",
    ]
    atomic_write_text(path, "\n".join(lines))
    path.chmod(0o755)
    return path
