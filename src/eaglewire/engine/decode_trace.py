"""What one speculative generation records, round by round (`DecodeTrace`): filled by both round
loops, the lockstep one (`speculative`) and the launch-ahead one (`pipelined`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from eaglewire.engine.verify import StopRule, Verdict

# Called after each verified round with the tokens it added; False = stop here ("cancelled").
RoundCallback = Callable[[list[int]], bool]


@dataclass
class DecodeTrace:
    token_ids: list[int]  # generated tokens (eos included when it ended the generation)
    finish_reason: str  # "eos" | "stop_string" | "max_new_tokens" | "cancelled" (on_round said stop)
    accepted_per_round: list[int] = field(default_factory=list)  # drafts each verification accepted
    emitted_per_round: list[int] = field(default_factory=list)  # tokens it produced, bonus included
    accepted_paths: list[list[int]] = field(default_factory=list)  # tree nodes each accepted, root first
    phase_seconds: dict[str, float] = field(default_factory=dict)
    loop: str = "lockstep"  # "lockstep" | "launch_ahead": which round loop ran (module doc)
    on_round: RoundCallback | None = field(default=None, repr=False, compare=False)  # module doc

    @property
    def num_verifications(self) -> int:
        return len(self.accepted_per_round)

    def record(self, verdict: Verdict, stop: StopRule) -> bool:
        """Take one verified round: its counts, and the tokens `stop` keeps of what it emitted.
        True when the generation ends here (`finish_reason` then says why)."""
        self.accepted_per_round.append(verdict.num_accepted_drafts)
        self.emitted_per_round.append(len(verdict.emitted))
        self.accepted_paths.append(list(verdict.path))
        kept, finish = stop.cut(self.token_ids, verdict.emitted)
        self.token_ids.extend(kept)
        if finish is not None:
            self.finish_reason = finish
        if self.on_round is not None and not self.on_round(kept) and finish is None:
            self.finish_reason = finish = "cancelled"
        return finish is not None
