"""Scale model per batch size: the cost of a batched round at a large target's shape, and the
speed-up it projects at a measured tau (`BatchRule` arithmetic at the 8B shape).

A round's cost hardly depends on what was accepted (every row drafts and verifies its whole tree;
only the commit's copy varies), so random weights measure it: at each batch size B, B requests of
random prompts decode `--rounds` rounds through the real engine (`engine.batch`: CUDA graphs per
bucket, torch.compile), plainly and with each setting; the median round at bucket B is the cost.
The projection uses the tau each setting reached on a real prompt set (`--taus`, e.g. the
batched bench's MT-bench tau at batch 1):

    projected speed-up(B) = tau * plain round(B) / round(B)      (auto-off: plain where <= 1.0)

    python benchmarks/scale_batch.py --taus 5x1x6=2.7,8x12x128=4.5 --out scale-batch   # on a GPU
    python benchmarks/scale_batch.py --tiny --out /tmp/scale-batch                     # CPU check
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

if __package__ in (None, ""):  # run as a file: make the sibling benchmark modules importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.engine_speed import build_target
from benchmarks.scale_model import DRAFT_VOCAB, scale_draft

from eaglewire.bench.report import describe_device, now_iso
from eaglewire.cli.common import run_script
from eaglewire.contract.numbering import default_boundaries
from eaglewire.engine.batch.drafter import BatchDrafter
from eaglewire.engine.batch.engine import BatchEngine, BatchRequest, setting_label
from eaglewire.engine.runners.fast.runner import FastTargetRunner
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.engine.verify import StopRule
from eaglewire.io_utils import atomic_write_json
from eaglewire.predict.by_batch import PLAIN, BatchRule

KEY_SUFFIX = {"llama-3.1-8b": "8b", "smollm2-135m": "135m", "tiny": "tiny"}


def parse_setting(text: str) -> SpecArgs:
    steps, topk, nodes = (int(v) for v in text.lower().split("x"))
    return SpecArgs(num_steps=steps, topk=topk, num_draft_tokens=nodes)


def round_costs(
    runner: FastTargetRunner,
    drafter: BatchDrafter,
    spec: SpecArgs | None,
    batch: int,
    prompt_tokens: int,
    rounds: int,
    seed: int,
) -> float:
    """Median seconds of a round at bucket `batch` (after a warm-up decode of the same shape)."""
    rng = random.Random(seed)
    vocab = runner.vocab_size

    def requests() -> list[BatchRequest]:
        return [
            BatchRequest([rng.randrange(vocab) for _ in range(prompt_tokens)], StopRule(rounds))
            for _ in range(batch)
        ]

    engine = BatchEngine(
        runner, drafter if spec is not None else None, max_rows=batch, policy=lambda _n: spec
    )
    engine.run(requests())  # warm-up: compiles and captures this bucket's graphs
    engine.stats.seconds.clear()
    engine.run(requests())
    samples = engine.stats.seconds.get((batch, setting_label(spec)), [])
    return statistics.median(samples) if samples else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(KEY_SUFFIX))
    ap.add_argument("--batch-sizes", default="1,2,4,8,16,32,64")
    ap.add_argument("--taus", default="5x1x6=2.7,8x12x128=4.5", help="setting=tau pairs, comma-separated")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="context of every row")
    ap.add_argument("--rounds", type=int, default=24, help="rounds timed per batch size and setting")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tiny", action="store_true", help="tiny shape on CPU, float32")
    args = ap.parse_args(argv)
    if args.tiny:
        device, dtype, args.shape = torch.device("cpu"), torch.float32, "tiny"
        torch.set_num_threads(1)
        args.batch_sizes, args.rounds, args.prompt_tokens, args.taus = "1,2", 3, 8, "3x1x4=2.0,3x2x5=2.2"
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sizes = sorted({int(b) for b in args.batch_sizes.split(",")})
    taus = {label: float(t) for label, t in (pair.split("=") for pair in args.taus.split(","))}
    specs = {label: parse_setting(label) for label in taus}
    start = time.perf_counter()
    target = build_target(args.shape, device, dtype)
    widest = max(specs.values(), key=lambda s: s.num_draft_tokens)
    max_seq_len = args.prompt_tokens + args.rounds * (widest.num_steps + 1) + widest.num_draft_tokens + 1
    runner = FastTargetRunner(
        target, default_boundaries(target.num_layers), max_batch_size=max(sizes), max_seq_len=max_seq_len
    )
    runner.reserve_verify_width(widest.num_draft_tokens)
    draft = scale_draft(target, DRAFT_VOCAB.get(args.shape, 256), head_logit_std=20.0)
    drafter = BatchDrafter(draft, widest, max_rows=max(sizes), max_seq_len=max_seq_len)
    costs: dict[str, dict[int, float]] = {PLAIN: {}}
    for batch in sizes:
        costs[PLAIN][batch] = round_costs(
            runner, drafter, None, batch, args.prompt_tokens, args.rounds, batch
        )
        for label, spec in specs.items():
            costs.setdefault(label, {})[batch] = round_costs(
                runner, drafter, spec, batch, args.prompt_tokens, args.rounds, batch
            )
        print(
            f"B={batch}: " + ", ".join(f"{k} {1e3 * v[batch]:.2f} ms" for k, v in costs.items()), flush=True
        )
    rule = BatchRule(
        device=describe_device(device),
        dtype=str(dtype).removeprefix("torch."),
        taus=taus,
        round_seconds=costs,
        tau_source="given (--taus)",
        measured_at=now_iso(),
        command="python benchmarks/scale_batch.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        notes=[f"random weights at the {args.shape} shape, {args.prompt_tokens}-token contexts"],
    )
    suffix = KEY_SUFFIX[args.shape]
    result: dict[str, Any] = {
        "shape": args.shape,
        "rule": rule.to_json(),
        f"projected_{suffix}_speedup_by_batch": {
            label: {str(b): rule.predicted_speedup(label, b) for b in sizes} for label in taus
        },
        f"projected_{suffix}_auto_speedup_by_batch": {
            str(b): max([1.0] + [rule.predicted_speedup(label, b) or 0.0 for label in taus]) for b in sizes
        },
        "seconds": time.perf_counter() - start,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out / "scale_batch.json", result)
    lines = [
        "| B | plain ms | " + " | ".join(f"{k} ms (x)" for k in taus) + " | auto |",
        "|---" * (len(taus) + 3) + "|",
    ]
    for b in sizes:
        cells = [str(b), f"{1e3 * costs[PLAIN][b]:.2f}"]
        cells += [f"{1e3 * costs[k][b]:.2f} ({rule.predicted_speedup(k, b) or 0:.2f}x)" for k in taus]
        cells.append(f"{result[f'projected_{suffix}_auto_speedup_by_batch'][str(b)]:.2f}x ({rule.choice(b)})")
        lines.append("| " + " | ".join(cells) + " |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    run_script(main)
