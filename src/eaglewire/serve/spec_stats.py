"""Speculative statistics of one generation, in the two engines' own shapes (pure Python).

Per response, SGLang 0.5.23's `SpecTokensDetails` (`sglang/srt/entrypoints/openai/protocol.py`
lines 456-467), computed as `TokenizerManager._calculate_spec_decoding_metrics` does
(`sglang/srt/managers/tokenizer_manager.py` lines 3138-3200):

    spec_verify_ct               target verifications (one per round; the last, cut one included, as
                                 `batch_result_processor.py` lines 829-836 count every verify step)
    spec_num_correct_drafts      drafts accepted over all rounds (bonus tokens not included)
    spec_num_proposed_drafts     spec_verify_ct * (num_draft_tokens - 1)
    spec_accept_rate             spec_num_correct_drafts / spec_num_proposed_drafts
    spec_accept_length           completion_tokens / spec_verify_ct (the bonus token included)
    spec_correct_drafts_histogram[k]  rounds that accepted exactly k drafts (`schedule_batch.py`
                                 `update_spec_correct_drafts_histogram`, lines 1566-1572: as long as
                                 the largest k seen)

One difference in what is counted, not in the formula: SGLang samples the first output token in the
prefill forward, which is no verification; eaglewire's engine emits every token, the first one
included, from a verification (`engine.speculative`), so its accept length is exactly tokens per
target forward (our `tau`), where SGLang's counts one token more than its verifications produced.
`spec_cap_length`, `spec_block_accept_length` and `spec_cap_lens_histogram` belong to SGLang's
ragged/capped verification, which this engine does not do: they are left at SGLang's defaults (0, []).

Server-wide, vLLM 0.33.0's counters (`vllm/v1/spec_decode/metrics.py` lines 26-49
`SpecDecodingStats.observe_draft`, lines 228-264 the Prometheus counters, observed per verified
request step by `vllm/v1/core/sched/scheduler.py` lines 2346-2370): per verification one draft,
`num_draft_tokens` += the drafted tokens verified (here num_draft_tokens - 1: every tree node but the
root), `num_accepted_tokens` += the accepted drafts (no bonus), and position i's counter += 1 for each
i < accepted (positions 0 .. num_steps - 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def spec_tokens_details(
    accepted_per_round: Sequence[int], completion_tokens: int, num_draft_tokens: int
) -> dict[str, Any]:
    """SGLang's per-request `SpecTokensDetails` (module doc) from the rounds of one generation."""
    verify_ct = len(accepted_per_round)
    correct = int(sum(accepted_per_round))
    proposed = verify_ct * (num_draft_tokens - 1)
    histogram = [0] * (max(accepted_per_round, default=-1) + 1)
    for accepted in accepted_per_round:
        histogram[accepted] += 1
    return {
        "spec_accept_rate": correct / proposed if proposed else 0.0,
        "spec_accept_length": completion_tokens / verify_ct if verify_ct else 0.0,
        "spec_cap_length": 0.0,
        "spec_block_accept_length": 0.0,
        "spec_num_correct_drafts": correct,
        "spec_num_proposed_drafts": proposed,
        "spec_verify_ct": verify_ct,
        "spec_correct_drafts_histogram": histogram,
        "spec_cap_lens_histogram": [],
    }


@dataclass
class SpecCounters:
    """vLLM's spec-decode counters (module doc); `num_positions` = num_steps (the deepest draft)."""

    num_positions: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.num_positions

    def observe(self, accepted_per_round: Sequence[int], drafts_per_round: int) -> None:
        """One generation's rounds: `drafts_per_round` drafted tokens verified in each."""
        for accepted in accepted_per_round:
            if not 0 <= accepted <= self.num_positions:
                raise ValueError(f"accepted={accepted}: expected 0 <= accepted <= {self.num_positions}")
            self.num_drafts += 1
            self.num_draft_tokens += drafts_per_round
            self.num_accepted_tokens += accepted
            for i in range(accepted):
                self.num_accepted_tokens_per_pos[i] += 1
