"""Where the draft's first guess fails: step-0 accuracy bucketed by how sure the target itself is.

For each prompt of a set the target answers greedily (batched, left-padded `generate`); one
target forward over prompt + answer gives the contract's states and the target's next-token
distribution at every position; the draft's training-time step 0 (`eaglewire.train.ttt`, the
first token of a serving round, from the target's own states) predicts each answer token. A hit
is the draft's argmax equal to the target's argmax (the greedy token, so a hit is an accepted
first draft). Positions are bucketed by the target's top-1 probability p1 (and its margin over
the runner-up): if the misses sit where the target itself is torn, the draft is not the problem.
A second table splits them by where in the answer the token lies (`ANSWER_SPANS`).

    PYTHONPATH=src:. python3 benchmarks/acceptance_by_confidence.py --draft D --prompts chitchat-eval \
        --num-prompts 8 --max-new-tokens 128 --out conf.json
    PYTHONPATH=src:. python3 benchmarks/acceptance_by_confidence.py --draft D --prompts "" --magpie 96

`--magpie N` adds N Magpie prompts sampled by the target now (another seed than the quickstart's):
text of the kind the draft trained on, which it never saw. Scored against the training batches'
own accuracy, that tells memorised data from a draft that cannot fit such text at all.

`--magpie-file RUN/data/magpie_prompts.jsonl` (a quickstart's own Magpie prompts) adds two sets drawn
from that one file: 'magpie-trained', the first N prompts of its train split (the draft trained on
their answers), and 'magpie-heldout', the first N of its held-out split (`eaglewire.data.builtin.
heldout_split`: the same sampling, never trained on). Both are answered here the same way, so the
gap between them is the draft's generalisation gap on that text, and 'magpie-trained' alone says how
well it fits text it has seen (its capacity).

Prints a Markdown table per prompt set last; writes --out (JSON).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import Any

import torch

from eaglewire.bench.prompts import BenchPrompt, encode_prompt, load_prompt_set
from eaglewire.bench.report import describe_device, now_iso
from eaglewire.data.builtin import heldout_split
from eaglewire.draft.io import load_draft
from eaglewire.errors import ConfigError, DataFormatError
from eaglewire.target.capture import capture
from eaglewire.target.loading import load_target
from eaglewire.train.ttt import ttt_unroll

log = logging.getLogger("acceptance_by_confidence")

BUCKETS = (0.0, 0.3, 0.5, 0.7, 0.9, 1.01)  # p1 edges: [lo, hi)
MARGIN_TIE = 0.1  # p1 - p2 below this: a near-tie
SURE = 0.9  # p1 at or above this: a token the target is sure of
# Where in the answer the label lies (token index, [lo, hi)): does the draft miss at the answer's start,
# where the prompt decides most, or all along it?
ANSWER_SPANS = ((1, 16), (16, 48), (48, 256))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="smollm2")
    p.add_argument("--draft", type=Path, required=True)
    p.add_argument("--prompts", default="chitchat-eval,humaneval-eval,mt-bench", help="comma-separated sets")
    p.add_argument("--num-prompts", type=int, default=8, help="first N prompts of each set (0 = all)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16, help="prompts answered together")
    p.add_argument("--magpie", type=int, default=0,
                   help="also score N fresh Magpie prompts the target samples now (set 'magpie-fresh'): text "
                        "of the training data's own kind that no draft was trained on")  # fmt: skip
    p.add_argument("--magpie-seed", type=int, default=777,
                   help="their sampling seed (the quickstart samples with seeds 0 up to its round count)")  # fmt: skip
    p.add_argument("--magpie-opened-fraction", type=float, default=0.5, help="as the gpu preset")
    p.add_argument("--magpie-file", type=Path, default=None,
                   help="a quickstart's data/magpie_prompts.jsonl: adds 'magpie-trained' and 'magpie-heldout', "
                        "the first --magpie-file-prompts prompts of its train and held-out splits")  # fmt: skip
    p.add_argument("--magpie-file-prompts", type=int, default=160, help="prompts per split of --magpie-file")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, default=Path("acceptance_by_confidence.json"))
    return p.parse_args(argv)


@torch.no_grad()
def greedy_answers(
    target: Any, prompts: list[list[int]], max_new_tokens: int, batch_size: int
) -> list[list[int]]:
    """The target's greedy answer to each prompt (token ids, eos excluded), batched with left padding."""
    model, dev = target.model, target.device
    eos = set(target.eos_token_ids)
    out: list[list[int]] = []
    for lo in range(0, len(prompts), batch_size):
        group = prompts[lo : lo + batch_size]
        width = max(len(p) for p in group)
        ids = torch.zeros(len(group), width, dtype=torch.long)  # [B, T] left-padded
        attn = torch.zeros(len(group), width, dtype=torch.long)
        for row, p in enumerate(group):
            ids[row, width - len(p) :] = torch.tensor(p)
            attn[row, width - len(p) :] = 1
        gen = model.generate(
            input_ids=ids.to(dev),
            attention_mask=attn.to(dev),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=sorted(eos),
            pad_token_id=0,
        )[:, width:]
        for row in gen.tolist():
            cut = next((i for i, t in enumerate(row) if t in eos), len(row))
            out.append(row[:cut])
        log.info("answered %d/%d prompts", len(out), len(prompts))
    return out


