"""`eaglewire doctor --served URL`: is a live deployment feeding the draft what it was trained on?

1. Send the prompts (default: `default_prompts`, a mix of MT-bench first turns and held-out HumanEval
   prompts), greedy, `max_tokens` each, one at a time, and read the served acceptance the engine's way
   (`doctor.served_client`: SGLang per response, vLLM from /metrics deltas, eaglewire serve both, which
   must agree).
2. Replay the served texts offline with the draft under its declared wiring: the engine's own drafter
   over `bench.text_replay.TextRunner` (on a greedy text every verification is known in advance, so
   the replay needs no target forward per round; the aux states come from one teacher-forced forward
   of the target over prompt + answer). The token ids are the server's when it returns them
   (`return_token_ids`), else the answer re-tokenized after the chat-templated prompt (said in the report).
   SGLang and vLLM emit the first token from the prefill forward (no verification): their replay starts
   after it (`served_client.ServedClient.prefill_emits_first_token`).
3. Compare tau over the served text (its tokens that verifications emitted / verifications: the same
   numerator on both sides, so they differ exactly where the verification counts do; each engine's own
   figure, vLLM's 1 + accepted/drafts and SGLang's spec_accept_length, is shown beside it) and per-position
   acceptance. The prediction's error: in float32 on a CPU the replay is exact (every prompt's verifications
   equal, `tests/unit/bench/test_text_replay.py`); otherwise (bf16 on a GPU, another engine's kernels) the
   bench measured 0.5-2% (docs/history/benchmarks-log.md §2p), so served matches predicted when
   |served - predicted| <= max(REL_TOL * predicted, ABS_TOL). (A server may count drafts of a text's last
   round accepted past max_tokens, which the replay cannot see: per-position acceptance only, not tau.)
4. Served short of that: replay every candidate miswiring (`doctor.miswirings`) and name the one whose
   prediction matches what was served (exact, round for round, first; then the closest tau within its
   error), with the config key or server flag that undoes it. Served above it: the server is not serving
   this draft with this target on greedy text.

Exit 0 when served matches predicted; 1 with a named fault, or "short, no candidate explains it"; 2
when the input is unusable (the server unreachable, its answers missing the engine's fields).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from eaglewire.bench.prompts import BenchPrompt, PromptSet, encode_prompt, load_prompt_set
from eaglewire.contract.contract import FinalState
from eaglewire.contract.numbering import describe_boundary
from eaglewire.doctor.findings import CheckResult, Finding, Row, fmt_list
from eaglewire.doctor.miswirings import (
    AuxSource,
    Candidate,
    ServedFormat,
    ServedSetup,
    Wiring,
    all_candidates,
    declared_spec,
)
from eaglewire.doctor.served_client import (
    Engine,
    RoundCounts,
    ServedClient,
    ServedResponse,
    ServerError,
    agreement,
)
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.errors import ConfigError, EaglewireError

if TYPE_CHECKING:
    from eaglewire.doctor.draft_source import DraftSource
    from eaglewire.draft.model import Eagle3Draft
    from eaglewire.target.loading import LoadedTarget

log = logging.getLogger(__name__)

CHECK = "served acceptance"
REL_TOL = 0.03  # the prediction's stated error off float32 CPU (the bench measured 0.5-2%)
ABS_TOL = 0.05
DEFAULT_MT_BENCH = 6  # MT-bench first turns in the default mix (every 10th question: six categories)
DEFAULT_HUMANEVAL = 4  # held-out HumanEval prompts in the default mix
DEFAULT_MIX = "mt-bench + humaneval-eval"
UNINFORMATIVE = 0.2  # below this first-position acceptance (as trained) wirings are hard to tell apart


def tolerance(predicted_tau: float) -> float:
    """How far served may be from predicted and still match (module docstring, step 3)."""
    return max(REL_TOL * predicted_tau, ABS_TOL)


def default_prompts(num_prompts: int | None = None) -> PromptSet:
    """6 MT-bench first turns (questions 81, 91, ..., 131: writing, roleplay, reasoning, math, coding,
    extraction) and 4 held-out HumanEval prompts, interleaved so that the first N of them mix both."""
    mt = load_prompt_set("mt-bench").prompts[::10][:DEFAULT_MT_BENCH]
    code = load_prompt_set("humaneval-eval").prompts[:DEFAULT_HUMANEVAL]
    order = [mt[0], mt[1], code[0], mt[2], mt[3], code[1], mt[4], code[2], mt[5], code[3]]
    return PromptSet(DEFAULT_MIX, tuple(order)).head(num_prompts)


@dataclass(frozen=True)
class ServedOptions:
    """What `eaglewire doctor --served` was given."""

    url: str
    engine: Engine
    prompts: str | None = None  # a JSONL file or a built-in prompt set; None: `default_prompts`
    num_prompts: int | None = None
    max_tokens: int = 128
    sglang_args: str | None = None  # the server's launch arguments, when given (the declared draft length)
    vllm_config: dict[str, Any] | None = None
    timeout: float = 600.0

    def prompt_set(self) -> PromptSet:
        if self.prompts is None:
            return default_prompts(self.num_prompts)
        return load_prompt_set(self.prompts, self.num_prompts)


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
        from eaglewire.bench.text_replay import TextRunner
        from eaglewire.engine.api import SpeculativeDecoder

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


@dataclass
class ServedCheck(CheckResult):
    """The served check's result, with its numbers for `--json` (`served`)."""

    served: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "served": self.served}


