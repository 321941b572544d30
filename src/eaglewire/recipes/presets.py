"""Quickstart presets: how much data, training and decoding the recipe does on each kind of machine.

A preset nests one sub-config per stage: `data` (DataPlan), `train` (the TrainConfig the train stage
runs, as is) and `decode` (DecodePlan); the target's dtype and device and the draft's MLP width sit on
the preset itself. `cpu` must finish within 15 minutes on a 2-core machine (setup included) and still
show tau > 1.5; `gpu` is the full recipe (goal: tau >= 3.5 with a chain of 5 on one H200 in <= 20 minutes).
Comments give each setting's reason; `log §2t` names a section of docs/history/benchmarks-log.md,
where the measurements behind it are.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Any, Literal

from eaglewire.errors import ConfigError
from eaglewire.train.config import TrainConfig
from eaglewire.typed_config import help_field

STAGE_CONFIGS = ("data", "train", "decode")  # the preset's sub-configs, each named after its stage
# Tokens a long record keeps free past its answer: the end-of-turn text, and an answer re-tokenized a
# little longer than it was generated.
LONG_END_ROOM = 16


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
        # 0: 1,024 rows ran Magpie at ~110k tok/s, but regeneration only 64.3k against 57.8k at 256 (log §2v)
        default=0,
    )
    magpie_opened_fraction: float = help_field(
        "share of the Magpie prompts started with an instruction opening (eaglewire.data.magpie."
        "MAGPIE_OPENINGS: 'Write', 'Solve', 'Act as', ...); 0 = every prompt as the target asks it",
        default=0.0,  # the gpu preset opens half (log §2k); off elsewhere
    )
    train_from_shards: bool = help_field(
        "capture the target's hidden states to shards once (data stage) and train from them (offline); "
        "else the target runs inside every training step (online)",
        # online on the GPU until measured end to end (the target's side: 51 of a 158 ms step, log §2l);
        # `benchmarks/train_profile.py --data online,offline` times both
        default=False,
    )
    capture_max_batch_tokens: int = help_field(
        "with train_from_shards: tokens per capture forward (0 = the capture's default)",
        default=0,
    )
    regen_max_prompt_tokens: int = help_field(
        "the longest prompt the regeneration of the chitchat, humaneval and Magpie conversations sends, in "
        "tokens (a turn past it ends its conversation); 0 = train.max_length - regen_max_new_tokens. With "
        "long records, keep it at the short rows' room (e.g. 768): it also sizes that regeneration's runner",
        default=0,
    )
    # Long-context training records (issue 54; docs/data.md "Long-context training data"): off in every
    # preset until a GPU run has measured them against the 20-minute budget.
    long_conversations: int = help_field(
        "long training conversations taken from the long-chat train split (chitchat conversations joined, "
        "every assistant turn trained); 0 = none",
        default=0,
    )
    long_documents: int = help_field(
        "long training documents taken from the long-docs train split (a transformers source file or its "
        "docstrings with a question, answered by the target: needs regenerate); 0 = none",
        default=0,
    )
    long_user_turns: int = help_field(
        "user turns kept per long conversation (0 = all: the regeneration answers them in order until the "
        "prompt would pass long_max_tokens)",
        default=0,
    )
    long_max_tokens: int = help_field(
        "the longest long record, in tokens: regeneration stops a long conversation (and leaves out a "
        "document) whose prompt leaves no room for an answer within it; train.max_length must admit it",
        default=8192,
    )
    long_regen_batch_size: int = help_field(
        "long records regenerated together (each row holds up to long_max_tokens)", default=64
    )
    long_regen_max_seconds: float = help_field(
        "time budget for regenerating the long records (0 = all of them)", default=0.0
    )

    @property
    def has_long_records(self) -> bool:
        return self.long_conversations > 0 or self.long_documents > 0

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
            ("regen_max_prompt_tokens", "0 = train.max_length - regen_max_new_tokens"),
            ("long_conversations", "0 = none"),
            ("long_documents", "0 = none"),
            ("long_user_turns", "0 = all"),
            ("long_regen_max_seconds", "0 = no budget"),
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0 ({meaning}), got {getattr(self, name)}")
        if self.regen_max_seconds < 0:
            raise ConfigError(
                f"regen_max_seconds must be >= 0 seconds (0 = no budget), got {self.regen_max_seconds}"
            )
        if self.long_regen_batch_size < 1:
            raise ConfigError(f"long_regen_batch_size must be >= 1, got {self.long_regen_batch_size}")
        if self.has_long_records and self.long_max_tokens < self.regen_max_new_tokens + LONG_END_ROOM + 1:
            raise ConfigError(
                f"long_max_tokens must leave a prompt room beside an answer: at least regen_max_new_tokens + "
                f"{LONG_END_ROOM + 1}, got long_max_tokens={self.long_max_tokens} with regen_max_new_tokens="
                f"{self.regen_max_new_tokens}"
            )
        if self.long_documents and not self.regenerate:
            raise ConfigError(
                f"long_documents={self.long_documents} needs regenerate=True: a long document has no answer of "
                "its own, the target writes it",
                fix="turn regenerate on, or set long_documents=0",
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
        data, max_length = self.data, self.train.max_length
        if data.has_long_records and data.long_max_tokens > max_length:
            raise ConfigError(
                f"preset {self.name!r}: data.long_max_tokens={data.long_max_tokens} is longer than "
                f"train.max_length={max_length}: training would cut every long record to {max_length} tokens",
                fix=f"raise train.max_length to {data.long_max_tokens} (--train-max-length; lower --batch-size to "
                "keep the tokens a step), or lower data.long_max_tokens",
            )
        if (
            data.regen_max_prompt_tokens
            and data.regen_max_prompt_tokens + data.regen_max_new_tokens > max_length
        ):
            raise ConfigError(
                f"preset {self.name!r}: data.regen_max_prompt_tokens + data.regen_max_new_tokens must fit "
                f"train.max_length, got {data.regen_max_prompt_tokens} + {data.regen_max_new_tokens} > {max_length}"
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
            # 2 unrolled steps and 5 epochs, not 3 and 4: the same training time, chain tau +0.10 (log §4)
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
            # all of chitchat plus Magpie prompts (instructions in the target's own distribution): chitchat
            # alone overfit; 60,000 Magpie prompts left the chains where they were (log §2v)
            chitchat_conversations=7168,
            humaneval_problems=131,
            magpie_prompts=20000,
            # first answers only, half the Magpie prompts opened as instructions ("Write", "Solve", ...): the
            # benchmark serves first turns of requests; later answers repeat their conversation (log §2i, §2k)
            user_turns=1,
            magpie_opened_fraction=0.5,
            regenerate=True,
            regen_max_seconds=180.0,  # a cap: all of them took ~137 s (log §2d)
            regen_max_new_tokens=256,
            regen_temperature=0.0,
            # conversations answered together, 256 rows at a time: batches of 256 left later turns ~45
            # prompts each (log §2, §2c)
            regen_batch_size=1024,
            # 46.6k tok/s continuous against 30.6k batch by batch (benchmarks/loop_profile.py, log §2c)
            regen_continuous=True,
            eval_conversations=64,
            draft_vocab_size=16384,
        ),
        train=replace(
            QUICKSTART_TRAIN,
            # regenerate -> train -> eval must fit 20 minutes on one H200: data ~220-260 s, training the rest,
            # tau still rising with its tokens at 840 s (log §2d, §2l, §2m)
            # `quickstart --regen-max-seconds / --train-max-seconds` override them.
            max_seconds=840.0,
            # 4, not EAGLE-3's 7: equal time trains 1.6x the optimizer steps, served tau rises (log §2z, §2zb)
            ttt_steps=4,
            # a bound the clock reaches first: 840 s took 6,765 optimizer steps, ~18 epochs (log §2zb)
            epochs=30,
            # 2e-3: 5e-4 and 1e-3 served lower, 4e-3 lost 0.09-0.14 on every set (log §2t, §2u, §2y)
            learning_rate=2e-3,
            max_length=1024,
            # 16 rows, not 8: 8-row batches trained 19% fewer tokens in 840 s and lost on every set (log §2zc)
            batch_size=16,
            # compile off: 0.91x eager's tokens/s at 7 unrolled steps (log §2i).
            # ttt_attention blocked: flex trained 10% fewer steps and scored lower on every set (log §2za).
            # hard_label_weight 0: 1 kept the chains but shortened trees, a one-hot drops the target's other
            # choices (log §2j).
            # source_repeats none: chitchat x2 + HumanEval x4 gained in the noise, lost on MT-bench (log §2y).
        ),
        # 4,608 (3x the target's 1,536): served chains +0.03 to +0.14, a round 1-5% dearer (log §2zd, §2ze);
        # SGLang and vLLM read the width from the export's config.json
        draft_intermediate_size=4608,
        decode=DecodePlan(
            # all held-out prompts the eval replays, not the first 8 (chitchat's: 0.43 low, log §2u); ~+30 s
            prompts=64,
            max_new_tokens=128,
            # user-like sets first (the headline; issue 47), then the in-distribution held-out ones
            prompt_sets=("mt-bench", "user-eval", "chitchat-eval", "humaneval-eval"),
            chain_steps=5,
            # 8 steps of top-8 or more: the fastest shape of the H200 sweep (log §2f); 128 nodes: the 127
            # best candidates include the 63 best, so tau only rises, and the verify costs no more (log §2h);
            # top-12: tau 4.05 against top-8's 3.87 on all 80 MT-bench, a 4.5% dearer round (log §2q, §2r)
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
