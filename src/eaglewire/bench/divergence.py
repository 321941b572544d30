"""Why a method's greedy text parts from plain greedy: the target's logit margin where it parts.

Speculative greedy decoding emits exactly plain greedy's tokens in exact arithmetic (and in the
float32 tests). In bf16 the verify forward (N tree tokens at once) and plain decoding (one token)
round differently, so where the target's two best tokens are nearly tied the argmax can flip, and
from there the texts differ. A flip at a clear margin is a bug (wrong K/V, wrong positions, a
wrong accepted path), not rounding. So for each first difference this asks the target itself,
through its transformers forward on the reference's prefix: how much did it prefer the
reference's token over the other method's? `Mismatch.margin` holds that difference of logits;
`is_near_tie` says whether rounding in the run's dtype can explain it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from eaglewire.bench.results import Mismatch, PromptRun
from eaglewire.target.loading import LoadedTarget

# Largest margin (logits) that the run's dtype's rounding is taken to explain. bf16 keeps 8 bits
# of mantissa: SmolLM2's top logits (~15-30) are spaced 0.125 apart, and a 30-layer forward whose
# matmuls are split differently (N tokens vs 1) moves them by a few of those steps. float32 runs
# are exact in the tests: any margin there beyond accumulation noise is a bug.
NEAR_TIE_LOGITS = {"bfloat16": 0.5, "float16": 0.25, "float32": 1e-3}


def is_near_tie(margin: float | None, dtype: str) -> bool | None:
    """Whether `margin` (logits; None: not measured) is within what `dtype`'s rounding can flip."""
    if margin is None:
        return None
    return abs(margin) <= NEAR_TIE_LOGITS.get(dtype, NEAR_TIE_LOGITS["float32"])


@torch.no_grad()
def add_margins(
    target: LoadedTarget,
    prompt_ids: Mapping[str, Sequence[int]],
    reference: Sequence[PromptRun],
    mismatches: Sequence[Mismatch],
    *,
    dtype: str,
) -> None:
    """Fill `margin` and `near_tie` (for `dtype`, the run's) of each mismatch: logit(reference token) - logit(this method's token) at the
    first differing position, the target run on the prompt plus the reference's tokens before it.
    prompt_ids: each prompt id's token ids; reference: the reference method's runs. A mismatch
    where one text ended (no token to compare) keeps margin None."""
    runs = {r.prompt_id: r for r in reference}
    for mm in mismatches:
        if mm.token is None or mm.reference_token is None:
            continue
        ids = [*prompt_ids[mm.prompt_id], *runs[mm.prompt_id].token_ids[: mm.position]]
        input_ids = torch.tensor([ids], dtype=torch.long, device=target.device)  # [1, T]
        logits = target.model(input_ids=input_ids, use_cache=False, logits_to_keep=1).logits[0, -1]
        logits = logits.float()  # [V]
        mm.margin = float(logits[mm.reference_token] - logits[mm.token])
        mm.near_tie = is_near_tie(mm.margin, dtype)
