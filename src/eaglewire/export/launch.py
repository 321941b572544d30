"""Launch commands for an export: one consistent set of speculative arguments, printed and written to a script.

The three knobs have SGLang's meaning (`eaglewire.engine.spec_args.SpecArgs`, which refuses the
combinations SGLang would silently rewrite, e.g. topk=1 with num_draft_tokens != num_steps + 1).
Where they come from, in order: explicit flags; `--best-setting FILE`; `best_setting.json` in
the draft directory (written by the benchmark); the default chain of DEFAULT_NUM_STEPS tokens.
vLLM drafts a chain: `num_speculative_tokens = num_steps`.

The target is named by an absolute path (or a model hub id given with --verifier), so an export
works from any working directory: speculators 0.9.0 loads the verifier named in
`speculators_config.verifier.name_or_path` (`Eagle3DraftModel.from_pretrained`,
models/eagle3/core.py:165-172). The launch scripts name the target themselves (`vllm serve TARGET
--speculative-config ...`); vLLM 0.33.0 reads the verifier only when the export directory is
served alone, and then takes only a hub id (vllm/transformers_utils/config.py:859-874).
"""

from __future__ import annotations

import json
import logging
import re
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


# A model hub id: "name" or "org/name" (what huggingface_hub's validate_repo_id accepts, roughly).
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
TARGET_PLACEHOLDER = "TARGET_MODEL_PATH"


@dataclass(frozen=True)
class TargetReference:
    """How an export names its target: in the launch command and (vLLM) as the speculators verifier."""

    launch: str  # the serving command's target: an absolute path, a hub id, or the placeholder
    verifier: str  # speculators_config.verifier.name_or_path: an absolute path or a hub id
    source: str  # where it came from, for export.json
    portable: bool  # resolves the same from any working directory


def _is_hub_id(text: str) -> bool:
    return bool(HUB_ID.match(text)) and ".." not in text


def resolve_target_reference(
    *, target_path: str | None, recorded: str, verifier: str | None, fmt: str
) -> TargetReference:
    """The target as the export will name it, made absolute so the export works from any directory.

    `target_path` (--target-path) wins over `recorded` (contract.json's target name, a path as typed
    when the draft was made, relative to *that* working directory). `verifier` (--verifier, vLLM
    only) names the speculators verifier: a local directory (made absolute) or a model hub id. A
    relative path that does not exist from here cannot be made absolute: a vLLM export is refused
    (speculators would look for it on the model hub), an SGLang launch script keeps it as given."""
    given = target_path or recorded
    source = "--target-path" if target_path else "contract.json target name"
    launch: str
    portable = True
    if not given:
        launch, portable = TARGET_PLACEHOLDER, False
        log.warning("contract.json has no target path: the launch command uses the placeholder %s", launch)
    elif Path(given).exists():
        launch = str(Path(given).resolve())
    elif Path(given).is_absolute():
        launch = given
        log.warning("target %s (%s) does not exist on this machine: written as given", given, source)
    else:
        launch, portable = given, False
    if verifier is not None:
        if Path(verifier).exists():
            resolved = str(Path(verifier).resolve())
        elif _is_hub_id(verifier):
            resolved = verifier
        else:
            raise ConfigError(
                f"--verifier {verifier}: neither a directory here nor a model hub id ('name' or 'org/name')",
                fix="pass the target's directory or its hub id with --verifier",
            )
        if not target_path:
            launch, portable = resolved, True
        return TargetReference(launch, resolved, "--verifier", portable)
    if not portable and fmt == "vllm":
        where = f"{given!r} ({source})" if given else "nothing (contract.json has no target name)"
        raise ConfigError(
            f"the vLLM export's speculators_config.verifier.name_or_path would be {where}, which is not a directory "
            f"from {Path.cwd()}: speculators and vLLM would look for it on the model hub, and a relative path breaks "
            "as soon as the export is loaded from another directory",
            fix="pass the target's directory with --target-path (written as an absolute path), or its model hub id "
            "with --verifier",
        )
    if not portable and given:
        log.warning(
            "target %r (%s) is not a directory from %s: the SGLang launch command keeps it as given", given, source,
            Path.cwd(),
        )  # fmt: skip
    return TargetReference(launch, launch, source, portable)


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
