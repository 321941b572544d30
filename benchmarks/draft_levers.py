"""Which training lever moves greedy acceptance? Fresh drafts trained for the same number of steps.

Issue 5 asks for chain-5 tau >= 3.5; the quickstart's draft reaches 2.35-2.97 (BENCHMARKS.md 2p),
and more data of the same kind (2h, 2n), a 3x wider MLP (2i) and hard labels (2j) did not move it.
This script screens the levers that are left, each a fresh draft from the same quickstart data
(`RUN/data/train`, `RUN/data/eval`, `RUN/data/vocab`), the preset's recipe and seed, trained for
`--steps` optimizer steps, and scored by the held-out replay of what the benchmark serves (each
record's first answer, its first `--horizon` tokens; the quickstart's own tau prediction, within
0.5-7% of the measured tau on the H200 runs; the tree decoded by the engine's drafter over those
answers, `predict.heldout_trees`, each row's `tau_tree_method` says so):

    python benchmarks/draft_levers.py --run RUN --steps 1500 --out levers.json \
        --variant base --variant decay1 step_weight_decay=1.0 --variant lr2x learning_rate=1e-3 \
        --variant top_is_last aux_boundaries=2,15,30 --variant embed train_embeddings=true   # on the GPU

With `--served BENCH.json ...` every variant is also scored on text a bench really served: each
bench's plain method's greedy tokens (every lossless setting serves that text), replayed for the
chain and the static tree (`predict.served`; a chain's replay equals the engine's rounds in float32
and came within 0.74% in bf16 on the H200, BENCHMARKS.md 2s). That is the issue's own measure, MT-bench
included, without decoding: run 19's texts are in `benchmarks/results/2026-12-02-quickstart-run19/*/bench.json`.
`--tree none` skips the held-out tree (the engine's drafter over every held-out answer, the slow part);
`--no-heldout-tree` skips only that, and keeps `--tree` for the served texts' static-tree replay. That is
cheap, and it matters for a variant that trains fewer unrolled steps (`ttt_steps=5`): it may gain on the
chain and lose on the 8-step tree.

A variant is a name and `field=value` pairs: any `TrainConfig` field (a list as `a,b`, e.g.
`source_repeats=chitchat:2,humaneval:4`), `aux_boundaries` (the target boundaries the draft reads;
SGLang and vLLM take exactly three), `draft_intermediate_size` (the draft layer's MLP width),
`draft_num_attention_heads` (its query heads; key/value heads keep the target's grouping), or
`draft_vocab_size` (Vd: the variant's vocabulary is chosen afresh from RUN/data/train by the
quickstart's rule; the row records its coverage of the loss tokens).
`--set field=value` applies to every variant (the CPU check shrinks the recipe with it; `--set
max_steps=0 max_seconds=200` trains every variant for the same time instead of the same steps, so a
variant whose step costs more is charged for it). The JSON
is rewritten after each variant, and a rerun with the same arguments skips the variants it holds.
`--data shards` trains from `RUN/data/train_shards` as a quickstart with `train_from_shards` does (the cpu
preset; `online` by default, as the gpu preset), so a CPU screen times what that quickstart trains.
`--fit-records N` also scores every variant on the first N records of `RUN/data/train`, the text it trained on
(`fit_acc`): a variant that lifts the held-out accuracy without lifting its fit generalises better; one that lifts
its fit has more room (BENCHMARKS.md 2zc: the preset's draft fits its own Magpie prompts at 0.770, their held-out
twins at 0.705).
`--deadline` (a unix time; full_run.sh sets it from its step's timeout) skips a variant that would not be
scored by then, rather than train one that the timeout cuts during its scoring (H200 run 25, ttt5).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from eaglewire.bench.results import MethodResult
from eaglewire.bench.saved import bench_plain_text
from eaglewire.cli.common import run_script
from eaglewire.data.records import TokenizedDataset
from eaglewire.data.shards import MANIFEST_FILE
from eaglewire.data.vocab import build_draft_vocab, load_draft_vocab
from eaglewire.draft.io import load_draft
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.errors import ConfigError
from eaglewire.io_utils import atomic_write_json
from eaglewire.predict.evaluation import FIRST_ANSWER
from eaglewire.predict.heldout_trees import evaluate_predictor
from eaglewire.predict.predictor import predict_setting, predict_tau
from eaglewire.predict.served import evaluate_served, float32_draft, served_records
from eaglewire.recipes.presets import PRESETS
from eaglewire.target.loading import LoadedTarget, load_target
from eaglewire.train.config import TrainConfig
from eaglewire.train.run import run_training
from eaglewire.typed_config import from_dict

# run_training arguments, not TrainConfig fields
RUN_FIELDS = ("aux_boundaries", "draft_intermediate_size", "draft_num_attention_heads")
VOCAB_FIELD = "draft_vocab_size"  # a vocabulary chosen from the run's training data, not the run's own


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--run", type=Path, required=True, help="a quickstart run directory (its data/)")
    ap.add_argument("--preset", default="gpu", help="the quickstart preset whose training recipe is the base")
    ap.add_argument("--steps", type=int, default=1500, help="optimizer steps of every variant")
    ap.add_argument("--variant", nargs="+", action="append", required=True, metavar="NAME [FIELD=VALUE ...]")
    ap.add_argument("--set", nargs="+", default=[], metavar="FIELD=VALUE", help="applied to every variant")
    ap.add_argument("--chain", type=int, default=5, help="chain length predicted")
    ap.add_argument("--tree", default="8,8,128",
                    help="num_steps,topk,num_draft_tokens of the tree predicted; 'none': no held-out tree")  # fmt: skip
    ap.add_argument("--heldout-tree", action=argparse.BooleanOptionalAction, default=True,
                    help="decode --tree over every held-out answer (the slow part); off: --tree is replayed on "
                    "the --served texts only")  # fmt: skip
    ap.add_argument("--served", type=Path, nargs="*", default=[], metavar="BENCH_JSON",
                    help="bench.json files whose plain text every variant is also replayed on")  # fmt: skip
    ap.add_argument("--served-dtype", default="bfloat16", help="the target's dtype for the served replay")
    ap.add_argument("--horizon", type=int, default=128, help="tokens per answer replayed (the decode length)")
    ap.add_argument("--eval-max-records", type=int, default=0, help="held-out records scored (0 = all)")
    ap.add_argument("--fit-records", type=int, default=0,
                    help="also score each variant on the first N records of RUN/data/train, the text it trained on "
                         "(whole responses): its fit, beside the held-out accuracy (0 = not scored)")  # fmt: skip
    ap.add_argument("--device", default=None)
    ap.add_argument("--deadline", type=float, default=0.0,
                    help="unix time by which every started variant must be scored: one that would end later is "
                    "skipped, not cut (full_run.sh passes its step's timeout); 0 = none")  # fmt: skip
    ap.add_argument("--data", choices=("online", "shards"), default="online",
                    help="train every variant online (the target inside each step, as the gpu preset) or from "
                         "RUN/data/train_shards (as a preset with train_from_shards, e.g. cpu: on a CPU the "
                         "target's forward is most of an online step); shards hold fixed aux boundaries")  # fmt: skip
    ap.add_argument("--work", type=Path, default=None, help="run directories (default: beside --out)")
    ap.add_argument("--out", type=Path, default=Path("draft_levers.json"))
    return ap.parse_args(argv)


def parse_value(text: str) -> Any:
    """JSON where it parses (1e-3, true, 0.8), a list for 'a,b,c' (of ints for '2,15,30'), else the
    string."""
    if "," in text:
        items = text.split(",")
        return [int(v) for v in items] if all(v.strip().lstrip("-").isdigit() for v in items) else items
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_pairs(pairs: list[str], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ConfigError(f"{where}: expected FIELD=VALUE, got {pair!r}")
        out[name] = parse_value(value)
    return out


def variant_setup(
    base: TrainConfig, overrides: dict[str, Any], where: str
) -> tuple[TrainConfig, dict[str, Any]]:
    """(the variant's TrainConfig, its run_training arguments); unknown fields name the variant."""
    run_args = {k: overrides[k] for k in RUN_FIELDS if k in overrides}
    fields = {k: v for k, v in overrides.items() if k not in (*RUN_FIELDS, VOCAB_FIELD)}
    for name, value in fields.items():  # one item of a tuple field: source_repeats=chitchat:2
        if isinstance(getattr(base, name, None), tuple) and isinstance(value, str):
            fields[name] = [value]
    config = from_dict(TrainConfig, {**dataclasses.asdict(base), **fields}, where=where)
    return config, run_args


def seconds_past_deadline(
    deadline: float, config: TrainConfig, beyond_training: float | None
) -> float | None:
    """How far past `deadline` (unix time; 0 = none) a variant starting now would end, or None if it fits.
    It costs its training budget (`max_seconds`, 0 when steps bound it) plus what the last variant spent
    beyond its own: setup and scoring, and all of a step-bounded run. The first variant is charged its
    budget alone."""
    if not deadline:
        return None
    late = time.time() + config.max_seconds + (beyond_training or 0.0) - deadline
    return late if late > 0 else None


def replay_scores(
    target: str, draft_dir: Path, eval_dir: Path, *, chain: int, tree: SpecArgs | None, horizon: int,
    ttt_steps: int, max_records: int = 0, device: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Held-out replay of the served text (first answers up to the decode horizon): the predicted
    tau of a `chain` (the evaluation's replay) and of `tree` (the engine's dynamic tree decoded over
    the answers: `tau_tree_method`), and accuracy per step. benchmarks/label_ab.py scores with it too."""
    predictor = evaluate_predictor(
        draft_dir, target, eval_dir, num_steps=max(chain, ttt_steps, tree.num_steps if tree else 0),
        max_records=max_records, device=device, horizon=horizon, answer=FIRST_ANSWER,
    )  # fmt: skip
    summary = predictor.summary()
    tree_prediction = predict_setting(predictor, tree) if tree else None
    return {
        "tau_chain": predictor.tau_chain(chain),
        "tau_tree": tree_prediction.tau if tree_prediction else None,
        "tau_tree_method": tree_prediction.method if tree_prediction else None,
        "acc": summary["acc"],
        "cond_acc": summary["cond_acc"],
    }


ServedText = tuple[list[list[int]], MethodResult]  # a bench's prompts (token ids) and its plain runs


def fit_scores(
    target: str, draft_dir: Path, train_dir: Path, *, ttt_steps: int, max_records: int, device: str | None
) -> dict[str, Any]:
    """Accuracy per step on the first `max_records` training records (whole responses): how well the
    variant fits text it trained on. Set beside the held-out accuracy it splits a gap in two: a
    variant that fits its training text no better cannot be lifted by more data of that kind."""
    predictor = evaluate_predictor(
        draft_dir, target, train_dir, num_steps=ttt_steps, max_records=max_records, device=device
    )
    summary = predictor.summary()
    return {"fit_acc": summary["acc"], "fit_records": max_records, "fit_positions": summary["valid_rows"][0]}


def served_scores(
    target: LoadedTarget, draft_dir: Path, texts: dict[str, ServedText], *, chain: int, tree: SpecArgs | None
) -> dict[str, dict[str, Any]]:
    """Per bench: the chain's and the static tree's replay over its plain text, and the chain's
    acceptance per position (what the bench's methods table shows for a chain)."""
    draft, contract = load_draft(draft_dir, device=target.device)
    draft = float32_draft(draft)
    out = {}
    for name, (prompt_ids, plain) in texts.items():
        evaluation = evaluate_served(target, draft, contract, served_records(prompt_ids, plain.runs),
                                     num_steps=max(chain, tree.num_steps if tree else 0))  # fmt: skip
        replay = evaluation.replay_chain(chain)
        out[name] = {"tau_chain": replay.tau, "chain_acceptance": replay.per_position_acceptance,
                     "tau_tree_static": predict_tau(evaluation, tree) if tree else None,
                     "acc": evaluation.summary()["acc"]}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # the library's progress lines (each variant's epoch plan and schedule, its evaluation): a stall shows where
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    tree = None if args.tree == "none" else SpecArgs(*(int(x) for x in args.tree.split(",")))
    if args.preset not in PRESETS:
        raise ConfigError(f"--preset: expected one of {sorted(PRESETS)}, got {args.preset!r}")
    common = parse_pairs(args.set, "--set")
    base = dataclasses.replace(
        PRESETS[args.preset].train, max_steps=args.steps, max_seconds=0.0, epochs=10_000,
        checkpoint_every=0, eval_every=0,
    )  # fmt: skip
    variants = []
    for name, *pairs in args.variant:
        overrides = {**common, **parse_pairs(pairs, f"--variant {name}")}
        variants.append((name, overrides, *variant_setup(base, overrides, f"--variant {name}")))
    names = [v[0] for v in variants]
    if len(set(names)) != len(names):
        raise ConfigError(f"--variant: names must differ, got {names}")
    train_dir = args.run / "data" / ("train_shards" if args.data == "shards" else "train")
    if args.data == "shards":
        if not (train_dir / MANIFEST_FILE).is_file():
            raise ConfigError(
                f"--data shards: {train_dir} holds no captured shards (no {MANIFEST_FILE}); the quickstart "
                "captures them with train_from_shards, or use --data online"
            )
        fixed = [name for name, _, _, run_args in variants if "aux_boundaries" in run_args]
        if fixed:
            raise ConfigError(
                f"--data shards: variants {fixed} set aux_boundaries, but the shards in {train_dir} hold the "
                "boundaries they were captured at; screen them with --data online"
            )
    run_vocab = load_draft_vocab(args.run / "data" / "vocab")
    work = args.work or args.out.with_suffix("")
    key = {k: str(v) for k, v in vars(args).items() if k not in ("out", "deadline")}  # a rerun keeps its rows
    done: dict[str, dict[str, Any]] = {}
    if args.out.exists():
        saved = json.loads(args.out.read_text())
        if saved.get("args") == key:
            done = {r["variant"]: r for r in saved["rows"]}
            say(f"{args.out}: {len(done)} variant(s) already scored ({', '.join(done)}); skipped")
    rows = [done[n] for n in names if n in done]
    served_target = None
    texts: dict[str, ServedText] = {}
    if args.served and any(n not in done for n in names):
        served_target = load_target(args.target, dtype=args.served_dtype, device=args.device)
        for path in args.served:
            texts[path.parent.name] = bench_plain_text(json.loads(path.read_text()), served_target, path)
    beyond_training: float | None = None  # the last variant's seconds outside its training budget
    for name, overrides, config, run_args in variants:
        if name in done:
            continue
        late = seconds_past_deadline(args.deadline, config, beyond_training)
        if late is not None:
            say(
                f"variant {name}: skipped, it would end ~{late:.0f} s after --deadline (rerun it with more time)"
            )
            continue
        length = (
            f"{config.max_seconds:g} s of training" if config.max_seconds > 0 else f"{config.max_steps} steps"
        )
        say(f"variant {name} {overrides or '(the preset)'}: {length}")
        vocab = run_vocab
        if VOCAB_FIELD in overrides:
            train_records = TokenizedDataset.load(args.run / "data" / "train")
            vocab = build_draft_vocab(train_records, int(overrides[VOCAB_FIELD]))
        t0 = time.perf_counter()
        trained = run_training(
            target=args.target, data_dir=train_dir, out_dir=work / name, config=config,
            draft_to_target=vocab.draft_to_target, device=args.device, progress=False, **run_args,
        )  # fmt: skip
        seconds = time.perf_counter() - t0
        rows.append({"variant": name, "overrides": overrides, "optimizer_steps": trained.optimizer_steps,
                     "tokens": trained.tokens, "train_seconds": round(seconds, 1),
                     "draft_vocab_size": vocab.size, "vocab_coverage": vocab.stats.get("coverage"),
                     **replay_scores(args.target, trained.draft_dir, args.run / "data" / "eval", chain=args.chain,
                                     tree=tree if args.heldout_tree else None, horizon=args.horizon,
                                     ttt_steps=config.ttt_steps,
                                     max_records=args.eval_max_records, device=args.device)})  # fmt: skip
        if args.fit_records:
            rows[-1].update(fit_scores(args.target, trained.draft_dir, args.run / "data" / "train",
                                       ttt_steps=config.ttt_steps, max_records=args.fit_records,
                                       device=args.device))  # fmt: skip
        if served_target is not None:
            rows[-1]["served"] = served_scores(
                served_target, trained.draft_dir, texts, chain=args.chain, tree=tree
            )
        atomic_write_json(args.out, {"args": key, "rows": rows})
        beyond_training = time.perf_counter() - t0 - config.max_seconds
    served_names = list(texts) or sorted({n for r in rows for n in r.get("served", {})})
    # the benches' shared prefix (full_run.sh's "chain_bench_") would fill the column headers
    cut = len(os.path.commonprefix(served_names)) if len(served_names) > 1 else 0
    served_trees = any(
        s.get("tau_tree_static") is not None for r in rows for s in r.get("served", {}).values()
    )
    kinds = {"tau_chain": "chain", "tau_tree_static": "tree"} if served_trees else {"tau_chain": "chain"}
    print(f"{'variant':<14} {'steps':>6} {'train s':>8} {'chain ' + str(args.chain):>8} {'tree':>6}  "
          + "".join(f"{n[cut:][:13] + ' ' + label:>20}" for n in served_names for label in kinds.values())
          + "  held-out acc per step" + ("  (fit: the same on trained records)" if args.fit_records else ""))  # fmt: skip
    for r in rows:
        acc = " ".join(f"{a:.3f}" for a in r["acc"][: args.chain + 1])
        tree_tau = "-" if r["tau_tree"] is None else f"{r['tau_tree']:.3f}"
        served = "".join(
            f"{r.get('served', {}).get(n, {}).get(k) or float('nan'):20.3f}"
            for n in served_names
            for k in kinds
        )
        fit = " ".join(f"{a:.3f}" for a in r.get("fit_acc", [])[: args.chain + 1])
        print(f"{r['variant']:<14} {r['optimizer_steps']:>6} {r['train_seconds']:>8.1f} "
              f"{r['tau_chain']:8.3f} {tree_tau:>6}{served}  {acc}" + (f"  (fit: {fit})" if fit else ""))  # fmt: skip
    return 0


if __name__ == "__main__":
    run_script(main)
