"""Build a tokenized dataset: conversations -> chat-template tokens + assistant loss masks.

Reads conversations from JSONL files or built-in sets (`builtin:NAME`), renders each with
the chat template, masks assistant tokens by character offsets (chat_masks.py), truncates to
`max_length` (counted), and saves a `TokenizedDataset` whose index records every count and
the tokenizer's identity. A training set (`split='train'`) that contains a held-out id of a
built-in set is refused.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from tqdm import tqdm

from eaglewire.data.builtin import (
    EVAL_ONLY_SET_NAMES,
    LONG_SETS,
    builtin_name,
    heldout_ids,
    heldout_split,
    joined_source_ids,
    load_builtin,
)
from eaglewire.data.chat_masks import Tokenized, resolve_chat_template, tokenize_conversations
from eaglewire.data.formats import Conversation, ReadStats, filter_conversations, read_conversations
from eaglewire.data.records import INDEX_FILE, TOKENS_FILE, TokenizedDataset
from eaglewire.data.types import TokenizedRecord
from eaglewire.errors import ConfigError, DataFormatError
from eaglewire.io_utils import sha256_text
from eaglewire.output_marker import OutputKind, write_marker
from eaglewire.outputs import fresh_output
from eaglewire.target.identity import tokenizer_hash

log = logging.getLogger(__name__)

# Conversations rendered per tokenizer call: the fast tokenizer encodes a batch on all cores.
TOKENIZE_BATCH = 512
# What a dataset directory holds (its marker lists their sizes and sha256); `eaglewire data vocab`
# may add draft_vocab.* beside them.
DATASET_FILES = (TOKENS_FILE, INDEX_FILE)


@dataclass
class BuildStats:
    conversations_in: int = 0
    records: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    truncated_records: int = 0
    truncated_tokens: int = 0
    skipped_no_loss_tokens: int = 0  # every assistant token fell past max_length
    skipped_template_error: int = 0


def _add_record(
    records: list[TokenizedRecord],
    stats: BuildStats,
    conv: Conversation,
    tok: Tokenized | DataFormatError,
    *,
    skip_bad: bool,
) -> None:
    """Count one conversation's outcome; keep its record when it has assistant tokens."""
    if isinstance(tok, DataFormatError):
        if not skip_bad:
            raise tok
        stats.skipped_template_error += 1
        return
    if not bool(tok.loss_mask.any()):
        stats.skipped_no_loss_tokens += 1
        return
    if tok.truncated_tokens:
        stats.truncated_records += 1
        stats.truncated_tokens += tok.truncated_tokens
    records.append(TokenizedRecord(conv.record_id, tok.input_ids, tok.loss_mask))
    stats.tokens += int(tok.input_ids.numel())
    stats.loss_tokens += int(tok.loss_mask.sum())


def load_source(
    spec: str,
    *,
    split: Literal["train", "eval", "all"] = "train",
    require_assistant: bool,
    skip_bad: bool = False,
    limit: int | None = None,
    target: Any = None,
    magpie_kwargs: dict[str, Any] | None = None,
) -> tuple[list[Conversation], ReadStats]:
    """`builtin:NAME` (that set's `split`) or a JSONL path, with the empty/assistant-less filters applied."""
    name = builtin_name(spec)
    if name is not None:
        if name in LONG_SETS:  # made from the other built-in sets, so loaded one level above them
            from eaglewire.data.long_training import load_long_set

            convs = load_long_set(name, split)
        else:
            convs = load_builtin(name, split, target=target, **(magpie_kwargs or {}))
        convs, stats = filter_conversations(convs, require_assistant=require_assistant)
        if limit is not None:
            convs = convs[:limit]
            stats.records = len(convs)
        return convs, stats
    if spec in EVAL_ONLY_SET_NAMES and not Path(spec).exists():
        raise ConfigError(
            f"{spec!r} is a benchmark prompt set (eaglewire bench --prompts): evaluation only, never trained on",
            fix="pass training conversations: a JSONL file, builtin:chitchat, builtin:humaneval, builtin:magpie, builtin:long-chat or builtin:long-docs",
        )
    return read_conversations(Path(spec), require_assistant=require_assistant, skip_bad=skip_bad, limit=limit)


