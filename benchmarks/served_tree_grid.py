"""Which tree shapes would pass a tau goal on a prompt set? Predicted offline on the text it served.

A sweep measures each tree shape on a GPU; this predicts many shapes on any machine, from a bench
run that has already happened: its plain method's generated tokens (the target's greedy text, which
every lossless setting serves too) become records, one evaluation of the draft over them runs
(`eaglewire.predict.served.evaluate_served`), and each shape is replayed on it as the static tree
`predictor.tree_for_spec` builds (cheap, but 5-7% below the H200's measured dynamic trees,
BENCHMARKS.md 2p). With `--dynamic` each shape is also decoded by the engine's own drafter over the
text (`predict.text_replay`, what `eaglewire bench` now reports as a tree's served prediction: the real
dynamic tree, no target forward per round; within 1-2% of the H200's measurement). The bench's own
measured trees are printed beside the predictions.

    python benchmarks/served_tree_grid.py --draft DRAFT --bench RUN/decode/mt-bench-all/bench.json \
        --trees 8,8,128 10,8,256 8,10,256 --device cpu --out grid.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from eaglewire.bench.saved import bench_plain_text
from eaglewire.cli.common import run_script
from eaglewire.draft.io import load_draft
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.io_utils import atomic_write_json
from eaglewire.predict.predictor import predict_tau
from eaglewire.predict.served import evaluate_served, float32_draft, served_records
from eaglewire.predict.text_replay import replay_on_texts, text_aux
from eaglewire.target.loading import load_target


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--draft", type=Path, required=True)
    ap.add_argument("--bench", type=Path, required=True, help="a bench.json whose plain method ran")
    ap.add_argument("--trees", nargs="+", required=True, metavar="STEPS,TOPK,NODES")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dynamic", action="store_true", help="also replay each shape's dynamic tree (slower)")
    ap.add_argument("--out", type=Path, default=Path("served_tree_grid.json"))
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = json.loads(args.bench.read_text())
    trees = [SpecArgs(*(int(x) for x in t.split(","))) for t in args.trees]
    target = load_target(args.target, dtype=args.dtype, device=args.device)
    draft, contract = load_draft(args.draft, device=target.device)
    prompt_ids, plain = bench_plain_text(bench, target, args.bench)
    t0 = time.perf_counter()
    evaluation = evaluate_served(
        target, float32_draft(draft), contract, served_records(prompt_ids, plain.runs),
        num_steps=max(t.num_steps for t in trees),
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    measured = {
        (m["settings"].get("num_steps"), m["settings"].get("topk"), m["settings"].get("num_draft_tokens")): m["tau"]
        for name, m in bench["methods"].items()
        if name.startswith("eagle-") and m.get("available")
    }  # fmt: skip
    texts = [(p, r.token_ids) for p, r in zip(prompt_ids, plain.runs, strict=True)]
    auxes = [text_aux(target, contract, [*p, *g]) for p, g in texts] if args.dynamic else []
    rows = []
    for t in trees:
        shape = (t.num_steps, t.topk, t.num_draft_tokens)
        row = {"num_steps": t.num_steps, "topk": t.topk, "num_draft_tokens": t.num_draft_tokens,
               "predicted_tau": predict_tau(evaluation, t), "measured_tau": measured.get(shape)}  # fmt: skip
        if args.dynamic:
            t1 = time.perf_counter()
            replay = replay_on_texts(draft, t, texts, auxes, vocab_size=target.vocab_size,
                                     num_layers=target.num_layers)  # fmt: skip
            row |= {"dynamic_tau": replay.tau, "dynamic_seconds": round(time.perf_counter() - t1, 1),
                    "dynamic_per_position_acceptance": replay.per_position_acceptance(t.num_steps)}  # fmt: skip
        rows.append(row)
    out = {"bench": str(args.bench), "draft": str(args.draft), "prompts": bench["prompts"],
           "num_prompts": bench["num_prompts"], "generated_tokens": plain.new_tokens, "dtype": args.dtype,
           "device": args.device, "evaluation_seconds": round(seconds, 1), "rows": rows}  # fmt: skip
    atomic_write_json(args.out, out)
    print(
        f"{bench['prompts']} ({bench['num_prompts']} prompts, {plain.new_tokens} tokens), evaluated in {seconds:.1f} s"
    )
    print(f"{'tree':<12} {'static':>7} {'dynamic':>8} {'measured':>9}")
    for r in rows:
        m = "-" if r["measured_tau"] is None else f"{r['measured_tau']:.2f}"
        d = f"{r['dynamic_tau']:.2f}" if "dynamic_tau" in r else "-"
        label = f"{r['num_steps']}x{r['topk']}x{r['num_draft_tokens']}"
        print(f"{label:<12} {r['predicted_tau']:7.2f} {d:>8} {m:>9}")
    return 0


if __name__ == "__main__":
    run_script(main)
