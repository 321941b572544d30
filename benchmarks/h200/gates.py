"""Decisions full_run.sh takes from this lease's train_profile.json before the quickstart runs.

    python benchmarks/h200/gates.py compile|shards|attention TRAIN_PROFILE_JSON "QS_ARGS"

prints the quickstart flag to add ('' for none) and, on stderr, why. Only the profile's rows of the step the
quickstart trains count: its batch size and TTT steps (--batch-size / --ttt-steps in QS_ARGS, else the gpu
preset's).

  compile  --train-compile when the draft's compiled forward trains at least 5% more tokens inside
           the training budget (--train-max-seconds in QS_ARGS, else the gpu preset's) than eager,
           its extra warm-up (the compiles) paid from that budget, at the quickstart's batch size.
           A compile that failed in the profile, or is slower, leaves training eager instead of
           costing the lease its draft.
  shards   --train-from-shards when offline steps (states read from shards captured once) ran at
           least 5% faster than online ones (the target inside every step), eager, at that batch
           size. The capture adds to the data stage, not to the training budget.
  attention --train-ttt-attention flex when the FlexAttention rows (`train_profile.py --attention
           blocked,flex`) train at least 5% more tokens inside the budget than the blocked rows of the
           same setting, online and offline alike, their compiles paid from the budget.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from eaglewire.recipes.presets import PRESETS

MIN_GAIN = 1.05


def flag_value(args: list[str], name: str, default: float) -> float:
    return type(default)(args[args.index(name) + 1]) if name in args else default


def budget_s(args: list[str]) -> float:
    return flag_value(args, "--train-max-seconds", PRESETS["gpu"].train.max_seconds)


def in_budget(row: dict[str, Any], extra_s: float, budget: float) -> float:
    """Tokens a setting trains inside the budget when `extra_s` of it goes to warm-up (compiles)."""
    return float(row["tokens_per_s"]) * max(0.0, budget - extra_s)


def compile_flag(rows: dict[str, dict[str, Any]], args: list[str]) -> str:
    budget = budget_s(args)
    verdicts = []
    for name, eager in rows.items():
        if "compiled" in name or " flex" in name or eager.get("data", "online") != "online":
            continue
        c = rows.get(name + " compiled")
        gain = (
            None
            if c is None
            else in_budget(c, c["warmup_s"] - eager["warmup_s"], budget) / in_budget(eager, 0.0, budget)
        )
        verdicts.append(gain is not None and gain >= MIN_GAIN)
        compiled = (
            "-"
            if c is None
            else f"{c['tokens_per_s']:.0f} tok/s, {c['warmup_s'] - eager['warmup_s']:.0f} s more warm-up"
        )
        verdict = "-" if gain is None else f"{gain:.2f}x"
        print(f"compile gate: {name}: eager {eager['tokens_per_s']:.0f} tok/s, compiled {compiled} -> {verdict} the tokens in {budget:.0f} s", file=sys.stderr)  # fmt: skip
    return "--train-compile" if verdicts and all(verdicts) else ""


def shards_flag(rows: dict[str, dict[str, Any]], args: list[str]) -> str:
    verdicts = []
    for name, online in rows.items():
        if "compiled" in name or online.get("data", "online") != "online":
            continue
        offline = rows.get(name + " offline")
        gain = None if offline is None else offline["tokens_per_s"] / online["tokens_per_s"]
        verdicts.append(gain is not None and gain >= MIN_GAIN)
        off = "-" if offline is None else f"{offline['tokens_per_s']:.0f} tok/s ({gain:.2f}x)"
        print(
            f"shards gate: {name}: online {online['tokens_per_s']:.0f} tok/s, offline {off}", file=sys.stderr
        )
    return "--train-from-shards" if verdicts and all(verdicts) else ""


def attention_flag(rows: dict[str, dict[str, Any]], args: list[str]) -> str:
    budget = budget_s(args)
    verdicts = []
    for name, flex in rows.items():
        if " flex" not in name or "compiled" in name:
            continue
        blocked = rows.get(name.replace(" flex", ""))
        gain = (
            None
            if blocked is None
            else in_budget(flex, flex["warmup_s"] - blocked["warmup_s"], budget)
            / in_budget(blocked, 0.0, budget)
        )
        verdicts.append(gain is not None and gain >= MIN_GAIN)
        base = "-" if blocked is None else f"{blocked['tokens_per_s']:.0f} tok/s"
        verdict = "-" if gain is None else f"{gain:.2f}x"
        print(f"attention gate: {name}: flex {flex['tokens_per_s']:.0f} tok/s, blocked {base} -> {verdict} the tokens in {budget:.0f} s", file=sys.stderr)  # fmt: skip
    return "--train-ttt-attention flex" if verdicts and all(verdicts) else ""


def main(argv: list[str]) -> int:
    kind, profile_json, qs_args = argv
    args = qs_args.split()
    batch = int(flag_value(args, "--batch-size", PRESETS["gpu"].train.batch_size))
    ttt = int(flag_value(args, "--ttt-steps", PRESETS["gpu"].train.ttt_steps))
    with open(profile_json) as f:  # only the profile rows of the step the quickstart trains
        rows = {r["setting"]: r for r in json.load(f) if (r["batch_size"], r["ttt_steps"]) == (batch, ttt)}
    gates = {"compile": compile_flag, "shards": shards_flag, "attention": attention_flag}
    if kind not in gates:
        print(f"gates.py: expected one of {sorted(gates)}, got {kind!r}", file=sys.stderr)
        return 2
    if not rows:  # H200 run 13: every setting was skipped for want of data, and the gate said nothing
        print(
            f"{kind} gate: {profile_json} has no row at batch size {batch} with {ttt} TTT steps (every "
            "setting skipped or failed, or profiled another step: see train_profile.txt): the "
            "quickstart's default stays",
            file=sys.stderr,
        )
    print(gates[kind](rows, args), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