def check_heldout(record_ids: list[str], split: str, *, where: str) -> None:
    """A training set must hold no id of a built-in set's held-out split."""
    if split != "train":
        return
    bad = heldout_ids(record_ids)
    if bad:
        # a joined conversation (long-chat) is held out through its sources: name the first held-out one
        source = next((s for s in joined_source_ids(bad[0]) if heldout_split(s) == "eval"), None)
        why = f", made from held-out {source!r}" if source else ""
        raise DataFormatError(
            f"{where}: {len(bad)} conversations belong to a built-in set's held-out evaluation split "
            f"(e.g. {bad[0]!r}{why}); they must never be trained on",
            fix="regenerate from the 'train' split (the default), or build this file with --split eval",
        )


def build_dataset(
    conversations: list[Conversation],
    tokenizer: Any,
    *,
    chat_template: str | None = None,
    max_length: int | None = 2048,
    split: Literal["train", "eval", "all"] = "train",
    skip_bad: bool = False,
    read_stats: ReadStats | None = None,
    source: str = "",
    show_progress: bool = True,
) -> tuple[TokenizedDataset, BuildStats]:
    """Tokenize and mask every conversation; returns the dataset (not yet saved) and its counts."""
    if max_length is not None and max_length < 2:
        raise ConfigError(f"max_length: expected >= 2 tokens, got {max_length}")
    check_heldout([c.record_id for c in conversations], split, where=source or "input")
    template = resolve_chat_template(tokenizer, chat_template)
    stats = BuildStats(conversations_in=len(conversations))
    records: list[TokenizedRecord] = []
    with tqdm(total=len(conversations), desc="tokenize", unit="conv", disable=not show_progress) as bar:
        for lo in range(0, len(conversations), TOKENIZE_BATCH):
            chunk = conversations[lo : lo + TOKENIZE_BATCH]
            results = tokenize_conversations(tokenizer, chunk, template, max_length=max_length)
            for conv, tok in zip(chunk, results, strict=True):
                _add_record(records, stats, conv, tok, skip_bad=skip_bad)
            bar.update(len(chunk))
    stats.records = len(records)
    if not records:
        raise DataFormatError(f"{source or 'input'}: no conversation produced a record with assistant tokens")
    special = sorted({int(i) for i in getattr(tokenizer, "all_special_ids", [])})
    meta = {
        "split": split,
        "source": source,
        "max_length": max_length,
        "tokenizer": str(getattr(tokenizer, "name_or_path", "")),
        "tokenizer_hash": tokenizer_hash(tokenizer),
        "chat_template_hash": sha256_text(template),
        "tokenizer_vocab_size": len(tokenizer),
        "special_ids": special,
        "read_stats": read_stats.to_json() if read_stats is not None else None,
        "build_stats": asdict(stats),
    }
    log.info(
        "built %d records (%d tokens, %d loss tokens); %d truncated at max_length=%s (%d tokens cut); "
        "%d skipped with no assistant token left",
        stats.records,
        stats.tokens,
        stats.loss_tokens,
        stats.truncated_records,
        max_length,
        stats.truncated_tokens,
        stats.skipped_no_loss_tokens,
    )
    return TokenizedDataset.from_records(records, meta), stats


def save_dataset(
    dataset: TokenizedDataset, directory: Path, *, force: bool = False, flag: str = "--out"
) -> Path:
    """Write `dataset` to `directory` whole: missing, empty, or (with `force`) an earlier dataset,
    replaced with everything in it (a vocabulary beside it too: it was counted from the old data).
    Built in a sibling temporary directory and renamed into place (`outputs.fresh_output`)."""
    directory = Path(directory)
    with fresh_output(directory, OutputKind.DATASET, force=force, flag=flag) as tmp:
        dataset.save(tmp)
        write_marker(tmp, OutputKind.DATASET, DATASET_FILES)
    return directory