@torch.no_grad()
def score(
    target: Any, draft: Any, contract: Any, prompt: list[int], answer: list[int]
) -> dict[str, torch.Tensor]:
    """Per answer token (after the first): the target's p1 and p1 - p2 there, and whether the
    draft's step-0 argmax equals the target's argmax. Row t of step 0 reads h_t and x[t+1] and
    predicts x[t+2], which the target predicts at position t+1."""
    seq = torch.tensor(prompt + answer)[None]  # [1, T]
    T = seq.shape[1]
    states = capture(
        target.model,
        seq.to(target.device),
        aux_boundaries=contract.aux_boundaries,
        final=contract.final,
        return_logits=True,
    )
    probs = states.logits[0].float().softmax(-1)  # [T, V]
    top2 = probs.topk(2, dim=-1).values  # [T, 2]
    dev = next(draft.parameters()).device
    aux = states.aux.to(dev, next(draft.parameters()).dtype)  # [1, T, A*Ht]
    step0 = next(
        iter(
            ttt_unroll(
                draft, seq.to(dev), torch.arange(T, device=dev)[None], torch.zeros_like(seq).to(dev), aux, 1
            )
        )
    )
    guess = draft.to_target_ids(step0.logits.argmax(-1))[0].cpu()  # [T] row t: guess for x[t+2]
    label = probs.argmax(-1).cpu()  # [T] position t: the target's argmax for x[t+1]
    rows = torch.arange(len(prompt) - 1, T - 2)  # rows whose label is an answer token x[t+2] (not the first)
    return {
        "p1": top2[rows + 1, 0].cpu(),
        "margin": (top2[rows + 1, 0] - top2[rows + 1, 1]).cpu(),
        "hit": (guess[rows] == label[rows + 1]),
        "in_draft_vocab": torch.isin(label[rows + 1], draft.draft_to_target.cpu()),
        "answer_pos": rows + 2 - len(prompt),  # the label's index in the answer (1: its second token)
    }


def fresh_magpie_prompts(target: Any, n: int, seed: int, opened_fraction: float) -> list[BenchPrompt]:
    """n Magpie prompts sampled now (rounds of n rows until n are kept, `eaglewire.data.magpie`), as
    bench prompts."""
    from eaglewire.data.magpie import DEFAULT_MAGPIE_SAMPLING, generate_magpie_prompts

    sampling = dataclasses.replace(DEFAULT_MAGPIE_SAMPLING, batch_size=n, seed=seed)
    convs = generate_magpie_prompts(
        target, n, sampling=sampling, opened_fraction=opened_fraction, show_progress=False
    )
    return [BenchPrompt(c.record_id, (("user", c.messages[0].content),), "magpie") for c in convs]


def magpie_file_sets(path: Path, n: int) -> dict[str, list[BenchPrompt]]:
    """The first n prompts of each split of a quickstart's Magpie prompt file: 'magpie-trained' (train
    split) and 'magpie-heldout' (held-out split). Errors name the file and the split that is short."""
    if n < 1:
        raise ConfigError(f"--magpie-file-prompts: expected at least 1 prompt per split, got {n}")
    prompts = load_prompt_set(path).prompts
    by_split: dict[str, list[BenchPrompt]] = {"train": [], "eval": []}
    for prompt in prompts:
        split = heldout_split(prompt.prompt_id)
        if split is None:
            raise DataFormatError(
                f"{path}: prompt id {prompt.prompt_id!r} is not a Magpie id ('magpie:<hash>'), so its split "
                f"is unknown",
                fix="pass the quickstart's own RUN/data/magpie_prompts.jsonl",
            )
        by_split[split].append(prompt)
    short = {k: len(v) for k, v in by_split.items() if len(v) < n}
    if short:
        raise DataFormatError(
            f"{path}: --magpie-file-prompts {n} per split, but it holds only {short} (of {len(prompts)})",
            fix="pass a smaller --magpie-file-prompts",
        )
    return {"magpie-trained": by_split["train"][:n], "magpie-heldout": by_split["eval"][:n]}


