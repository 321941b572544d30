"""Quickstart presets: how much data, training and decoding the recipe does on each kind of machine.

A preset nests one sub-config per stage: `data` (DataPlan), `train` (the TrainConfig the train stage
runs, as is) and `decode` (DecodePlan); the target's dtype and device and the draft's MLP width sit on
the preset itself. `cpu` must finish within 15 minutes on a 2-core machine (setup included) and still
show tau > 1.5; `gpu` is the full recipe (goal: tau >= 3.5 with a chain of 5 on one H200 in <= 20 minutes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Any, Literal

from eaglewire.errors import ConfigError
from eaglewire.train.config import TrainConfig
from eaglewire.typed_config import help_field

STAGE_CONFIGS = ("data", "train", "decode")  # the preset's sub-configs, each named after its stage


@dataclass(frozen=True)
class DataPlan:
    """The data stage: which conversations, their regeneration by the target, the draft vocabulary."""

    chitchat_conversations: int = help_field("training conversations taken from the chitchat train split")
    humaneval_problems: int = help_field("training problems taken from the humaneval train split (0 = none)")
    magpie_prompts: int = help_field("prompts sampled from the target itself (Magpie); 0 = none")
    user_turns: int = help_field("user turns kept per conversation (1 = first answers only)")
    regenerate: bool = help_field(
        "answer every kept user turn with the target (EAGLE-3's recipe); False trains on the data set's "
        "own answers, the target's distribution still being the label (online training)"
    )
    regen_max_seconds: float = help_field(
        "time budget for regenerating the training conversations (0 = all of them); the held-out ones "
        "are always regenerated whole"
    )
    regen_max_new_tokens: int = help_field("the longest regenerated answer, in tokens")
    regen_temperature: float = help_field("regeneration temperature (0 = the target's greedy answers)")
    regen_batch_size: int = help_field("conversations regenerated together")
    eval_conversations: int = help_field("held-out conversations per built-in set for offline evaluation")
    draft_vocab_size: int = help_field(
        "Vd: the draft's vocabulary, chosen by frequency in the training answers"
    )
    regen_continuous: bool = help_field(
        "refill generation rows as answers finish (continuous batching) instead of running each batch to "
        "its longest answer; same greedy answers",
        default=False,  # faster on the H200 (46.6k vs 30.6k tok/s): the gpu preset turns it on
    )
    regen_rows: int = help_field(
        "the most rows one generation forward runs, in regeneration and Magpie sampling (0 = the "
        "engine's default, eaglewire.engine.plain.DEFAULT_MAX_BATCH): more rows, more tokens a decoding "
        "step, on a GPU for little more time a step; with regen_continuous, keep regen_batch_size a few "
        "times larger, or finished rows have no prompt to take next",
        # 1,024 rows in H200 run 22 (BENCHMARKS.md 2v): Magpie rounds at ~110k tok/s, but regeneration's
        # batches of 1,024 filled the rows once (64.3k tok/s against 57.8k at 256 rows)
        default=0,
    )
    magpie_opened_fraction: float = help_field(
        "share of the Magpie prompts started with an instruction opening (eaglewire.data.magpie."
        "MAGPIE_OPENINGS: 'Write', 'Solve', 'Act as', ...); 0 = every prompt as the target asks it",
        default=0.0,  # the gpu preset opens half (H200 run 11); off elsewhere
    )
    train_from_shards: bool = help_field(
        "capture the target's hidden states to shards once (data stage) and train from them (offline); "
        "else the target runs inside every training step (online)",
        # online on the GPU until measured: `benchmarks/train_profile.py --data online,offline` times both
        # (run 9's profile: the target's side 51 of a 158 ms step; BENCHMARKS.md 2l)
        default=False,
    )
    capture_max_batch_tokens: int = help_field(
        "with train_from_shards: tokens per capture forward (0 = the capture's default)",
        default=0,
    )

    def __post_init__(self) -> None:
        if self.user_turns < 1:
            raise ConfigError(f"user_turns must be >= 1, got {self.user_turns}")
        if not 0.0 <= self.magpie_opened_fraction <= 1.0:
            raise ConfigError(
                f"magpie_opened_fraction must be within 0..1, got {self.magpie_opened_fraction}"
            )
        for name, meaning in (
            ("capture_max_batch_tokens", "0 = the capture's default"),
            ("regen_rows", "0 = the engine's default"),
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0 ({meaning}), got {getattr(self, name)}")
        if self.regen_max_seconds < 0:
            raise ConfigError(
                f"regen_max_seconds must be >= 0 seconds (0 = no budget), got {self.regen_max_seconds}"
            )


@dataclass(frozen=True)
class DecodePlan:
    """The decode stage: which held-out prompts, and the chain and tree it decodes them with. The eval
    stage predicts tau for the same chain and tree depth at the same horizon (max_new_tokens)."""

    prompts: int = help_field(
        "the first this many prompts decoded per prompt set (0 = all; a set in whole_sets is decoded whole "
        "instead)"
    )
    max_new_tokens: int = help_field("tokens generated per decoded prompt")
    prompt_sets: tuple[str, ...] = help_field("prompt sets decoded at the end (held-out only)")
    chain_steps: int = help_field("draft tokens per round of the chain setting (topk=1)")
    tree_num_steps: int = help_field("tree setting: SGLang --speculative-num-steps")
    tree_topk: int = help_field("tree setting: SGLang --speculative-eagle-topk")
    tree_num_draft_tokens: int = help_field("tree setting: SGLang --speculative-num-draft-tokens")
    hf_baseline_sets: tuple[str, ...] = help_field(
        "prompt sets on which the transformers baselines (generate, prompt lookup, static-cache compiled) are also timed (they are slow)"
    )
    timing_repeats: int = help_field("timed runs per prompt and method (median reported)")
    hf_baseline_prompts: int = help_field(
        "the first this many prompts of each hf_baseline_sets set, decoded by the transformers baselines "
        "beside ours in a run of their own (0 = prompts)",
        default=0,
    )
    whole_sets: tuple[str, ...] = help_field(
        "prompt sets decoded whole (every prompt) instead of their first `prompts`, by our plain, "
        "chain and tree decoders, reported as '<set>-all' (MT-bench's first questions are all one "
        "category, writing)",
        default=(),
    )

    def __post_init__(self) -> None:
        outside = [s for s in (*self.hf_baseline_sets, *self.whole_sets) if s not in self.prompt_sets]
        if outside:
            raise ConfigError(
                f"hf_baseline_sets / whole_sets name {outside}, which prompt_sets {list(self.prompt_sets)} "
                "does not decode"
            )
        for name in ("prompts", "hf_baseline_prompts"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class QuickstartPreset:
    name: str = help_field("preset name")
    device: Literal["cpu", "cuda"] = help_field("where the target, training and decoding run")
    target_dtype: Literal["float32", "bfloat16"] = help_field("dtype of the target (and of decoding)")
    data: DataPlan = help_field("the data stage")
    train: TrainConfig = help_field(
        "the train stage's TrainConfig; its max_length is also the data stage's row length"
    )
    decode: DecodePlan = help_field(
        "the decode stage (its chain and tree depth and horizon: the eval stage's)"
    )
    draft_intermediate_size: int = help_field(
        "the draft layer's MLP width (0 = the target's, EAGLE-3's default)", default=0
    )

    def __post_init__(self) -> None:
        if self.train.ttt_attention == "flex" and self.device != "cuda":
            raise ConfigError(
                f"preset {self.name!r}: train.ttt_attention='flex' needs device='cuda' (FlexAttention has no "
                f"CPU backward), got device={self.device!r}"
            )
        if not 0 < self.data.regen_max_new_tokens < self.train.max_length:
            raise ConfigError(
                f"preset {self.name!r}: data.regen_max_new_tokens must be within 1..train.max_length-1 (an "
                f"answer leaves room for its prompt in a row), got data.regen_max_new_tokens="
                f"{self.data.regen_max_new_tokens} with train.max_length={self.train.max_length}"
            )
        if self.draft_intermediate_size < 0:
            raise ConfigError(
                f"preset {self.name!r}: draft_intermediate_size must be >= 0 (0 = the target's), got "
                f"{self.draft_intermediate_size}"
            )


# What every preset's training shares: a short warmup, a cosine to a tenth of the peak, a checkpoint
# every 200 steps to resume from, a metrics line every 10.
QUICKSTART_TRAIN = TrainConfig(warmup_ratio=0.05, min_lr_ratio=0.1, checkpoint_every=200, log_every=10)


PRESETS: dict[str, QuickstartPreset] = {
    # The whole pipeline in seconds on a tiny random target: what the integration test runs.
    "tiny": QuickstartPreset(
        name="tiny",
        device="cpu",
        target_dtype="float32",
        data=DataPlan(
            chitchat_conversations=8,
            humaneval_problems=2,
            magpie_prompts=0,
            user_turns=1,
            regenerate=True,
            regen_max_seconds=0.0,
            regen_max_new_tokens=12,
            regen_temperature=0.0,
            regen_batch_size=8,
            eval_conversations=2,
            draft_vocab_size=256,
            train_from_shards=True,  # the cpu preset's path
        ),
        train=replace(
            QUICKSTART_TRAIN, ttt_steps=2, epochs=1, learning_rate=1e-3, max_length=160, batch_size=2
        ),
        decode=DecodePlan(
            prompts=1,
            max_new_tokens=8,
            prompt_sets=("chitchat-eval",),
            chain_steps=3,
            tree_num_steps=2,
            tree_topk=2,
            tree_num_draft_tokens=4,
            hf_baseline_sets=(),
            timing_repeats=1,
        ),
    ),
    "cpu": QuickstartPreset(
        name="cpu",
        device="cpu",
        target_dtype="float32",
        data=DataPlan(
            chitchat_conversations=150,
            humaneval_problems=30,
            magpie_prompts=0,
            user_turns=1,
            regenerate=True,
            regen_max_seconds=0.0,
            regen_max_new_tokens=96,
            regen_temperature=0.0,
            regen_batch_size=60,
            eval_conversations=8,
            draft_vocab_size=4096,
            # The target's forward is most of an online CPU step (5.3 s of it against 2.65 s from shards,
            # 1,000 tokens, this 2-core CPU): capture once (76 s for the 22k training tokens at 4,096
            # tokens a forward; 134 s at the default 32,768) instead of once per epoch.
            train_from_shards=True,
            capture_max_batch_tokens=4096,
        ),
        train=replace(
            QUICKSTART_TRAIN,
            # 2 unrolled steps and 5 epochs, not 3 and 4: the same training time (133 against 136 s), and
            # chain tau 1.82 / 1.69 on chitchat / HumanEval against 1.72 / 1.59, trees 2.05 / 1.82 against
            # 2.05 / 1.79, held-out step-0 accuracy 0.46 against 0.42 (BENCHMARKS.md section 4, 2026-12-03;
            # the H200's lever of 2z). Earlier at 3 steps: 2 epochs 1.56 / 1.38, 4 epochs 1.82 / 1.60.
            ttt_steps=2,
            epochs=5,
            learning_rate=1e-3,
            max_length=512,
            batch_size=2,
        ),
        decode=DecodePlan(
            prompts=3,
            max_new_tokens=48,
            # user-eval first (its first 3: writing, roleplay, reasoning): the user-like row; ~47 s on 2 cores
            prompt_sets=("user-eval", "chitchat-eval", "humaneval-eval"),
            chain_steps=5,
            tree_num_steps=4,
            tree_topk=2,
            tree_num_draft_tokens=8,
            hf_baseline_sets=(),
            timing_repeats=1,
        ),
    ),
    "gpu": QuickstartPreset(
        name="gpu",
        device="cuda",
        target_dtype="bfloat16",
        data=DataPlan(
            # On 2026-11-29 4,000 chitchat conversations (699k answer tokens) ran out after 8 epochs in
            # 286 s with the draft starting to overfit, and MT-bench (instructions, out of that domain)
            # reached tau 1.4. Now: the whole chitchat train split with 3 user turns, and Magpie prompts
            # (instructions in the target's own distribution); the time budgets, not epochs, decide.
            # 10,000 Magpie prompts made 3.5M loss tokens in all, which a faster trainer would see ~15
            # times in the training budget: 20,000 (sampled at ~55k tok/s, ~1 minute) add ~3M more.
            # 60,000 (H200 run 22, BENCHMARKS.md 2v: 11.7M loss tokens) left the chains where they were (all
            # held-out chitchat / HumanEval / MT-bench 3.39 / 3.26 / 2.58 against 3.56 / 3.25 / 2.54): the
            # draft fits fresh Magpie text no better (step-0 0.714 against 0.704), and the data stage took 199 s more.
            chitchat_conversations=7168,
            humaneval_problems=131,
            magpie_prompts=20000,
            # First answers only, half the Magpie prompts opened as instructions ("Write", "Solve", ...):
            # the benchmark serves first turns of requests, and later answers repeat their conversation
            # (BENCHMARKS.md 2i). H200 run 11 against 3 turns and plain Magpie (run 9), tau chain / tree:
            # HumanEval 2.50 / 4.76 -> 2.61 / 4.96, all 80 MT-bench 2.13 / 3.36 -> 2.21 / 3.51, chitchat
            # 2.77 / 5.10 -> 2.74 / 5.03; the data stage 58 s shorter. Both changed at once (BENCHMARKS.md 2k).
            user_turns=1,
            magpie_opened_fraction=0.5,
            regenerate=True,
            regen_max_seconds=180.0,  # a cap: all of them took ~137 s (2026-12-01)
            regen_max_new_tokens=256,
            regen_temperature=0.0,
            # conversations answered together; generation runs them 256 rows at a time. Batches of 256
            # left only ~45 prompts for each later user turn (10k tok/s overall); with 1,024, continuous
            # batching and no cuDNN plan per prefill shape: 33.6k tok/s (2026-11-29)
            regen_batch_size=1024,
            # H200, 2026-11-29 (benchmarks/loop_profile.py, 1,024 chitchat prompts, 256 rows): 46.6k tok/s
            # continuous against 30.6k batch by batch
            regen_continuous=True,
            eval_conversations=64,
            draft_vocab_size=16384,
        ),
        train=replace(
            QUICKSTART_TRAIN,
            # regenerate -> train -> eval must fit 20 minutes on one H200. Measured (BENCHMARKS.md 2d,
            # these data settings): 20,000 Magpie prompts in ~35 s, all 25,873 training conversations
            # regenerated in ~137 s (39k tok/s), the data stage 202 s with regeneration cut at 120 s, so
            # ~220 s uncut; training at 76k tokens/s, and tau still rising with its tokens (31.6M in 420 s:
            # held-out step-0 accuracy 0.81). So training gets the rest: ~220-260 s + 840 s + ~5 s = ~18 min.
            # Leases trained 540 s (runs 8-11), 720 s (run 12: 59M tokens, tau +3-9% on every set but
            # the chitchat tree; BENCHMARKS.md 2l) and 840 s (run 13: 70.5M tokens, held-out accuracy
            # 0.82 ... 0.76, chains +1-6%, trees +2% but chitchat's -2%, recipe 16.6 min; 2m).
            # `quickstart --regen-max-seconds / --train-max-seconds` override them.
            max_seconds=840.0,
            # 4, not EAGLE-3's 7: a training step costs about one draft pass per unrolled step, so at equal
            # time 4 steps train 1.6x the optimizer steps. H200 lever screen, 200 s each (BENCHMARKS.md 2z),
            # chain-5 tau on run 22's served chitchat / HumanEval / MT-bench: 7 steps 2.95 / 2.46 / 2.08,
            # 5 steps 3.12 / 2.71 / 2.23, 4 steps 3.20 / 2.79 / 2.32; the 8x12x128 tree 5.12 / 4.11 / 3.27 ->
            # 5.35 / 4.59 / 3.62, although positions 4-7 are never trained (their accuracy falls faster).
            # Over the whole 840 s (H200 run 28, 2zb): 6,765 optimizer steps (7 steps: 4,727), served chains on
            # all held-out chitchat / HumanEval / MT-bench 3.70 / 3.31 / 2.54 (7 steps: 3.56 / 3.25 / 2.54), and
            # the 8x12x128 tree on all 80 MT-bench 4.34 (the best measured; run 19's draft 3.96).
            ttt_steps=4,
            # a bound the clock reaches first: 840 s at 4 steps took 6,765 optimizer steps (2zb), past 18 epochs
            # of 372
            epochs=30,
            # 2e-3, not the 5e-4 of runs 1-19: the lever screen of H200 run 20 (BENCHMARKS.md 2t; fresh drafts
            # of 1,000 steps on the same data) predicted chain-5 tau 2.37 / 2.67 / 2.92 on held-out answers at
            # 5e-4 / 1e-3 / 2e-3, and on run 19's served text chitchat 2.22 / 2.37 / 2.48, HumanEval 1.90 /
            # 2.27 / 2.44, MT-bench (80) 1.68 / 1.90 / 2.08: the largest lever screened (token alignment, the
            # top boundary at L, trained embeddings: -0.07 to +0.05). Over the whole budget (H200 run 21, 2u):
            # held-out step-0 accuracy 0.829 -> 0.845, served chains +0.25 / +0.28 / +0.18 (chitchat / HumanEval
            # first 8, all 80 MT-bench), the gain smaller than at 1,000 steps.
            learning_rate=2e-3,
            max_length=1024,
            # 16 rows, not 8: at 200 s 8-row batches ran 1.9x the steps and scored +0.01 to +0.08 (BENCHMARKS.md
            # 2za), but over the whole 840 s they trained 19% fewer tokens (107.6k against 131.2k tok/s) and lost on
            # every set: served chains 3.54 / 3.12 / 2.51 against 3.70 / 3.31 / 2.54, the MT-bench tree 4.17 against
            # 4.34 (H200 run 29, 2zc)
            batch_size=16,
            # compile off: 0.91x eager's tokens/s on the H200 at 7 unrolled steps (BENCHMARKS.md 2i).
            # ttt_attention blocked: on the H200 at 4 unrolled steps, flex trained 1,467 steps in 200 s against
            # blocked's 1,638 and scored lower on every set (BENCHMARKS.md 2za).
            # hard_label_weight 0: H200 run 10 (BENCHMARKS.md 2j), 1 against run 9's 0: chains the same (+-0.06),
            # trees lower (HumanEval 4.76 -> 4.34, MT-bench 3.36 -> 3.19): a one-hot drops the target's other choices.
            # source_repeats none: not yet measured: run 22 (BENCHMARKS.md 2v) lost 0.17 of chitchat's chain tau when
            # its share of the data fell from 28% to 11% of the conversations.
        ),
        # 4,608 (8x the hidden size), not the target's 1,536: at 200 s a 3x MLP cost 1.4% of the optimizer
        # steps and lifted the served chains +0.07 / +0.14 / +0.01 (BENCHMARKS.md 2zd; 2x heads or a 6x MLP
        # less). Over the whole 840 s (H200 run 31, 2ze) chain tau on all held-out chitchat / HumanEval /
        # MT-bench 3.73 / 3.45 / 2.58, the 97 held-out pooled 3.59 (run 28 at 1,536: 3.70 / 3.31 / 2.54,
        # pooled 3.50); a chain round costs 1-5% more against plain's forward, so the speed-ups over plain stay
        # within 2% of run 28's. SGLang and vLLM read the width from the export's config.json.
        draft_intermediate_size=4608,
        decode=DecodePlan(
            # The held-out prompts whose answers the eval stage replays (eval_conversations: chitchat's first
            # 64, HumanEval's 33), not their first 8: run 21's draft served chitchat's first 8 at chain tau 3.13
            # and all 64 at 3.56, HumanEval's 8 at 3.21 and all 33 at 3.25 (BENCHMARKS.md 2u); ~+30 s.
            prompts=64,
            max_new_tokens=128,
            # user-like sets first (the headline; issue 47), then the in-distribution held-out ones
            prompt_sets=("mt-bench", "user-eval", "chitchat-eval", "humaneval-eval"),
            chain_steps=5,
            # 8 steps of top-8: the fastest shape of the H200 sweep (BENCHMARKS.md 2f, 8 chitchat prompts:
            # 8x8x64 at 1,196 tok/s and tau 4.34, against 3.09 for the 6x4x16 tree earlier runs used).
            # 128 nodes rather than 64: the 127 best-scoring candidates include the 63 best, so tau can
            # only rise, and on the H200 the 128-node verify costs no more (BENCHMARKS.md 2h, all 80
            # MT-bench questions: tau 3.37 at 1,208 tok/s against 3.24 at 1,202). Top-12 rather than
            # top-8: on all 80 MT-bench questions tau 4.05 against 3.87 (run 16's draft, 2q), at a round
            # 4.5% dearer since the fused top-k (2.41 against 2.31 ms, 2r), so about as fast
            tree_num_steps=8,
            tree_topk=12,
            tree_num_draft_tokens=128,
            hf_baseline_sets=("mt-bench",),
            hf_baseline_prompts=8,  # transformers' generate runs at ~38 tok/s here: 8 x 128 tokens ~27 s a method
            # the 80 MT-bench questions, the set the EAGLE papers and SGLang report on (~1 minute more)
            whole_sets=("mt-bench", "user-eval"),  # user-eval's 84 in file order are grouped by category
            timing_repeats=1,
        ),
    ),
}


def with_overrides(preset: QuickstartPreset, overrides: dict[str, Any]) -> QuickstartPreset:
    """`preset` with the values of `overrides`, keyed by dotted path (`train.ttt_steps`,
    `data.regen_rows`, `draft_intermediate_size`); None keeps the preset's value. Each sub-config
    checks itself, then the preset its cross-stage rules; a refusal names the preset."""
    by_part: dict[str, dict[str, Any]] = {}
    for path, value in overrides.items():
        part, _, name = path.rpartition(".")
        owner = getattr(preset, part) if part in STAGE_CONFIGS else preset if not part else None
        if owner is None or name not in {f.name for f in dataclasses.fields(owner)} or name in STAGE_CONFIGS:
            raise ConfigError(f"preset overrides: unknown field {path!r}")
        if value is not None:
            by_part.setdefault(part, {})[name] = value
    try:
        parts = {part: replace(getattr(preset, part), **by_part[part]) for part in by_part if part}
        return replace(preset, **parts, **by_part.get("", {}))
    except ConfigError as e:
        if str(e).startswith(f"preset {preset.name!r}"):
            raise
        message = str(e).split("\n  fix: ")[0]
        raise ConfigError(f"preset {preset.name!r}: {message}", fix=e.fix) from None


def get_preset(name: str, overrides: dict[str, Any] | None = None) -> QuickstartPreset:
    """The preset `name` (tiny | cpu | gpu) with `overrides` (see `with_overrides`)."""
    if name not in PRESETS:
        raise ConfigError(f"--preset: expected one of {sorted(PRESETS)}, got {name!r}")
    return with_overrides(PRESETS[name], overrides or {})
