"""One benchmark run: every method on the same prompts, target weights and device, batch 1, greedy.

Methods (`METHODS`):

| name                 | what                                                                  |
|----------------------|-----------------------------------------------------------------------|
| `plain`              | eaglewire's plain decoding (`eaglewire.engine.plain`, fast runtime)    |
| `eagle-chain`        | EAGLE-3 chain of `chain_steps` draft tokens                           |
| `eagle-tree`         | EAGLE-3 dynamic tree (`tree_num_steps`, `tree_topk`, `tree_num_draft_tokens`) |
| `hf-generate`        | transformers `generate`, greedy (see `eaglewire.bench.baselines`)      |
| `hf-prompt-lookup`   | transformers prompt-lookup decoding                                   |
| `hf-static-compiled` | transformers static cache + torch.compile ("not available" where it cannot run) |

Timing (`eaglewire.bench.timing`): per method and prompt, `warmup` untimed runs, then `repeats`
timed ones (CUDA events on a GPU, perf_counter on CPU); a prompt's time is the median. Greedy outputs of every method are compared with `plain` (or the first method that ran)
and every difference is reported with the target's logit margin there (`eaglewire.bench.divergence`):
a speculative decoder that differs from plain greedy where the target clearly prefers plain's token
is a bug; at a near-tie it is the dtype's rounding (bf16: the verify and decode forwards round
differently); where the target clearly prefers the speculative token, plain's decode drifted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from eaglewire.bench.baselines import (
    DEFAULT_PROMPT_LOOKUP_TOKENS,
    HF_METHODS,
    check_compiled,
    make_hf_baseline,
    static_compiled_unavailable,
)
from eaglewire.bench.divergence import add_margins
from eaglewire.bench.engine_adapter import (
    Engine,
    Outcome,
    load_engine,
    make_plain_runner,
    plain_fn,
    speculative_fn,
)
from eaglewire.bench.prompts import PromptSet, encode_prompt
from eaglewire.bench.report import BenchReport, describe_device, now_iso
from eaglewire.bench.results import MethodResult, PromptRun, fill_comparisons
from eaglewire.bench.timing import Stopwatch
from eaglewire.engine.fits import ContextFit, model_positions
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.errors import ConfigError
from eaglewire.predict.predictor import PredictionRow, TauPredictor, prediction_rows
from eaglewire.predict.served import ServedInputs, ServedPrediction, float32_draft, served_predictions
from eaglewire.target.loading import LoadedTarget, dtype_name
from eaglewire.typed_config import help_field

log = logging.getLogger(__name__)

SPECULATIVE_METHODS = ("eagle-chain", "eagle-tree")
EAGER_HF_METHODS = ("hf-generate", "hf-prompt-lookup")  # no graphs or compilation per prompt length
METHODS = ("plain", *SPECULATIVE_METHODS, *HF_METHODS)
DecodeFn = Callable[[list[int], int], Outcome]


@dataclass(frozen=True)
class BenchConfig:
    max_new_tokens: int = help_field("most tokens generated per prompt", default=256)
    methods: tuple[str, ...] = help_field(
        f"methods to run, in order; any of {', '.join(METHODS)}", default=METHODS
    )
    chain_steps: int = help_field("eagle-chain: draft tokens per round (topk=1)", default=5)
    tree_num_steps: int = help_field("eagle-tree: SGLang --speculative-num-steps (depth)", default=5)
    tree_topk: int = help_field("eagle-tree: SGLang --speculative-eagle-topk", default=4)
    tree_num_draft_tokens: int = help_field(
        "eagle-tree: SGLang --speculative-num-draft-tokens (root incl.)", default=8
    )
    warmup: int = help_field("untimed runs of every prompt per method, before its timed runs", default=1)
    repeats: int = help_field("timed runs per prompt; the median is reported", default=3)
    chat: bool = help_field("apply the target's chat template to the prompts", default=True)
    prompt_lookup_num_tokens: int = help_field(
        "hf-prompt-lookup: prompt_lookup_num_tokens", default=DEFAULT_PROMPT_LOOKUP_TOKENS
    )
    served_prediction: bool = help_field(
        "after each speculative setting, replay it offline over the text it served and report that "
        "predicted tau beside the measured one (eaglewire.predict.served)",
        default=True,
    )

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise ConfigError(f"methods: unknown {unknown or 'none given'}; known: {', '.join(METHODS)}")
        if len(set(self.methods)) != len(self.methods):
            raise ConfigError(f"methods: duplicated in {list(self.methods)}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens: expected >= 1, got {self.max_new_tokens}")
        if self.warmup < 0 or self.repeats < 1:
            raise ConfigError(
                f"warmup/repeats: expected warmup >= 0 and repeats >= 1, got {self.warmup}/{self.repeats}"
            )
        if self.uses_draft:
            self.chain_spec()
            self.tree_spec()

    @property
    def uses_draft(self) -> bool:
        return any(m in SPECULATIVE_METHODS for m in self.methods)

    @property
    def max_tree_tokens(self) -> int:
        """Positions the widest method keeps for a draft tree (`engine.fits`): 0 without a speculative one."""
        widths = [0]
        if "eagle-chain" in self.methods:
            widths.append(self.chain_spec().num_draft_tokens)
        if "eagle-tree" in self.methods:
            widths.append(self.tree_num_draft_tokens)
        return max(widths)

    def chain_spec(self) -> SpecArgs:
        return SpecArgs.chain(self.chain_steps)

    def tree_spec(self) -> SpecArgs:
        return SpecArgs(
            num_steps=self.tree_num_steps, topk=self.tree_topk, num_draft_tokens=self.tree_num_draft_tokens
        )


def spec_settings(spec: SpecArgs) -> dict[str, int]:
    return {"num_steps": spec.num_steps, "topk": spec.topk, "num_draft_tokens": spec.num_draft_tokens}


def check_set_fits(
    fit: ContextFit, prompts: PromptSet, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int
) -> None:
    """Every prompt of the set (its ids as encoded) within `fit` with `max_new_tokens`; else a
    ConfigError naming the set, the first prompt that does not fit and the lengths (`engine.fits`)."""
    lengths = [(p.prompt_id, len(ids)) for p, ids in zip(prompts.prompts, prompt_ids, strict=True)]
    fit.check_all(lengths, max_new_tokens, where=f"prompt set {prompts.name}")


@dataclass
class Workload:
    """The prompts of a run, encoded once, and the pieces every method shares."""

    target: LoadedTarget
    prompts: PromptSet
    prompt_ids: list[list[int]]
    max_new_tokens: int
    watch: Stopwatch

    @classmethod
    def build(cls, target: LoadedTarget, prompts: PromptSet, *, max_new_tokens: int, chat: bool) -> Workload:
        if not prompts.prompts:
            raise ConfigError(f"prompt set {prompts.name!r} is empty")
        ids = [encode_prompt(target.tokenizer, p, chat=chat) for p in prompts.prompts]
        return cls(target, prompts, ids, max_new_tokens, Stopwatch(target.device))

    def max_seq_len(self, max_nodes: int, *, capacity: int | None = None) -> int:
        """Room for the longest prompt, its answer and one verified tree of `max_nodes` (0: plain only),
        at most the target's positions. Every prompt is checked first (`engine.fits`): one that cannot
        fit (in `capacity` too, a runner's max_seq_len when one is built) is a ConfigError naming it."""
        self.check_fits(max_nodes, capacity=capacity)
        room = max(len(p) for p in self.prompt_ids) + self.max_new_tokens + max_nodes + 1
        positions = model_positions(self.target.config)
        return room if positions is None else min(room, positions)

    def check_fits(self, max_nodes: int, *, capacity: int | None = None) -> None:
        """Every prompt + max_new_tokens + a tree of `max_nodes` within the target's positions (and
        `capacity`), before anything is decoded; a ConfigError naming the first prompt that is not."""
        fit = ContextFit.of(
            positions=model_positions(self.target.config), capacity=capacity, tree_tokens=max_nodes
        )
        check_set_fits(fit, self.prompts, self.prompt_ids, self.max_new_tokens)

    def decode_text(self, ids: Sequence[int]) -> str:
        return str(self.target.tokenizer.decode(list(ids), skip_special_tokens=True))


def measure_method(
    name: str,
    fn: DecodeFn,
    work: Workload,
    *,
    warmup: int,
    repeats: int,
    settings: dict[str, Any] | None = None,
    warm_every_prompt: bool = True,
) -> MethodResult:
    """Time `fn` on every prompt of `work`: `warmup` untimed runs of that prompt, then the median of
    `repeats`. Warming every prompt (not just the first) keeps CUDA-graph capture and compilation for
    each prompt's lengths out of the timings, as a server captures its graphs before serving; a
    first-prompt-only warm-up measured up to 30x slower first runs on the H200. Methods with
    nothing to capture per length (transformers' eager generate, anything on CPU) warm up on the
    first prompt only."""
    n = work.max_new_tokens
    runs = []
    for index, (prompt, ids) in enumerate(
        tqdm(
            list(zip(work.prompts.prompts, work.prompt_ids, strict=True)),
            desc=name,
            unit="prompt",
            leave=False,
        )
    ):
        warm = warmup if warm_every_prompt or index == 0 else 0
        timed = work.watch.measure(lambda ids=ids: fn(ids, n), warmup=warm, repeats=repeats)  # type: ignore[misc]
        out: Outcome = timed.value
        runs.append(
            PromptRun(
                prompt_id=prompt.prompt_id,
                prompt_tokens=len(ids),
                token_ids=out.token_ids,
                seconds=timed.seconds,
                all_seconds=timed.all_seconds,
                text=work.decode_text(out.token_ids),
                finish_reason=out.finish_reason,
                tau=out.tau,
                num_verifications=out.num_verifications,
                per_position_acceptance=out.per_position_acceptance,
                phase_seconds=out.phase_seconds,
                accepted_per_round=out.accepted_per_round,
                emitted_per_round=out.emitted_per_round,
                accepted_paths=out.accepted_paths,
                category=prompt.category,
            )
        )
    result = MethodResult(name, available=True, settings=settings or {}, runs=runs)
    log.info(
        "%s: %.1f tok/s%s", name, result.tokens_per_s or 0.0, f", tau {result.tau:.2f}" if result.tau else ""
    )
    return result


def _hf_fn(name: str, work: Workload, engine: Engine, cfg: BenchConfig) -> tuple[DecodeFn | None, str]:
    """(decode fn, '') or (None, why it is not available)."""
    model = work.target.model
    if name == "hf-static-compiled":
        why = static_compiled_unavailable(model)
        if why:
            return None, why
    baseline = make_hf_baseline(
        name, model, engine.eos_token_ids, prompt_lookup_num_tokens=cfg.prompt_lookup_num_tokens
    )

    def run(ids: list[int], max_new_tokens: int) -> Outcome:
        return Outcome(token_ids=baseline(ids, max_new_tokens))

    if name == "hf-static-compiled":
        try:  # a compile failure is a finding about transformers/torch on this machine, not a crash
            run(work.prompt_ids[0], work.max_new_tokens)
        except Exception as e:
            log.warning("hf-static-compiled failed on this version", exc_info=True)
            return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        why = check_compiled(model)
        if why:
            return None, why
    return run, ""


def method_fn(
    name: str, work: Workload, engine: Engine, cfg: BenchConfig
) -> tuple[DecodeFn | None, str, dict[str, Any]]:
    """(decode fn or None, reason when None, settings) for one of METHODS."""
    if name == "plain":
        batch_fn = plain_fn(engine, make_plain_runner(engine, 1))
        return (lambda ids, n: batch_fn([ids], n)[0]), "", {"batch_size": 1}
    if name in SPECULATIVE_METHODS:
        if engine.draft is None:
            return None, "no draft given (--draft)", {}
        spec = cfg.chain_spec() if name == "eagle-chain" else cfg.tree_spec()
        return speculative_fn(engine, spec), "", spec_settings(spec)
    settings = (
        {"prompt_lookup_num_tokens": cfg.prompt_lookup_num_tokens} if name == "hf-prompt-lookup" else {}
    )
    fn, why = _hf_fn(name, work, engine, cfg)
    return fn, why, settings


def run_benchmark(
    target: LoadedTarget,
    draft_dir: Path | None,
    prompts: PromptSet,
    cfg: BenchConfig,
    *,
    meta: dict[str, Any] | None = None,
    engine: Engine | None = None,
    predictor: TauPredictor | None = None,
) -> BenchReport:
    """Run every method of `cfg` on `prompts`; the report has per-method aggregates and comparisons, and
    (with `predictor`, e.g. an `eaglewire.predict.evaluation.EvalResult`) predicted vs measured tau."""
    if cfg.uses_draft and draft_dir is None and (engine is None or engine.draft is None):
        raise ConfigError(
            f"methods {[m for m in cfg.methods if m in SPECULATIVE_METHODS]} need a draft",
            fix="pass --draft DIR",
        )
    work = Workload.build(target, prompts, max_new_tokens=cfg.max_new_tokens, chat=cfg.chat)
    nodes = cfg.max_tree_tokens
    if engine is None:
        engine = load_engine(target, draft_dir, max_seq_len=work.max_seq_len(nodes))
    else:  # one engine for several prompt sets: each set must fit the runner it was sized with
        work.check_fits(nodes, capacity=engine.max_seq_len)
    results: dict[str, MethodResult] = {}
    for name in cfg.methods:
        fn, why, settings = method_fn(name, work, engine, cfg)
        if fn is None:
            log.info("%s: not available: %s", name, why)
            results[name] = MethodResult(name, available=False, reason=why, settings=settings)
            continue
        results[name] = measure_method(
            name,
            fn,
            work,
            warmup=cfg.warmup,
            repeats=cfg.repeats,
            settings=settings,
            # only CUDA captures graphs and compiles per prompt length; on CPU everything runs
            # eagerly, so warming the first prompt is enough (it halves the CPU quickstart's decode)
            warm_every_prompt=target.device.type == "cuda" and name not in EAGER_HF_METHODS,
        )
    reference = "plain" if "plain" in results else next((n for n, r in results.items() if r.available), None)
    fill_comparisons(results, reference)
    if reference is not None:
        prompt_ids = {p.prompt_id: ids for p, ids in zip(prompts.prompts, work.prompt_ids, strict=True)}
        for r in results.values():
            add_margins(
                target,
                prompt_ids,
                results[reference].runs,
                r.mismatches or [],
                dtype=dtype_name(target.dtype),
            )
    info = {
        "target": str(target.path),
        "draft": None if draft_dir is None else str(draft_dir),
        "prompts": prompts.name,
        "num_prompts": len(prompts.prompts),
        "device": describe_device(target.device),
        "dtype": dtype_name(target.dtype),
        "max_new_tokens": cfg.max_new_tokens,
        "warmup": cfg.warmup,
        "repeats": cfg.repeats,
        "chat_template": cfg.chat,
        "date": now_iso(),
        **(meta or {}),
    }
    measured = [
        (cfg.chain_spec() if name == "eagle-chain" else cfg.tree_spec(), results[name].tau)
        for name in SPECULATIVE_METHODS
        if name in results and results[name].available
    ]
    predictions = prediction_rows(predictor, measured) if predictor is not None else []
    served = _served(cfg, engine, draft_dir, work, results, predictions) if cfg.served_prediction else []
    return BenchReport(
        meta=info, results=results, reference=reference, predictions=predictions, served_predictions=served
    )


def _served(
    cfg: BenchConfig,
    engine: Engine,
    draft_dir: Path | None,
    work: Workload,
    results: dict[str, MethodResult],
    heldout: list[PredictionRow],
) -> list[ServedPrediction]:
    """The prediction on the served text for every speculative setting that ran (empty without any)."""
    specs = {
        name: cfg.chain_spec() if name == "eagle-chain" else cfg.tree_spec()
        for name, r in results.items()
        if name in SPECULATIVE_METHODS and r.available and r.runs
    }
    if not specs or engine.draft is None:
        return []
    if draft_dir is not None:  # float32 weights, as `eaglewire eval` and the held-out prediction load them
        from eaglewire.draft.io import load_draft

        draft, contract = load_draft(Path(draft_dir), device=work.target.device)
    elif engine.contract is not None:
        draft, contract = float32_draft(engine.draft), engine.contract
    else:
        log.warning(
            "served prediction skipped: the engine holds no draft contract (load it with load_engine)"
        )
        return []
    inputs = ServedInputs(
        work.target, draft, contract, work.prompt_ids, {m: (s, results[m]) for m, s in specs.items()}, heldout
    )
    return served_predictions(inputs)
