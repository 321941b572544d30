"""Range checks of command-line values, made before any work: each refusal names the flag as typed
(`--max-new-tokens`, not the Python field) and the values it allows.

No torch here (nor anything that imports it): a command validates its flags in a fraction of a
second, before it loads a model.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import typer

from eaglewire.cli.config_options import ConfigOptions, FieldOption
from eaglewire.engine.spec_args import DEFAULT_SPEC, SpecArgs  # no torch: spec_args is pure
from eaglewire.errors import ConfigError


def at_least(flag: str, value: int | float | None, low: int | float, meaning: str = "") -> None:
    """`value` >= `low` (None = the flag was not given: nothing to check)."""
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{flag}: expected a finite number >= {low}{_means(meaning)}, got {value}")
    if value < low:
        raise ConfigError(f"{flag}: expected >= {low}{_means(meaning)}, got {value}")


def in_range(
    flag: str,
    value: int | float | None,
    low: int | float,
    high: int | float,
    *,
    low_open: bool = False,
    meaning: str = "",
) -> None:
    """low <= value <= high (low < value with `low_open`); None = not given."""
    if value is None:
        return
    lo = f"{low} < " if low_open else f"{low} <= "
    ok = math.isfinite(value) and (value > low if low_open else value >= low) and value <= high
    if not ok:
        raise ConfigError(f"{flag}: expected {lo}{flag} <= {high}{_means(meaning)}, got {value}")


def one_of(flag: str, value: str | None, allowed: Iterable[str]) -> None:
    """A value from a fixed set (None = not given)."""
    allowed = tuple(allowed)
    if value is not None and value not in allowed:
        raise ConfigError(f"{flag}: expected one of {', '.join(allowed)}, got {value!r}")


def bare_message(error: ConfigError) -> str:
    """An error's message without its `fix:` line (to re-raise it with a prefix and the same fix)."""
    return str(error).split("\n  fix: ")[0]


def _means(meaning: str) -> str:
    return f" ({meaning})" if meaning else ""


def rename_fields(message: str, names: Mapping[str, str], *, before_value: bool = True) -> str:
    """Names in a library message -> the flags they came from (`num_steps=2` -> `--num-steps=2`):
    only where a name stands alone and a value or a comparison follows it (`num_steps: expected`,
    `topk > 1`), so that formulas such as `(num_steps-1)*topk^2` keep their variables; with
    `before_value=False` wherever a name stands alone (flags of another program)."""
    if not names:
        return message
    alternatives = "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
    follows = r"(?=\s*[=<>:])" if before_value else ""
    pattern = re.compile(r"(?<![\w-])(" + alternatives + r")(?![\w-])" + follows)
    return pattern.sub(lambda m: names[m.group(1)], message)


# SGLang's speculative flags and SpecArgs' fields, as `generate` and `bench` spell them.
_SPEC_NAMES = {
    "--speculative-num-steps": "--num-steps",
    "--speculative-eagle-topk": "--topk",
    "--speculative-num-draft-tokens": "--num-draft-tokens",
}
_SPEC_FIELDS = {"num_steps": "--num-steps", "topk": "--topk", "num_draft_tokens": "--num-draft-tokens"}


def spec_args_from_flags(
    num_steps: int, topk: int, num_draft_tokens: int, *, names: Mapping[str, str] | None = None
) -> SpecArgs:
    """`SpecArgs` from the three flags, each refusal naming the flags as the command spells them
    (`names`: field -> flag, default --num-steps / --topk / --num-draft-tokens)."""
    flags = {**_SPEC_FIELDS, **(names or {})}
    for field, value in (("num_steps", num_steps), ("topk", topk), ("num_draft_tokens", num_draft_tokens)):
        at_least(flags[field], value, 1)
    try:
        return SpecArgs(num_steps=num_steps, topk=topk, num_draft_tokens=num_draft_tokens)
    except ConfigError as e:
        sglang = {k: flags[f] for k, f in zip(_SPEC_NAMES, _SPEC_FIELDS, strict=True)}

        def ours(text: str) -> str:
            return rename_fields(rename_fields(text, sglang, before_value=False), flags)

        raise ConfigError(ours(bare_message(e)), fix=None if e.fix is None else ours(e.fix)) from None


# `--num-steps / --topk / --num-draft-tokens` of the commands that decode (`generate`, `serve`): the
# SpecArgs fields, defaulting to SGLang's choice for Llama targets.
SPEC_OPTIONS = ConfigOptions(
    SpecArgs,
    [FieldOption("num_steps"), FieldOption("topk"), FieldOption("num_draft_tokens")],
    defaults=DEFAULT_SPEC,
)


def spec_args_from_options(options: Mapping[str, Any]) -> SpecArgs:
    """`SpecArgs` from a command's SPEC_OPTIONS (see `spec_args_from_flags`)."""
    return spec_args_from_flags(**{r.param: options[r.param] for r in SPEC_OPTIONS.resolved})


DRAFT_MLP_FLAG = "--draft-intermediate-size"


def draft_mlp_option(when: str = "") -> Any:
    """The draft MLP width option of `draft init` and `train` (the quickstart's is its preset field)."""
    return typer.Option(
        None, DRAFT_MLP_FLAG, help=f"{when}the draft layer's MLP width (default: the target's)"
    )


def check_draft_mlp(value: int | None) -> None:
    at_least(DRAFT_MLP_FLAG, value, 1, "the draft layer's MLP width")
