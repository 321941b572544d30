"""The served texts replayed offline under one wiring (`doctor.served`, step 2): the engine's own drafter
over `bench.text_replay.TextRunner`, the target's states from one teacher-forced forward per text."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from eaglewire.bench.prompts import BenchPrompt, encode_prompt
from eaglewire.contract.contract import FinalState
from eaglewire.doctor.miswirings import AuxSource, Wiring
from eaglewire.doctor.served_client import RoundCounts, ServedResponse
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.errors import ConfigError

if TYPE_CHECKING:
    from eaglewire.draft.model import Eagle3Draft
    from eaglewire.target.loading import LoadedTarget


@dataclass(frozen=True)
class ServedText:
    """One prompt's served text as the replay reads it."""

    prompt_id: str
    prompt_ids: list[int]
    output_ids: list[int]
    ids_from: str  # "server" | "re-tokenized"
    counts: RoundCounts  # the engine's own counts for this response

    def replay_split(self, prefill_token: bool) -> tuple[list[int], list[int]]:
        """(prompt, tokens the verifications emitted): after the prefill's token where the engine emits one."""
        if prefill_token and self.output_ids:
            return [*self.prompt_ids, self.output_ids[0]], self.output_ids[1:]
        return list(self.prompt_ids), list(self.output_ids)


@dataclass(frozen=True)
class Prediction:
    """The replay of every served text under one wiring."""

    rounds: list[int]  # per text
    accepted: list[int]  # per text: drafts accepted over its rounds
    per_position_counts: list[int]  # rounds accepting >= j drafts, j = 1..D (pooled)
    emitted: int  # tokens verifications emitted over every text (its length, prefill tokens excluded)
    drafts_per_round: int  # drafted tokens each verification checks (num_draft_tokens - 1)

    @property
    def counts(self) -> RoundCounts:
        verifications = sum(self.rounds)
        return RoundCounts(
            verifications,
            sum(self.accepted),
            verifications * self.drafts_per_round,
            list(self.per_position_counts),
        )

    @property
    def tau(self) -> float:
        """Tokens of the text per verification (`in_text_tau`)."""
        return in_text_tau(self.emitted, sum(self.rounds))


def in_text_tau(emitted: int, verifications: int) -> float:
    """tau over the served text: its tokens that verifications emitted / verifications. Served and replayed
    share the numerator (the same text), so they differ exactly where their verification counts do: the
    last round's drafts past max_tokens, which a server may count as accepted, do not move it."""
    return emitted / verifications if verifications else 1.0


def served_texts(
    responses: Sequence[ServedResponse], prompts: Sequence[BenchPrompt], target: LoadedTarget, engine: str
) -> tuple[list[ServedText], list[str]]:
    """Token ids of each served text (the server's, or the answer re-tokenized after the chat-templated
    prompt, with the end-of-sequence token when the answer stopped there), and notes on how."""
    notes: list[str] = []
    out: list[ServedText] = []
    tok = target.tokenizer
    eos = list(target.eos_token_ids)
    for response, prompt in zip(responses, prompts, strict=True):
        prompt_ids = response.prompt_ids
        if prompt_ids is None:
            prompt_ids = encode_prompt(tok, prompt)
        output_ids = response.output_ids
        ids_from = "server"
        if output_ids is None:
            ids_from = "re-tokenized"
            output_ids = [int(t) for t in tok(response.text, add_special_tokens=False)["input_ids"]]
            if response.finish_reason == "stop" and eos and (not output_ids or output_ids[-1] not in eos):
                output_ids.append(eos[0])
            if len(output_ids) != response.completion_tokens:
                notes.append(
                    f"{response.prompt_id}: the answer re-tokenizes to {len(output_ids)} tokens, the server counted "
                    f"{response.completion_tokens}: its replay is of slightly other tokens than were served"
                )
        out.append(ServedText(response.prompt_id, list(prompt_ids), list(output_ids), ids_from,
                              response.counts(engine)))  # fmt: skip
    return out, notes


