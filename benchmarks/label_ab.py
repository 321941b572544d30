"""Does the training label's hard share move greedy acceptance? Continuations of one trained draft.

Greedy serving accepts a draft token exactly when it is the target's argmax. Soft labels (EAGLE-3)
train the draft towards the target's whole distribution; hard labels (`TrainConfig.
hard_label_weight` = 1) towards the chance that each token *is* that argmax, which is what a
chain or a greedy tree ranks by. This script takes one trained draft (the quickstart's), continues
it for the same wall time once per weight, from the same start, data, seed and schedule, and
scores each continuation, and the start itself, by the held-out replay of what the benchmark
serves (each record's first answer, its first `--horizon` tokens): the quickstart's own
prediction of the measured tau (BENCHMARKS.md: within 0.4-7% of it on every H200 run).

    python benchmarks/label_ab.py --data RUN/data/train --eval-data RUN/data/eval \
        --draft RUN/train/draft --weights 0,1 --seconds 90 --out label_ab.json     # on the GPU
    python benchmarks/label_ab.py --data ... --seconds 20 --device cpu ...           # CPU check

H200 run 10 (BENCHMARKS.md 2j): from a hard-label draft, 60 s more of hard labels predicted chain
3.03 and soft 2.96 (start 2.99), while the served trees of the hard-label draft were shorter than
the soft-label run 9's on code and MT-bench.

The continuation with weight 0 is the control: it trains as long as the others with the labels the
start was trained on (when the start was soft), so extra training alone is not mistaken for the
label's effect.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from draft_levers import replay_scores, say  # benchmarks/ is the script's folder: on sys.path

from eaglewire.engine.spec_args import SpecArgs
from eaglewire.train.config import TrainConfig
from eaglewire.train.run import run_training


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--data", type=Path, required=True, help="training data (tokenized dataset or shards)")
    ap.add_argument("--eval-data", type=Path, required=True, help="held-out data of the same kind")
    ap.add_argument(
        "--draft", type=Path, required=True, help="the trained draft every continuation starts from"
    )
    ap.add_argument("--weights", default="0,1", help="hard_label_weight of each continuation")
    ap.add_argument("--seconds", type=float, default=90.0, help="training wall time of each continuation")
    ap.add_argument("--learning-rate", type=float, default=1e-4)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-length", type=int, default=1024)
    ap.add_argument("--ttt-steps", type=int, default=7)
    ap.add_argument("--chain", type=int, default=5, help="chain length predicted")
    ap.add_argument("--tree", default="8,8,128", help="num_steps,topk,num_draft_tokens of the tree predicted")
    ap.add_argument("--horizon", type=int, default=128, help="tokens per answer replayed (the decode length)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--work", type=Path, default=None, help="run directories (default: beside --out)")
    ap.add_argument("--out", type=Path, default=Path("label_ab.json"))
    return ap.parse_args(argv)


def score(args: argparse.Namespace, draft_dir: Path, tree: SpecArgs) -> dict[str, Any]:
    return replay_scores(
        args.target, draft_dir, args.eval_data, chain=args.chain, tree=tree, horizon=args.horizon,
        ttt_steps=args.ttt_steps, device=args.device,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    weights = [float(w) for w in args.weights.split(",")]
    tree = SpecArgs(*(int(x) for x in args.tree.split(",")))
    work = args.work or args.out.with_suffix("")
    rows: list[dict[str, Any]] = []
    say(f"start draft {args.draft}")
    rows.append({"run": "start", "hard_label_weight": None, "seconds": 0.0, **score(args, args.draft, tree)})
    for w in weights:
        config = TrainConfig(
            ttt_steps=args.ttt_steps,
            max_length=args.max_length,
            batch_size=args.batch_size,
            learning_rate=args.learning_rate,
            warmup_ratio=0.05,
            min_lr_ratio=0.1,
            epochs=100,  # the wall time decides
            max_seconds=args.seconds,
            log_every=10,
            hard_label_weight=w,
        )
        say(f"continuation hard_label_weight={w}: {args.seconds:.0f} s")
        trained = run_training(
            target=args.target,
            data_dir=args.data,
            out_dir=work / f"hard{w:g}",
            config=config,
            draft_init=args.draft,
            device=args.device,
            progress=False,
        )
        rows.append(
            {
                "run": f"hard{w:g}",
                "hard_label_weight": w,
                "seconds": args.seconds,
                "optimizer_steps": trained.optimizer_steps,
                "tokens": trained.tokens,
                **score(args, trained.draft_dir, tree),
            }
        )
        args.out.write_text(
            json.dumps({"args": vars(args) | {"tree": args.tree}, "rows": rows}, indent=2, default=str)
        )
    print(f"{'run':<8} {'w':>4} {'steps':>6} {'chain ' + str(args.chain):>8} {'tree':>6}  acc per step")
    for r in rows:
        w = "-" if r["hard_label_weight"] is None else f"{r['hard_label_weight']:g}"
        acc = " ".join(f"{a:.3f}" for a in r["acc"][: args.chain + 1])
        steps = r.get("optimizer_steps", 0)
        print(f"{r['run']:<8} {w:>4} {steps:>6} {r['tau_chain']:8.3f} {r['tau_tree']:6.3f}  {acc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