@dataclass(frozen=True)
class Match:
    candidates: list[Candidate]  # every explanation that gives this wiring
    prediction: Prediction
    exact: bool  # every prompt's verifications equal the served ones
    distance: float  # `_distance`: per-prompt verifications, tau and per-position acceptance


def _per_position(counts: RoundCounts, depth: int) -> list[float]:
    return counts.per_position_acceptance(depth) or []


def _distance(
    served_tau: float, served: RoundCounts, served_rounds: Sequence[int], predicted: Prediction, depth: int
) -> float:
    """How far a replay is from what was served: the prompts' verification counts (relative L1: two wirings of
    a similar pooled tau still differ prompt by prompt), tau, and the mean per-position difference."""
    s, p = _per_position(served, depth), predicted.counts.per_position_acceptance(depth) or []
    per_pos = sum(abs(a - b) for a, b in zip(s, p, strict=False)) / depth if s and p else 0.0
    rounds = sum(abs(a - b) for a, b in zip(served_rounds, predicted.rounds, strict=True)) / max(
        sum(served_rounds), 1
    )
    return rounds + abs(served_tau - predicted.tau) + per_pos


def _acc(values: Sequence[float] | None) -> str:
    return "-" if not values else " ".join(f"{v:.2f}" for v in values)


def _card(client: ServedClient) -> dict[str, Any]:
    """What eaglewire serve says about itself in /v1/models (`data[0].eaglewire`); {} for other servers."""
    card = client.model_card.get("eaglewire") if client.model_card.get("owned_by") == "eaglewire" else None
    return card if isinstance(card, dict) else {}


def observed_spec(client: ServedClient, pooled: RoundCounts) -> tuple[SpecArgs | None, str]:
    """What the server runs: eaglewire serve says so in /v1/models; SGLang and vLLM report the drafts they
    verify per round (a chain of that many is assumed: name a tree's flags with --sglang-args)."""
    spec = _card(client).get("speculative")
    if isinstance(spec, dict):
        try:
            found = SpecArgs(int(spec["num_steps"]), int(spec["topk"]), int(spec["num_draft_tokens"]))
            return found, "the server's /v1/models"
        except (KeyError, TypeError, ValueError, ConfigError):
            pass
    per = pooled.drafts_per_verification
    if per is None or per < 1 or abs(per - round(per)) > 1e-9:
        return None, f"the server verified {per} drafts per round"
    drafts = int(round(per))
    return SpecArgs.chain(drafts), f"{drafts} drafted tokens per verification (assumed a chain)"