class ReplayWorld:
    """The served texts, the target's states over them (one teacher-forced forward each, every boundary any
    wiring needs), and the draft in float32: `predict(wiring, spec)` replays them all."""

    def __init__(
        self,
        target: LoadedTarget,
        draft: Eagle3Draft,
        texts: Sequence[ServedText],
        prefill_token: bool,
        wirings: Sequence[Wiring],
    ) -> None:
        self.target = target
        self.device = target.device
        self.draft = copy.deepcopy(draft).float().eval().requires_grad_(False).to(self.device)
        self.splits = [t.replay_split(prefill_token) for t in texts]
        L = target.num_layers
        pre = sorted({a.boundary for w in wirings for a in w.aux if a.norm == "pre"})
        post = any(a.norm == "post" for w in wirings for a in w.aux)
        self.columns: dict[AuxSource, int] = {AuxSource(b): i for i, b in enumerate(pre)}
        self.states: list[torch.Tensor] = []  # per text: [T, len(pre) (+1), Ht] float32
        from eaglewire.target.capture import capture

        for prompt, generated in self.splits:
            ids = torch.tensor([[*prompt, *generated]], dtype=torch.long, device=self.device)  # [1, T]
            with torch.no_grad():
                states = capture(
                    target.model, ids, aux_boundaries=pre, final=FinalState(L, "post" if post else "pre")
                )
            T, Ht = ids.shape[1], target.hidden_size
            stack = states.aux[0].float().reshape(T, len(pre), Ht)  # [T, n, Ht]
            if post:
                stack = torch.cat([stack, states.final[0].float()[:, None]], dim=1)
            self.states.append(stack)
        if post:
            self.columns[AuxSource(L, "post")] = len(pre)
        self._drafts: dict[str, Eagle3Draft] = {"trained": self.draft}
        self._predictions: dict[tuple[Wiring, SpecArgs], Prediction] = {}

    def _aux(self, index: int, wiring: Wiring) -> torch.Tensor:
        cols = [self.columns[a] for a in wiring.aux]
        return self.states[index][:, cols].reshape(self.states[index].shape[0], -1)  # [T, A*Ht]

    def _draft(self, vocab_map: str) -> Eagle3Draft:
        if vocab_map not in self._drafts:
            draft = copy.deepcopy(self.draft)
            absolute = draft.get_buffer("draft_to_target")  # [Vd] target id of each draft id
            offsets = absolute - torch.arange(absolute.shape[0], device=absolute.device)  # the engines' d2t
            served = (
                offsets
                if vocab_map == "d2t_as_absolute"
                else absolute + torch.arange(absolute.shape[0], device=absolute.device)
            )
            # ids outside the vocabulary index garbage (or crash) in an engine: here they become the last id
            draft.get_buffer("draft_to_target").copy_(served.clamp(0, self.target.vocab_size - 1))
            self._drafts[vocab_map] = draft
        return self._drafts[vocab_map]

    def predict(self, wiring: Wiring, spec: SpecArgs) -> Prediction:
        """The replay of every text under `wiring` with `spec` (once per pair: the texts do not change)."""
        key = (wiring, spec)
        if key not in self._predictions:
            self._predictions[key] = self._predict(wiring, spec)
        return self._predictions[key]

    @torch.no_grad()
    def _predict(self, wiring: Wiring, spec: SpecArgs) -> Prediction:
        from eaglewire.engine.api import SpeculativeDecoder
        from eaglewire.predict.text_replay import TextRunner

        longest = max(len(p) + len(g) for p, g in self.splits)
        runner = TextRunner(vocab_size=self.target.vocab_size, num_layers=self.target.num_layers, device=self.device,
                            dtype=torch.float32, max_seq_len=longest + spec.num_draft_tokens + 1)  # fmt: skip
        decoder = SpeculativeDecoder(runner, self._draft(wiring.vocab_map), spec)
        rounds, accepted, per_pos = [], [], [0] * spec.num_steps
        emitted = sum(len(g) for _, g in self.splits)
        for i, (prompt, generated) in enumerate(self.splits):
            if not generated:
                rounds.append(0)
                accepted.append(0)
                continue
            runner.set_text(torch.tensor([*prompt, *generated], dtype=torch.long), self._aux(i, wiring))
            result = decoder.generate(list(prompt), max_new_tokens=len(generated))
            if result.token_ids != list(generated):
                raise ConfigError(
                    "the replay left the served text: its ids moved (this is a bug in eaglewire)"
                )
            rounds.append(result.num_verifications)
            accepted.append(sum(result.accepted_per_round))
            for n in result.accepted_per_round:
                for j in range(min(n, spec.num_steps)):
                    per_pos[j] += 1
        return Prediction(rounds, accepted, per_pos, emitted, spec.num_draft_tokens - 1)
