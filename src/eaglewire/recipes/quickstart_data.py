"""The quickstart's data stage: which conversations each split gets, their regeneration by the
target, tokenization, the draft vocabulary and (train_from_shards) the captured shards. The long
training records (DataPlan.long_*) come from quickstart_long."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from eaglewire.data.formats import Conversation, first_user_turns
from eaglewire.recipes.quickstart_run import QuickstartRun
from eaglewire.recipes.results import CaptureResult, DataSplitResult, DataStageResult


def _conversations(run: QuickstartRun, split: Literal["train", "eval"], loaded: Any) -> list[Conversation]:
    from eaglewire.data.builtin import load_builtin

    p = run.preset.data
    train = split == "train"
    chit = load_builtin("chitchat", split)[: p.chitchat_conversations if train else p.eval_conversations]
    code = load_builtin("humaneval", split)[: p.humaneval_problems if train else p.eval_conversations]
    convs = [first_user_turns(c, p.user_turns) for c in chit] + [first_user_turns(c, 1) for c in code]
    if train and p.magpie_prompts:
        from eaglewire.data.builtin import heldout_split
        from eaglewire.data.generation import pick_generate_fn
        from eaglewire.data.magpie import DEFAULT_MAGPIE_SAMPLING, cached_magpie_prompts

        sampling = replace(DEFAULT_MAGPIE_SAMPLING, batch_size=p.regen_batch_size)
        magpie = cached_magpie_prompts(
            loaded,
            run.path("data", "magpie_prompts.jsonl"),
            p.magpie_prompts,
            sampling=sampling,
            opened_fraction=p.magpie_opened_fraction,
            generate_fn=pick_generate_fn(max_rows=p.regen_rows),
        )
        convs += [first_user_turns(c, 1) for c in magpie if heldout_split(c.record_id) == "train"]
    if train and p.regenerate and p.regen_max_seconds > 0:
        # Regeneration may stop at its time budget: a fixed order that mixes the sources keeps each
        # of them covered (keyed by record id, so a resumed run sees the same order). Without a
        # budget the order only changes how prompts share batches, so the sources stay grouped.
        convs.sort(key=lambda c: hashlib.sha256(c.record_id.encode("utf-8")).hexdigest())
    return convs


def training_data_dir(run: QuickstartRun, split: Literal["train", "eval"]) -> Path:
    """What the train stage reads: the split's captured shards (train_from_shards) or its tokenized
    records (the target then runs inside training)."""
    return run.path("data", f"{split}_shards" if run.preset.data.train_from_shards else split)


def stage_data(run: QuickstartRun, loaded: Any) -> DataStageResult:
    """Regenerate answers with the target (train and held-out eval), tokenize, choose the draft vocab."""
    from eaglewire.data.batching import DEFAULT_MAX_BATCH_TOKENS
    from eaglewire.data.build import build_dataset, save_dataset
    from eaglewire.data.capture import capture_dataset
    from eaglewire.data.formats import read_conversations
    from eaglewire.data.generation import SamplingConfig, pick_generate_fn
    from eaglewire.data.regenerate import regenerate
    from eaglewire.data.vocab import build_draft_vocab, save_draft_vocab

    p, max_length = run.preset.data, run.preset.train.max_length
    sampling = SamplingConfig(
        max_new_tokens=p.regen_max_new_tokens,
        temperature=p.regen_temperature,
        top_p=1.0,
        seed=0,
        batch_size=p.regen_batch_size,
    )
    splits: dict[str, DataSplitResult] = {}
    vocab_stats: dict[str, int | float | str] = {}
    names: tuple[Literal["train", "eval"], ...] = ("train", "eval")
    for split in names:
        convs = _conversations(run, split, loaded)
        regen_tps = None
        if p.regenerate:
            jsonl = run.path("data", f"{split}.jsonl")
            # Prompts longer than a training row could not be trained on whole anyway.
            max_prompt = p.regen_max_prompt_tokens or max_length - p.regen_max_new_tokens
            budget = p.regen_max_seconds if split == "train" else 0.0
            regen_tps = regenerate(
                loaded,
                convs,
                jsonl,
                sampling,
                max_prompt_tokens=max_prompt,
                max_seconds=budget,
                generate_fn=pick_generate_fn(continuous=p.regen_continuous, max_rows=p.regen_rows),
            ).tokens_per_second
            convs, _ = read_conversations(jsonl, require_assistant=True)
        if split == "train":  # long-context records (DataPlan.long_*), regenerated on their own
            from eaglewire.recipes.quickstart_long import long_training_records

            convs += long_training_records(run, loaded)
        ds, build_stats = build_dataset(convs, loaded.tokenizer, max_length=max_length, split=split)
        save_dataset(ds, run.path("data", split), force=True)  # a rerun replaces the run's own dataset
        capture = None
        if p.train_from_shards:  # resumes shard by shard, like `eaglewire data capture`
            stats = capture_dataset(
                loaded,
                ds,
                training_data_dir(run, split),
                source=f"quickstart {split}",
                max_batch_tokens=p.capture_max_batch_tokens or DEFAULT_MAX_BATCH_TOKENS,
            )
            capture = CaptureResult(
                shards=stats.shards_written + stats.shards_resumed,
                bytes=stats.written_bytes,
                tokens_per_s=stats.tokens_per_second,
            )
        splits[split] = DataSplitResult(
            conversations=len(convs),
            tokens=ds.num_tokens,
            loss_tokens=ds.num_loss_tokens,
            regenerated=p.regenerate,
            regenerate_tokens_per_s=regen_tps,
            truncated=build_stats.truncated_records,
            capture=capture,
        )
        if split == "train":
            vocab = build_draft_vocab(ds, p.draft_vocab_size, vocab_size=loaded.vocab_size)
            save_draft_vocab(vocab, run.path("data", "vocab"), force=True)
            vocab_stats = {k: v for k, v in vocab.stats.items() if isinstance(v, int | float | str)}
    return DataStageResult(splits, vocab_stats)