def _requested(
    opts: ServedOptions, architecture: str | None
) -> tuple[tuple[int, int, int] | None, SpecArgs | None]:
    """(num_steps, topk, num_draft_tokens) as launched and what the engine runs for them, when the doctor was told."""
    if opts.sglang_args is not None:
        from eaglewire.doctor.sglang_lint import parse_sglang_args
        from eaglewire.engine.spec_args import sglang_effective_spec_args

        a = parse_sglang_args(opts.sglang_args)
        try:
            eff, _ = sglang_effective_spec_args(
                a.num_steps, a.topk, a.num_draft_tokens, architecture=architecture
            )
        except ConfigError:
            return None, None  # SGLang refuses them: the lint says so
        requested = (
            a.num_steps if a.num_steps is not None else eff.num_steps,
            a.topk if a.topk is not None else eff.topk,
            a.num_draft_tokens if a.num_draft_tokens is not None else eff.num_draft_tokens,
        )
        return requested, eff
    if opts.vllm_config is not None:
        spec = opts.vllm_config.get("speculative_config") or {}
        k = spec.get("num_speculative_tokens") if isinstance(spec, dict) else None
        if isinstance(k, int) and not isinstance(k, bool) and k >= 1:
            return (k, 1, k + 1), SpecArgs.chain(k)
    return None, None


def _served_format(engine: str, client: ServedClient, source: DraftSource | None) -> ServedFormat | None:
    """The draft format the server reads: eaglewire serve says which; SGLang and vLLM read their own."""
    formats: dict[str, ServedFormat] = {"sglang": "sglang", "vllm": "vllm", "eaglewire": "eaglewire"}
    fmt = _card(client).get("draft_format")
    if isinstance(fmt, str) and fmt in formats:
        return formats[fmt]
    if engine in formats and engine != "eaglewire":
        return formats[engine]
    return source.kind if source is not None else None


def _config_location(
    served_format: ServedFormat | None, client: ServedClient, source: DraftSource | None
) -> tuple[Path | None, tuple[int, ...] | None]:
    """The served export's config.json and its ids: --draft when it is that export, else what eaglewire
    serve names in /v1/models (when it is readable from here)."""
    if source is not None and source.kind == served_format and source.kind != "eaglewire":
        return source.path / "config.json", source.layer_ids
    path = _card(client).get("draft")
    if (
        isinstance(path, str)
        and served_format in ("sglang", "vllm")
        and (Path(path) / "config.json").is_file()
    ):
        from eaglewire.doctor.draft_source import read_draft_source

        try:
            found = read_draft_source(Path(path), with_tensors=False)
            return found.path / "config.json", found.layer_ids
        except EaglewireError:
            return Path(path) / "config.json", None
    if source is not None and source.kind == "eaglewire" and served_format == "eaglewire":
        return source.path / "config.json", None
    return None, None


