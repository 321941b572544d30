"""Where on MT-bench does a draft's chain lose its tokens? The chain's replay over a bench's served
text, split by the prompts' category (writing, roleplay, reasoning, math, coding, extraction, stem,
humanities for MT-bench; one group for sets without categories), with each category's accuracy per
step, its share of labels outside the draft vocabulary, and the chain's tau were those drafted right
(the most a larger `--draft-vocab-size` could add). `eaglewire bench` reports `tau_by_category` for
the draft it decoded with; this scores any draft on a text a bench saved, without a GPU (a lost
bench, a draft trained since).

The text is the bench's plain method's greedy tokens (`bench.saved.bench_plain_text`), which every
lossless setting serves, so any draft can be scored on it without decoding; the whole-set line equals
the served replay `eaglewire bench` prints for that draft in float32 (on the H200 in bf16 it came
within 2% of the measured tau, BENCHMARKS.md 2s and 2u). The replay's labels are the replay target's
own greedy tokens, so each row also gives the share of served tokens that target would not have chosen
(`served_token_differs_share`: 0 on the device and dtype that served; 1.3-1.4% for an H200 bf16 text
replayed on a CPU, BENCHMARKS.md 2x), where the replay and the served rounds part. `--precision bf16` runs
the draft under bf16 autocast, as the H200's replay does:

    python benchmarks/served_by_category.py --target smollm2 --draft DRAFT \
        --bench benchmarks/results/2026-12-02-quickstart-run19/mt-bench-all/bench.json --out by_category.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from eaglewire.bench.results import PromptRun
from eaglewire.bench.saved import bench_plain_text
from eaglewire.cli.common import run_script
from eaglewire.draft.io import load_draft
from eaglewire.io_utils import atomic_write_json
from eaglewire.predict.served import evaluate_served, float32_draft, served_records
from eaglewire.target.loading import LoadedTarget, load_target


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="HF directory, .gguf file or 'smollm2'")
    ap.add_argument("--draft", type=Path, required=True, help="the draft directory")
    ap.add_argument("--bench", type=Path, required=True, help="a bench.json with a plain method")
    ap.add_argument("--chain", type=int, default=5, help="draft tokens per round")
    ap.add_argument("--dtype", default="float32", help="the target's dtype for the replay")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"],
                    help="the draft's autocast: auto = bf16 on CUDA (as training and the bench's replay), fp32 elsewhere")  # fmt: skip
    ap.add_argument("--out", type=Path, help="JSON with one row per category and the whole set")
    return ap.parse_args(argv)


def differing_tokens(target: LoadedTarget, prompt_ids: list[list[int]], runs: list[PromptRun]) -> list[int]:
    """Per prompt: how many served tokens differ from the replay target's greedy token there
    (teacher-forced over prompt + served text, one prompt a forward)."""
    counts = []
    with torch.inference_mode():
        for ids, run in zip(prompt_ids, runs, strict=True):
            served = torch.tensor(run.token_ids, device=target.device)  # [T]
            seq = torch.tensor([[*ids, *run.token_ids]], device=target.device)  # [1, P + T]
            # position t predicts token t + 1: the last prompt position predicts the first served token
            logits = target.model(input_ids=seq, use_cache=False).logits[0, len(ids) - 1 : -1]  # [T, V]
            counts.append(int((logits.argmax(-1) != served).sum()))
    return counts


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = json.loads(args.bench.read_text())
    target = load_target(args.target, dtype=args.dtype, device=args.device)
    draft, contract = load_draft(args.draft, device=target.device)
    draft = float32_draft(draft)
    prompt_ids, plain = bench_plain_text(bench, target, args.bench)
    records = served_records(prompt_ids, plain.runs)
    differing = differing_tokens(target, prompt_ids, plain.runs)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, run in enumerate(plain.runs):  # each run keeps its prompt's category ("" when it has none)
        groups[run.category or "all"].append(i)
    rows: list[dict[str, Any]] = []
    for name, members in [*sorted(groups.items()), ("(whole set)", list(range(len(records))))]:
        evaluation = evaluate_served(
            target,
            draft,
            contract,
            [records[i] for i in members],
            num_steps=args.chain,
            precision=args.precision,
        )
        replay = evaluation.replay_chain(args.chain)
        acc = evaluation.summary()["acc"]
        out_of_vocab = evaluation.out_of_vocab_share()
        full_vocab = evaluation.without_vocab_misses().tau_chain(args.chain)
        differs = sum(differing[i] for i in members) / max(
            1, sum(len(plain.runs[i].token_ids) for i in members)
        )
        rows.append({"category": name, "prompts": len(members), "tau_chain": replay.tau, "rounds": replay.rounds,
                     "chain_acceptance": replay.per_position_acceptance, "acc": acc,
                     "out_of_vocab_share": out_of_vocab, "tau_chain_full_vocab": full_vocab,
                     "served_token_differs_share": differs})  # fmt: skip
        say(f"{name:>12} {len(members):3d} prompts  chain-{args.chain} tau {replay.tau:.3f}  acceptance "
            + " ".join(f"{a:.2f}" for a in replay.per_position_acceptance)
            + "  step accuracy " + " ".join(f"{a:.2f}" for a in acc)
            + f"  labels outside the draft vocab {100 * out_of_vocab[0]:.2f}% (tau {full_vocab:.3f} were they drafted right)"
            + f"  served tokens the replay target would not choose {100 * differs:.2f}%")  # fmt: skip
    if args.out:
        atomic_write_json(args.out, {"bench": str(args.bench), "draft": str(args.draft), "dtype": args.dtype,
                                     "precision": args.precision, "chain": args.chain, "rows": rows})  # fmt: skip
    return 0


if __name__ == "__main__":
    run_script(main)
