"""The TTT unroll's two attention forms side by side: blocked SDPA (`ttt._ChainKeys`) and
block-sparse FlexAttention (`ttt_flex.FlexChainKeys`).

A draft shaped for SmolLM2-135M (hidden 576, 9 heads / 3 KV heads, MLP 1536, Vd 16384) with random
weights, 16 packed rows of ~1,020 tokens holding records of 40-460 tokens, 7 steps, bf16 autocast
as in training. Per form: the first call's seconds (FlexAttention compiles then), then the median
of `--repeats` timed forward+backward passes (CUDA events, after warm-up). Correctness in float32
on a smaller batch: the largest difference of each step's output and of the parameter gradients
between the forms.

    PYTHONPATH=src python benchmarks/ttt_attention_speed.py            # on a GPU
    PYTHONPATH=src python benchmarks/ttt_attention_speed.py --tiny     # CPU: forward equality only
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Literal

import torch

from eaglewire.draft.config import DraftConfig
from eaglewire.draft.model import Eagle3Draft
from eaglewire.train.ttt import ttt_unroll

Form = Literal["blocked", "flex"]


def draft_config(tiny: bool) -> DraftConfig:
    if tiny:
        h, heads, kv, inter, vocab, vd = 64, 4, 2, 128, 512, 256
    else:
        h, heads, kv, inter, vocab, vd = 576, 9, 3, 1536, 49152, 16384
    return DraftConfig(
        hidden_size=h,
        intermediate_size=inter,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=h // heads,
        vocab_size=vocab,
        draft_vocab_size=vd,
        target_hidden_size=h,
        num_aux=3,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        max_position_embeddings=8192,
    )


def packed_batch(
    cfg: DraftConfig, rows: int, length: int, min_rec: int, max_rec: int, gen: torch.Generator
) -> dict[str, torch.Tensor]:
    """Rows of records packed back to back (positions restart per record), padding at row ends."""
    doc = torch.full((rows, length), -1, dtype=torch.long)
    pos = torch.zeros(rows, length, dtype=torch.long)
    k = 0
    for b in range(rows):
        t = 0
        while length - t >= min_rec:  # the rest stays padding
            n = min(int(torch.randint(min_rec, max_rec + 1, (1,), generator=gen)), length - t)
            doc[b, t : t + n], pos[b, t : t + n] = k, torch.arange(n)
            t, k = t + n, k + 1
    ids = torch.randint(0, cfg.vocab_size, (rows, length), generator=gen)
    aux = torch.randn(rows, length, cfg.aux_width, generator=gen)
    return {"input_ids": ids, "positions": pos, "doc_ids": doc, "aux": aux}


def unroll(draft: Eagle3Draft, batch: dict[str, torch.Tensor], steps: int, form: Form) -> list[torch.Tensor]:
    outs = ttt_unroll(
        draft, batch["input_ids"], batch["positions"], batch["doc_ids"], batch["aux"], steps, attention=form
    )
    return [o.logits for o in outs]


def loss_of(logits: list[torch.Tensor]) -> torch.Tensor:
    return sum((x.float().logsumexp(-1).mean() for x in logits), torch.zeros(()))


def timed(draft: Eagle3Draft, batch: dict[str, torch.Tensor], steps: int, form: Form, repeats: int) -> dict:
    def once() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(unroll(draft, batch, steps, form)).to(batch["aux"].device)
        loss.backward()
        draft.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    once()
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    once()  # warm-up
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        once()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return {"form": form, "first_call_s": round(first_s, 2), "fwd_bwd_ms": round(statistics.median(times), 2)}


def compare(cfg: DraftConfig, device: str, steps: int, tiny: bool, gen: torch.Generator) -> dict:
    """float32: largest |difference| of step outputs (and, on CUDA, of gradients) between the forms."""
    torch.manual_seed(0)
    draft = Eagle3Draft(cfg).to(device)
    rows, length = (2, 150) if tiny else (4, 700)
    batch = {k: v.to(device) for k, v in packed_batch(cfg, rows, length, 20, 300, gen).items()}
    if int(batch["doc_ids"].max()) < 1:
        raise SystemExit("packed_batch made fewer than two records: the comparison would test nothing")
    result: dict = {}
    grads: dict[str, dict[str, torch.Tensor]] = {}
    outs: dict[str, list[torch.Tensor]] = {}
    for form in ("blocked", "flex"):
        with torch.set_grad_enabled(device == "cuda"):  # FlexAttention has no CPU backward
            outs[form] = unroll(draft, batch, steps, form)
            if device == "cuda":
                loss_of(outs[form]).to(device).backward()
                grads[form] = {
                    n: p.grad.detach().clone() for n, p in draft.named_parameters() if p.grad is not None
                }
                draft.zero_grad(set_to_none=True)
    real = (batch["doc_ids"] >= 0)[..., None]
    result["max_logit_diff_per_step"] = [
        float(((a - b).abs() * real).max()) for a, b in zip(outs["blocked"], outs["flex"], strict=True)
    ]
    if grads:
        result["max_rel_grad_diff"] = max(
            float(
                (grads["blocked"][n] - grads["flex"][n]).abs().max()
                / grads["blocked"][n].abs().max().clamp_min(1e-12)
            )
            for n in grads["blocked"]
        )
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="CPU: a tiny draft, forward equality only")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--length", type=int, default=1019, help="row length (not a multiple of 128 on purpose)")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="", help="write the results as JSON here")
    args = ap.parse_args()
    device = "cpu" if args.tiny else "cuda"
    cfg = draft_config(args.tiny)
    gen = torch.Generator().manual_seed(0)
    report: dict = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
    }
    report["correctness_float32"] = compare(cfg, device, args.steps, args.tiny, gen)
    print(json.dumps(report["correctness_float32"]), flush=True)
    if device == "cuda":
        draft = Eagle3Draft(cfg).to(device)
        batch = {k: v.to(device) for k, v in packed_batch(cfg, args.rows, args.length, 40, 460, gen).items()}
        report["shape"] = {"rows": args.rows, "length": args.length, "steps": args.steps}
        report["timing"] = []
        for form in ("blocked", "flex"):
            row = timed(draft, batch, args.steps, form, args.repeats)
            report["timing"].append(row)
            print(json.dumps(row), flush=True)
        base = report["timing"][0]["fwd_bwd_ms"]
        print("form | first call s | fwd+bwd ms | vs blocked")
        for row in report["timing"]:
            print(
                f"{row['form']} | {row['first_call_s']} | {row['fwd_bwd_ms']} | {base / row['fwd_bwd_ms']:.2f}x"
            )
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
