"""Why a method's greedy text parts from plain greedy: the target's logit margin where it parts.

Speculative greedy decoding emits exactly plain greedy's tokens in exact arithmetic (and in the
float32 tests). In bf16 the verify forward (N tree tokens at once) and plain decoding (one token,
KV-cached, CUDA-graphed) round differently, so where the target's two best tokens are nearly tied
the argmax can flip, and from there the texts differ. So for each first difference this asks the
target itself, through its own full transformers forward (no cache) on the prompt plus the
reference's prefix: how much did it prefer the reference's token over the other method's?
`Mismatch.margin` holds that difference of logits, logit(reference token) - logit(this method's
token), and `cause_of` reads it with the run's dtype's tie threshold:

* `ROUNDING`: |margin| <= threshold; either decode's rounding can flip a tie that close.
* `THIS_METHOD`: margin > threshold; the target clearly prefers the reference's token and this
  method picked another: a bug in this method (wrong K/V, wrong positions, a wrong accepted path).
* `REFERENCE`: margin < -threshold; the target's own forward clearly prefers this method's token,
  so it is the reference (plain's incremental decode) that drifted from the target's forward
  there. Worth reporting, but it does not make this method wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from eaglewire.bench.results import Cause, Mismatch, PromptRun
from eaglewire.target.loading import LoadedTarget

# Largest |margin| (logits) that the run's dtype's rounding is taken to explain. bf16 keeps 8 bits
# of mantissa: SmolLM2's top logits (~15-30) are spaced 0.125 apart, and a 30-layer forward whose
# matmuls are split differently (N tokens vs 1) moves them by a few of those steps. float32 runs
# are exact in the tests: any margin there beyond accumulation noise is not rounding.
NEAR_TIE_LOGITS = {"bfloat16": 0.5, "float16": 0.25, "float32": 1e-3}

ROUNDING: Cause = "rounding"
THIS_METHOD: Cause = "this method"
REFERENCE: Cause = "the reference"


def cause_of(margin: float | None, dtype: str) -> Cause | None:
    """What explains a first difference of `margin` (logits; None: not measured, giving None) in a
    run of `dtype`: its rounding, a bug in this method, or the reference's drift (module docstring)."""
    if margin is None:
        return None
    threshold = NEAR_TIE_LOGITS.get(dtype, NEAR_TIE_LOGITS["float32"])
    if abs(margin) <= threshold:
        return ROUNDING
    # the sign says whose token the target's own forward prefers: the reference's (this method
    # erred) or this method's (the reference's decode drifted from the target's forward)
    return THIS_METHOD if margin > 0 else REFERENCE


@torch.no_grad()
def add_margins(
    target: LoadedTarget,
    prompt_ids: Mapping[str, Sequence[int]],
    reference: Sequence[PromptRun],
    mismatches: Sequence[Mismatch],
    *,
    dtype: str,
) -> None:
    """Fill `margin` and `cause` (for `dtype`, the run's) of each mismatch: logit(reference token) -
    logit(this method's token) at the first differing position, the target run on the prompt plus
    the reference's tokens before it. prompt_ids: each prompt id's token ids; reference: the
    reference method's runs. A mismatch where one text ended (no token to compare) keeps margin
    and cause None."""
    runs = {r.prompt_id: r for r in reference}
    for mm in mismatches:
        if mm.token is None or mm.reference_token is None:
            continue
        ids = [*prompt_ids[mm.prompt_id], *runs[mm.prompt_id].token_ids[: mm.position]]
        input_ids = torch.tensor([ids], dtype=torch.long, device=target.device)  # [1, T]
        logits = target.model(input_ids=input_ids, use_cache=False, logits_to_keep=1).logits[0, -1]
        logits = logits.float()  # [V]
        mm.margin = float(logits[mm.reference_token] - logits[mm.token])
        mm.cause = cause_of(mm.margin, dtype)