def check_served(
    opts: ServedOptions,
    *,
    target: LoadedTarget,
    draft: Eagle3Draft,
    trained: Sequence[int],
    source: DraftSource | None = None,
    trained_from: str = "the draft's contract",
    client: ServedClient | None = None,
) -> ServedCheck:
    """Send the prompts, read the served acceptance, replay, compare; candidates when short (module docstring)."""
    client = client or ServedClient(opts.url, opts.engine, timeout=opts.timeout)
    result = ServedCheck(name=CHECK)
    prompts = opts.prompt_set().prompts
    if not prompts:
        raise ConfigError("--num-prompts: no prompts to send", fix="pass --num-prompts 1 or more")
    client.model()  # reachable, and its model name (vLLM wants it in every request)
    log.info(
        "sending %d prompts to %s (%s), max_tokens %d", len(prompts), client.url, opts.engine, opts.max_tokens
    )
    responses = [client.chat(p.prompt_id, p.chat(), max_tokens=opts.max_tokens) for p in prompts]
    texts, text_notes = served_texts(responses, prompts, target, opts.engine)
    result.notes += text_notes
    ids_from = sorted({t.ids_from for t in texts})
    result.notes.append(
        "token ids: "
        + (
            "the server's (return_token_ids)"
            if ids_from == ["server"]
            else "the answers re-tokenized with the target's tokenizer after the chat-templated prompt"
            if ids_from == ["re-tokenized"]
            else "the server's where it returned them, else re-tokenized"
        )
    )
    if opts.engine == "eaglewire":
        disagree = [line for r in responses for line in agreement(r)]
        if disagree:
            result.findings.append(
                Finding(
                    check="served.stats_disagree",
                    severity="error",
                    what="the server's two acceptance reports disagree (per response vs /metrics)",
                    declared="SGLang's sglext.spec_tokens_details per response",
                    actual="vLLM's spec_decode counters' increase over the same request",
                    fix="report this: eaglewire serve must count each verification once in both",
                    details=tuple(disagree[:8]),
                )
            )
    served = RoundCounts.pooled(t.counts for t in texts)
    if served.verifications == 0:
        raise ServerError(
            f"{client.url}: no verification with a draft in {len(texts)} answers: the server is not decoding "
            "speculatively (or every answer was one token)",
            fix="serve the draft (SGLang: --speculative-algorithm EAGLE3; vLLM: --speculative-config), or raise "
            "--max-tokens",
        )
    requested, effective = _requested(opts, target.architecture)
    observed, observed_from = observed_spec(client, served)
    spec = declared_spec(requested, effective or observed)
    served_format = _served_format(opts.engine, client, source)
    config_path, config_ids = _config_location(served_format, client, source)
    L = target.num_layers
    setup = ServedSetup(
        trained=tuple(trained),
        num_layers=L,
        served_format=served_format,
        architecture=target.architecture,
        config_path=config_path,
        config_ids=config_ids,
        requested_spec=requested,
        effective_spec=effective if effective is not None else observed,
        d2t_file=str(source.path / "model.safetensors")
        if source is not None and source.kind != "eaglewire"
        else None,
    )
    sglang_len = (
        sum(r.completion_tokens for r in responses) / served.verifications if opts.engine != "vllm" else None
    )
    engine_own = (
        f"vLLM's 1 + accepted/drafts {served.tau:.3f}"
        if opts.engine == "vllm"
        else f"SGLang's spec_accept_length {sglang_len:.3f}, 1 + accepted/verifications {served.tau:.3f}"
    )
    result.served = {
        "url": client.url,
        "engine": opts.engine,
        "prompts": [t.prompt_id for t in texts],
        "prompt_set": opts.prompts or DEFAULT_MIX,
        "max_tokens": opts.max_tokens,
        "token_ids": ids_from,
        "spec_accept_length": sglang_len,
    }
    result.notes.append(
        f"{len(texts)} prompts ({opts.prompts or DEFAULT_MIX}), max_tokens {opts.max_tokens}, greedy"
    )
    if opts.engine == "vllm":
        result.notes.append(
            "vLLM's counters are server-wide: each request's are the /metrics increase around it, so nothing else "
            "may use the server while the doctor runs"
        )
    if observed is not None:
        result.notes.append(f"the server runs num_steps {observed.num_steps} topk {observed.topk} num_draft_tokens "
                            f"{observed.num_draft_tokens} ({observed_from})")  # fmt: skip
    return compare_served(
        result, texts, target=target, draft=draft, trained=trained, trained_from=trained_from, spec=spec,
        setup=setup, engine=opts.engine, prefill_token=client.prefill_emits_first_token, engine_own=engine_own,
        observed=observed,
    )  # fmt: skip


