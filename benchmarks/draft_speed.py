"""Drafting speed: one round's `draft_tree` and `extend` with CUDA graphs vs eager, same trees.

A random-weight draft of the SmolLM2-135M shape (hidden 576, 3 aux layers, Vd 16,384; weights do
not change speed), batch 1, a committed context of 512 rows. Each setting is timed as a round:
draft a tree, then extend by `n` committed rows (a typical accepted path + bonus).

    python benchmarks/draft_speed.py --out draft_speed.json     # on a GPU
    python benchmarks/draft_speed.py --tiny                     # CPU check of this script

Timings: CUDA events (perf_counter on CPU) after warm-up, median of repeats. Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig

from eaglewire.draft.config import draft_config_for_target
from eaglewire.draft.model import Eagle3Draft
from eaglewire.engine.drafting import Drafter
from eaglewire.engine.sampling import SamplingParams
from eaglewire.engine.spec_args import SpecArgs

SMOLLM2 = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    max_position_embeddings=8192,
    rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
    rms_norm_eps=1e-5,
)
TINY = dict(
    SMOLLM2,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
)


def timed(fn: Callable[[], Any], device: torch.device, repeats: int, calls: int) -> float:
    """Median milliseconds per call of `fn`, after two warm-up calls."""
    fn(), fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / calls)
        else:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter() - t0) * 1e3 / calls)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a tiny draft on CPU (checks the script)")
    ap.add_argument("--context", type=int, default=512, help="committed rows before timing")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None, help="write the results here as JSON")
    args = ap.parse_args()

    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    shape = TINY if args.tiny else SMOLLM2
    cfg = draft_config_for_target(
        LlamaConfig(**shape), num_aux=3, draft_vocab_size=min(16384, shape["vocab_size"])
    )
    torch.manual_seed(0)
    draft = Eagle3Draft(cfg).to(device=device, dtype=dtype).eval()
    aux = torch.randn(args.context, cfg.aux_width, device=device, dtype=dtype)  # [T, A*Ht]
    tokens = torch.randint(0, shape["vocab_size"], (args.context,))
    specs = {"chain 5": SpecArgs.chain(5), "tree 6x4x16": SpecArgs(6, 4, 16), "tree 5x4x8": SpecArgs(5, 4, 8)}
    # (cuda_graphs, compile): eager; graphs; graphs around torch.compile'd draft forwards
    graph_modes = [(False, False)] if device.type == "cpu" else [(False, False), (True, False), (True, True)]
    rows: list[dict[str, Any]] = []
    for name, spec in specs.items():
        trees = {}
        for graphs, compiled in graph_modes:
            drafter = Drafter(
                draft, spec, max_seq_len=args.context + 256, cuda_graphs=graphs, compile=compiled
            )
            n = min(3, spec.num_steps + 1)

            def one_round(drafter: Drafter = drafter, spec: SpecArgs = spec, n: int = n) -> torch.Tensor:
                drafter.reset()
                drafter.extend(aux[:-n], tokens[:-n], start_position=0)
                tree = drafter.draft_tree(int(tokens[-n]), args.context - n, SamplingParams())
                drafter.extend(aux[-n:], tokens[-n:], start_position=args.context - n)
                return tree.tokens.clone()

            trees[(graphs, compiled)] = one_round()
            drafter.reset()
            drafter.extend(aux[:-n], tokens[:-n], start_position=0)
            tree_ms = timed(
                lambda d=drafter, n=n: d.draft_tree(int(tokens[-n]), args.context - n, SamplingParams()),
                device,
                args.repeats,
                args.calls,
            )

            def extend_rows(d: Drafter = drafter, n: int = n) -> None:
                d.committed = args.context - n  # re-commit the same n rows (same window every call)
                d.extend(aux[-n:], tokens[-n:], start_position=args.context - n)

            extend_ms = timed(extend_rows, device, args.repeats, args.calls)
            rows.append(
                {
                    "spec": name,
                    "cuda_graphs": graphs,
                    "compile": compiled,
                    "draft_tree_ms": tree_ms,
                    f"extend_{n}_ms": extend_ms,
                    "same_tree_as_eager": bool(
                        torch.equal(trees[(False, False)].cpu(), trees[(graphs, compiled)].cpu())
                    ),
                }
            )
    result = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dtype": str(dtype),
        "context": args.context,
        "rows": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    print(
        f"{'spec':<14} {'graphs':<7} {'compile':<8} {'draft_tree ms':>14} {'extend ms':>10}  same tree as eager"
    )
    for r in rows:
        ext = next(v for k, v in r.items() if k.startswith("extend_"))
        print(
            f"{r['spec']:<14} {r['cuda_graphs']!s:<7} {r['compile']!s:<8} {r['draft_tree_ms']:>14.3f} {ext:>10.3f}  "
            f"{r['same_tree_as_eager']}"
        )


if __name__ == "__main__":
    main()