def summarise(parts: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    p1 = torch.cat([x["p1"] for x in parts])
    margin = torch.cat([x["margin"] for x in parts])
    hit = torch.cat([x["hit"] for x in parts]).float()
    inv = torch.cat([x["in_draft_vocab"] for x in parts]).float()
    n = int(p1.numel())
    buckets = []
    for lo, hi in zip(BUCKETS[:-1], BUCKETS[1:], strict=True):
        sel = (p1 >= lo) & (p1 < hi)
        k = int(sel.sum())
        buckets.append(
            {"p1_from": lo, "p1_to": min(hi, 1.0), "share": k / n if n else 0.0,
             "step0_accuracy": float(hit[sel].mean()) if k else None, "positions": k}
        )  # fmt: skip
    pos = torch.cat([x["answer_pos"] for x in parts])
    by_position = []
    for lo, hi in ANSWER_SPANS:
        sel = (pos >= lo) & (pos < hi)
        sure = sel & (p1 >= SURE)
        k = int(sel.sum())
        by_position.append(
            {"answer_from": lo, "answer_to": hi, "share": k / n if n else 0.0,
             "step0_accuracy": float(hit[sel].mean()) if k else None,
             "sure_accuracy": float(hit[sure].mean()) if int(sure.sum()) else None}
        )  # fmt: skip
    tie = margin < MARGIN_TIE
    return {
        "positions": n,
        "step0_accuracy": float(hit.mean()) if n else None,
        "label_in_draft_vocab": float(inv.mean()) if n else None,
        "near_tie_share": float(tie.float().mean()) if n else None,
        "near_tie_accuracy": float(hit[tie].mean()) if int(tie.sum()) else None,
        "clear_accuracy": float(hit[~tie].mean()) if int((~tie).sum()) else None,
        "misses_at_near_ties": float(((1 - hit) * tie.float()).sum() / (1 - hit).sum())
        if float((1 - hit).sum())
        else None,
        "buckets": buckets,
        "by_answer_position": by_position,
    }


def fmt(value: float | None, spec: str = ".3f") -> str:
    """A table cell: '-' where there was nothing to measure (no near-ties, no misses, an empty bucket)."""
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    target = load_target(args.target, dtype="float32", device=args.device)
    draft, contract = load_draft(args.draft, device=args.device)
    draft.eval()
    result: dict[str, Any] = {
        "benchmark": "acceptance_by_confidence",
        "date": now_iso(),
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "device": describe_device(target.device),
        "draft": str(args.draft),
        "max_new_tokens": args.max_new_tokens,
        "near_tie_margin": MARGIN_TIE,
        "sets": {},
    }
    prompt_sets = {
        name: load_prompt_set(name, args.num_prompts or None).prompts
        for name in args.prompts.split(",")
        if name
    }
    if args.magpie:
        prompt_sets["magpie-fresh"] = fresh_magpie_prompts(
            target, args.magpie, args.magpie_seed, args.magpie_opened_fraction
        )
    if args.magpie_file is not None:
        prompt_sets.update(magpie_file_sets(args.magpie_file, args.magpie_file_prompts))
    for name, bench_prompts in prompt_sets.items():
        prompts = [encode_prompt(target.tokenizer, p) for p in bench_prompts]
        answers = greedy_answers(target, prompts, args.max_new_tokens, args.batch_size)
        parts = [
            score(target, draft, contract, p, a) for p, a in zip(prompts, answers, strict=True) if len(a) > 2
        ]
        result["sets"][name] = {"prompts": len(prompts), **summarise(parts)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    for name, s in result["sets"].items():
        print(f"\n{name}: {s['prompts']} prompts, {s['positions']} answer positions, step-0 accuracy "
              f"{fmt(s['step0_accuracy'])}; near-ties (p1 - p2 < {MARGIN_TIE}) {fmt(s['near_tie_share'], '.1%')} of "
              f"positions at accuracy {fmt(s['near_tie_accuracy'])}, the rest {fmt(s['clear_accuracy'])}; "
              f"{fmt(s['misses_at_near_ties'], '.1%')} of misses at near-ties")  # fmt: skip
        print("| target p1 | share of positions | draft step-0 accuracy |")
        print("|---|---|---|")
        for b in s["buckets"]:
            print(f"| {b['p1_from']:.1f}-{b['p1_to']:.1f} | {b['share']:.1%} | {fmt(b['step0_accuracy'])} |")
        print(f"\n| answer tokens | share of positions | draft step-0 accuracy | where p1 >= {SURE} |")
        print("|---|---|---|---|")
        for b in s["by_answer_position"]:
            print(f"| {b['answer_from']}-{b['answer_to'] - 1} | {b['share']:.1%} | {fmt(b['step0_accuracy'])} "
                  f"| {fmt(b['sure_accuracy'])} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