def compare_served(
    result: ServedCheck,
    texts: Sequence[ServedText],
    *,
    target: LoadedTarget,
    draft: Eagle3Draft,
    trained: Sequence[int],
    trained_from: str,
    spec: SpecArgs,
    setup: ServedSetup,
    engine: str,
    prefill_token: bool,
    engine_own: str = "",
    observed: SpecArgs | None = None,
    world: ReplayWorld | None = None,
) -> ServedCheck:
    """Served vs predicted on `texts` (each with the engine's counts): the rows, and when short the candidates'
    replays and the finding naming the match (module docstring, steps 2-4). No HTTP: `check_served` collects
    the texts; tests may pass texts an engine decoded in-process, and a `world` built on the same texts (and
    wirings) to reuse its replays."""
    served = RoundCounts.pooled(t.counts for t in texts)
    L = target.num_layers
    d2t = draft.get_buffer("draft_to_target")
    identity = bool(torch.equal(d2t.cpu(), torch.arange(d2t.shape[0])))
    candidates = all_candidates(setup, identity_map=identity)
    declared = Wiring.of(trained)
    replayable = [c for c in candidates if c.wiring is not None]
    if world is None:
        wirings = [declared, *(c.wiring for c in replayable if c.wiring)]
        world = ReplayWorld(target, draft, texts, prefill_token, wirings)
    predicted = world.predict(declared, spec)
    depth = spec.num_steps
    tau_p = predicted.tau
    tau_s = in_text_tau(predicted.emitted, served.verifications)
    tol = tolerance(tau_p)
    exact = [t.counts.verifications for t in texts] == predicted.rounds
    s_pos, p_pos = _per_position(served, depth), predicted.counts.per_position_acceptance(depth)
    result.rows += [
        Row(
            "tau (tokens of the text / verifications)",
            f"predicted {tau_p:.3f} +- {tol:.3f}",
            f"served {tau_s:.3f}" + (f" (the engine's own: {engine_own})" if engine_own else ""),
            abs(tau_s - tau_p) <= tol,
            note="exact: every prompt's verifications equal" if exact else "",
        ),
        Row(
            f"acceptance per position 1..{depth}",
            f"predicted {_acc(p_pos)}",
            f"served {_acc(s_pos)}",
            not s_pos
            or not p_pos
            or max(abs(a - b) for a, b in zip(s_pos, p_pos, strict=False)) <= max(tol, 0.05),
        ),
    ]
    result.notes.append(
        f"predicted for the draft's wiring: aux boundaries {fmt_list(trained)} ({trained_from}), "
        f"num_steps {spec.num_steps} topk {spec.topk} num_draft_tokens {spec.num_draft_tokens}; "
        f"{served.verifications} served verifications, {predicted.counts.verifications} replayed"
    )
    if p_pos and p_pos[0] < UNINFORMATIVE:
        result.notes.append(
            f"even wired as trained, this draft's first draft token is accepted in only {100 * p_pos[0]:.0f}% of the "
            "rounds on these prompts: every wiring serves about as badly, so a match says little; send prompts "
            "like the draft's training data (--prompts)"
        )
    if (
        observed is not None
        and spec.num_draft_tokens != observed.num_draft_tokens
        and not any(c.fault == "spec.draft_length" for c in candidates)
    ):
        result.notes.append(
            f"the server verifies {observed.num_draft_tokens - 1} drafted tokens per round, the launch arguments "
            f"given say {spec.num_draft_tokens - 1}: are they what the server runs?"
        )
    result.served |= {
        "spec": {"num_steps": spec.num_steps, "topk": spec.topk, "num_draft_tokens": spec.num_draft_tokens},
        "served": {**served.to_json(), "tau_in_text": tau_s, "per_position_acceptance": s_pos},
        "predicted": {**predicted.counts.to_json(), "tau_in_text": tau_p, "per_position_acceptance": p_pos},
        "tolerance": tol,
        "exact": exact,
        "served_verifications_per_prompt": [t.counts.verifications for t in texts],
        "predicted_verifications_per_prompt": predicted.rounds,
        "verdict": "match",
        "candidates": [],
    }
    if abs(tau_s - tau_p) <= tol:
        return result
    if tau_s > tau_p:
        result.served["verdict"] = "above"
        result.findings.append(
            Finding(
                check="served.above_prediction",
                severity="error",
                what=f"served acceptance {tau_s:.3f} is above the {tau_p:.3f} this draft can reach on the served text "
                f"(+- {tol:.3f}): the server does not serve this draft with this target on greedy text",
                declared=f"--draft and --target as given; predicted {tau_p:.3f}",
                actual=f"served {tau_s:.3f} ({engine})",
                fix="pass the draft and target the server was launched with (--draft, --target), and check that it "
                "decodes greedily at temperature 0",
            )
        )
        return result
    matches, impossible = _replay_candidates(world, candidates, spec, served, tau_s, texts)
    result.served["candidates"] = [
        {
            "faults": [c.fault for c in m.candidates],
            "what": [c.what for c in m.candidates],
            "predicted_tau": m.prediction.tau,
            "predicted_per_position_acceptance": m.prediction.counts.per_position_acceptance(
                (m.candidates[0].wiring.spec or spec).num_steps if m.candidates[0].wiring else depth
            ),
            "exact": m.exact,
            "within_error": abs(tau_s - m.prediction.tau) <= tolerance(m.prediction.tau),
            "fix": m.candidates[0].fix,
        }
        for m in matches
    ] + [{"faults": [c.fault], "what": [c.what], "impossible": c.impossible} for c in impossible]
    result.notes += [f"not replayed: {c.what}: {c.impossible}" for c in impossible]
    within = [m for m in matches if m.exact or abs(tau_s - m.prediction.tau) <= tolerance(m.prediction.tau)]
    short = (
        f"served acceptance {tau_s:.3f} is short of the {tau_p:.3f} this draft reaches on the served text under its "
        f"wiring (+- {tol:.3f})"
    )
    if not within:
        result.served["verdict"] = "short, unexplained"
        closest = sorted(matches, key=lambda m: m.distance)[:5]
        result.findings.append(
            Finding(
                check="served.short_unexplained",
                severity="error",
                what=f"{short}, and no candidate miswiring explains it",
                declared=f"predicted {tau_p:.3f}, per position {_acc(p_pos)}",
                actual=f"served {tau_s:.3f}, per position {_acc(s_pos)}",
                fix="check that the server runs this draft and target (the same files, --draft and --target here) "
                "and the draft length assumed above (a tree: pass the server's launch flags with --sglang-args), "
                "and check the export itself: eaglewire doctor --draft EXPORT --target TARGET",
                details=tuple(
                    f"{m.candidates[0].fault}: {m.candidates[0].what}: predicted {m.prediction.tau:.3f}"
                    for m in closest
                ),
            )
        )
        return result
    best = within[0]
    result.served["verdict"] = best.candidates[0].fault
    others = within[1:]
    c = best.candidates[0]
    also = [
        f"the served config gives exactly this: {x.what}"
        if x.fault == "aux.config_reading"
        else f"the same wiring: {x.what}"
        for x in best.candidates[1:]
    ]
    also += [
        f"also within the error: {m.candidates[0].what} (predicted {m.prediction.tau:.3f}"
        + (", round for round" if m.exact else "")
        + ")"
        for m in others
    ]
    if best.prediction.counts.accepted == 0:
        also.append(
            "under this wiring no drafted token is ever accepted: a server whose draft has nothing to do with this "
            "one (another draft, another target) looks the same; check that first"
        )
    m_pos = best.prediction.counts.per_position_acceptance(
        (c.wiring.spec or spec).num_steps if c.wiring else depth
    )
    result.findings.append(
        Finding(
            check=f"served.{c.fault}",
            severity="error",
            what=f"{short}; it matches {c.what}",
            declared=f"trained on aux boundaries {', '.join(f'{b} ({describe_boundary(b, L)})' for b in trained)}; "
            f"predicted {tau_p:.3f}, per position {_acc(p_pos)}",
            actual=f"served {tau_s:.3f}, per position {_acc(s_pos)}; this miswiring predicts "
            f"{best.prediction.tau:.3f}, per position {_acc(m_pos)}"
            + (" (every prompt's verifications equal: exact)" if best.exact else ""),
            fix=c.fix,
            details=tuple(also),
        )
    )
    return result


