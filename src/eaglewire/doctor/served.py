"""`eaglewire doctor --served URL`: is a live deployment feeding the draft what it was trained on?

1. Send the prompts (default: `default_prompts`, a mix of MT-bench first turns and held-out HumanEval
   prompts), greedy, `max_tokens` each, one at a time (`--concurrency N`: from N clients at once, as a
   batching server's load; per-response reports only, /metrics compared over all of them), and read the served acceptance the engine's way
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
   bench measured 0.5-2% (log §2p), so served matches predicted when
   |served - predicted| <= max(REL_TOL * predicted, ABS_TOL). (A server may count drafts of a text's last
   round accepted past max_tokens, which the replay cannot see: per-position acceptance only, not tau.)
4. Served short of that: replay every candidate miswiring (`doctor.miswirings`) and name the one whose
   prediction matches what was served (exact, round for round, first; then the closest tau within its
   error), with the config key or server flag that undoes it. Served above it: the server is not serving
   this draft with this target on greedy text.

Exit 0 when served matches predicted; 1 with a named fault, or "short, no candidate explains it"; 2
when the input is unusable (the server unreachable, its answers missing the engine's fields).

Step 2 lives in `doctor.served_replay`, steps 3-4 in `doctor.served_compare`; this module sends the prompts
and works out what the server runs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglewire.bench.prompts import PromptSet, load_prompt_set
from eaglewire.doctor.findings import Finding, fmt_list
from eaglewire.doctor.miswirings import ServedFormat, ServedSetup, declared_spec
from eaglewire.doctor.served_client import (
    Engine,
    RoundCounts,
    ServedClient,
    ServedResponse,
    ServerError,
    agreement,
    pooled_agreement,
)
from eaglewire.doctor.served_compare import CHECK, ServedCheck, compare_served
from eaglewire.doctor.served_replay import served_texts
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.errors import ConfigError, EaglewireError

if TYPE_CHECKING:
    from eaglewire.doctor.draft_source import DraftSource
    from eaglewire.draft.model import Eagle3Draft
    from eaglewire.target.loading import LoadedTarget

log = logging.getLogger(__name__)

DEFAULT_MT_BENCH = 6  # MT-bench first turns in the default mix (every 10th question: six categories)
DEFAULT_HUMANEVAL = 4  # held-out HumanEval prompts in the default mix
DEFAULT_MIX = "mt-bench + humaneval-eval"


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
    concurrency: int = (
        1  # clients sending at once (1: one request at a time, each with its /metrics increase)
    )

    def prompt_set(self) -> PromptSet:
        if self.prompts is None:
            return default_prompts(self.num_prompts)
        return load_prompt_set(self.prompts, self.num_prompts)


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
        "sending %d prompts to %s (%s), max_tokens %d, %d at once",
        len(prompts), client.url, opts.engine, opts.max_tokens, opts.concurrency,
    )  # fmt: skip
    responses, pooled_disagree = _send(client, prompts, opts)
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
        disagree = [line for r in responses for line in agreement(r)] + pooled_disagree
        if disagree:
            result.findings.append(
                Finding(
                    check="served.stats_disagree",
                    severity="error",
                    what="the server's two acceptance reports disagree (per response vs /metrics)",
                    declared="SGLang's sglext.spec_tokens_details per response",
                    actual="vLLM's spec_decode counters' increase over the same request"
                    + ("" if opts.concurrency == 1 else "s (all of them: they were sent at once)"),
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


def _send(
    client: ServedClient, prompts: Sequence[Any], opts: ServedOptions
) -> tuple[list[ServedResponse], list[str]]:
    """Every prompt's answer, in prompt order; from `opts.concurrency` clients at once when above 1 (then
    /metrics is read around all of them: what it says is compared with the sum of the responses)."""
    if opts.concurrency <= 1:
        return [client.chat(p.prompt_id, p.chat(), max_tokens=opts.max_tokens) for p in prompts], []
    from concurrent.futures import ThreadPoolExecutor

    with_metrics = opts.engine == "eaglewire"
    before = client.metrics() if with_metrics else None
    with ThreadPoolExecutor(max_workers=opts.concurrency, thread_name_prefix="doctor-client") as pool:
        responses = list(
            pool.map(
                lambda p: client.chat(p.prompt_id, p.chat(), max_tokens=opts.max_tokens, metrics=False),
                prompts,
            )
        )
    if before is None:
        return responses, []
    return responses, pooled_agreement(responses, before, client.metrics(), client.url)


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
        concurrency=getattr(opts, "concurrency", 1),
    )
    return check_served(
        served_opts, target=target, draft=draft_model, trained=trained, source=source, trained_from=trained_from,
        client=client,
    )  # fmt: skip