def _replay_candidates(
    world: ReplayWorld,
    candidates: Sequence[Candidate],
    spec: SpecArgs,
    served: RoundCounts,
    served_tau: float,
    texts: Sequence[ServedText],
) -> tuple[list[Match], list[Candidate]]:
    """Replay each distinct candidate wiring once; matches ordered exact first, then by distance."""
    groups: dict[Wiring, list[Candidate]] = {}
    impossible: list[Candidate] = []
    for c in candidates:
        if c.wiring is None:
            impossible.append(c)
        else:
            groups.setdefault(c.wiring, []).append(c)
    served_rounds = [t.counts.verifications for t in texts]
    matches = []
    for wiring, group in groups.items():
        group.sort(
            key=lambda c: c.fault == "aux.config_reading"
        )  # the fault class first, the config's reading after
        run_spec = wiring.spec or spec
        prediction = world.predict(replace(wiring, spec=None), run_spec)
        matches.append(
            Match(
                group,
                prediction,
                prediction.rounds == served_rounds,
                _distance(served_tau, served, served_rounds, prediction, run_spec.num_steps),
            )
        )
        log.info("candidate %s: predicted tau %.3f", group[0].fault, prediction.tau)
    matches.sort(key=lambda m: (not m.exact, m.distance))
    return matches, impossible


def trained_boundaries(source: DraftSource, target: LoadedTarget) -> tuple[tuple[int, ...], str]:
    """The aux boundaries the draft was trained on: its contract.json; an export without one, its engine's
    reading of its ids when every release reads them alike (then the served check can only find faults
    relative to that reading)."""
    from eaglewire.contract.contract import CONTRACT_FILE
    from eaglewire.contract.numbering import Engine, engine_readings

    if source.contract is not None:
        return tuple(source.contract.aux_boundaries), str(source.path / CONTRACT_FILE)
    where = f"{source.path / 'config.json'} (no contract.json)"
    if source.kind not in ("sglang", "vllm"):
        raise ConfigError(
            f"{source.path}: no contract.json", fix="pass a draft directory that has its contract.json"
        )
    readings = engine_readings(Engine(source.kind), target.architecture, source.layer_ids, target.num_layers)
    found = {r.boundaries for r in readings}
    if len(found) == 1 and None not in found:
        (boundaries,) = found
        assert boundaries is not None
        return boundaries, where
    raise ConfigError(
        f"{source.path}: no contract.json, and the engine's releases read its ids {fmt_list(source.layer_ids)} "
        "differently: "
        + "; ".join(r.text() for r in readings)
        + ": which boundaries it was trained on is unknown",
        fix="pass the eaglewire draft it was exported from as --draft (it has a contract.json)",
    )


def served_check_for(
    opts: Any,
    client: ServedClient,
    target: LoadedTarget,
    source: DraftSource,
    draft_model: Eagle3Draft | None,
    vllm_config: dict[str, Any] | None,
) -> ServedCheck:
    """The served check for `eaglewire doctor` (`doctor.run.run_doctor`): `opts` its DoctorOptions."""
    from eaglewire.engine.api import check_draft_fits_target

    if source.contract is not None:
        check_draft_fits_target(source.contract, target)
    if draft_model is None:
        from eaglewire.doctor.draft_source import load_engine_draft

        draft_model = load_engine_draft(source, target)
    trained, trained_from = trained_boundaries(source, target)
    served_opts = ServedOptions(
        url=opts.served,
        engine=opts.engine,
        prompts=opts.prompts,
        num_prompts=opts.num_prompts,
        max_tokens=opts.max_tokens,
        sglang_args=opts.sglang_args,
        vllm_config=vllm_config,
        timeout=client.timeout,
    )
    return check_served(
        served_opts, target=target, draft=draft_model, trained=trained, source=source, trained_from=trained_from,
        client=client,
    )  # fmt: skip
