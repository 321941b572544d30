"""Long training records (long-chat, long-docs): deterministic, train material only, ids that the
held-out rule resolves, every assistant turn of a joined conversation trained."""

from __future__ import annotations

import pytest

from eaglewire.data.build import check_heldout
from eaglewire.data.builtin import heldout_split, joined_source_ids
from eaglewire.data.long_training import (
    CODE_BLOCK,
    DOCUMENT,
    MIN_DOC_FILE_CHARS,
    complete_functions,
    cut_at_line,
    joined_record_id,
    load_long_set,
    long_chat,
    long_docs,
)
from eaglewire.errors import ConfigError, DataFormatError

# Pinned: the first chitchat conversations of each split (file order); splits are functions of ids.
TRAIN_SOURCE = "chitchat:a07edb12-6b91-4138-b11e-02421888d699"
EVAL_SOURCE = "chitchat:cdf96a2c-1ba5-4375-a65e-917b151ce04e"


def test_joined_ids_resolve_to_the_split_of_every_source() -> None:
    assert heldout_split(TRAIN_SOURCE) == "train" and heldout_split(EVAL_SOURCE) == "eval"
    train_only = joined_record_id([TRAIN_SOURCE, TRAIN_SOURCE.replace("a07", "a08")])
    assert train_only.startswith("chitchat-joined:a07edb12-")
    assert joined_source_ids(train_only)[0] == TRAIN_SOURCE
    assert heldout_split(train_only) == "train"
    with_eval = joined_record_id([TRAIN_SOURCE, EVAL_SOURCE])
    assert heldout_split(with_eval) == "eval"
    assert heldout_split("chitchat-joined:") == "eval"  # names no source: never trained on
    with pytest.raises(DataFormatError, match=r"made from held-out 'chitchat:cdf96a2c"):
        check_heldout([train_only, with_eval], "train", where="x.jsonl")
    check_heldout([train_only], "train", where="x.jsonl")
    for bad in ([], ["humaneval:HumanEval/1"], ["chitchat:a+b"]):
        with pytest.raises(ConfigError, match="joined conversation"):
            joined_record_id(bad)


def test_long_chat_is_deterministic_whole_and_train_only() -> None:
    from eaglewire.bench.long_prompts import _dialogue_slots

    chats = load_long_set("long-chat", "train")
    assert chats == long_chat("train")  # deterministic
    assert len(chats) > 400 and len({c.record_id for c in chats}) == len(chats)
    sources = [s for c in chats for s in joined_source_ids(c.record_id)]
    assert len(set(sources)) == len(sources)  # each chitchat conversation in one record
    assert all(heldout_split(c.record_id) == "train" for c in chats)
    # disjoint from the long-1k..8k sets' conversations (held-out chitchat)
    bench_sources = {d.record_id for slot in _dialogue_slots() for d in slot}
    assert bench_sources and bench_sources.isdisjoint(sources)
    first = chats[0]
    roles = [m.role for m in first.messages]
    assert roles[0] == "user" and roles[-1] == "assistant" and roles.count("user") > 20  # every turn kept
    assert all(heldout_split(c.record_id) == "eval" for c in long_chat("eval"))


def test_long_docs_are_deterministic_train_files_with_varied_prompts() -> None:
    from eaglewire.bench.long_prompts import code_files

    docs = long_docs("train", limit=40)
    assert docs == long_docs("train", limit=40)
    ids = [d.record_id for d in docs]
    assert all(i.startswith("pysource:transformers/") and heldout_split(i) == "train" for i in ids)
    assert set(ids).isdisjoint(f.record_id for f in code_files())
    assert all(len(d.messages) == 1 and d.messages[0].role == "user" for d in docs)  # the target answers
    prompts = [d.messages[0].content for d in docs]
    code_start, doc_start = CODE_BLOCK.split("{")[0], DOCUMENT.split("(")[0]
    assert any(p.startswith(code_start) for p in prompts) and any(p.startswith(doc_start) for p in prompts)
    assert len({p.rsplit("\n", 1)[-1][:30] for p in prompts}) >= 5  # several instructions
    lengths = [len(p) for p in prompts]
    assert max(lengths) <= 24_000 + 2_000 and min(lengths) < 12_000  # cut to varied lengths
    assert all(len(p) >= MIN_DOC_FILE_CHARS * 0.25 for p in prompts)
    short = long_docs("train", max_chars=4_000, limit=5)
    assert [d.record_id for d in short] == ids[:5] and all(len(d.messages[0].content) < 6_000 for d in short)


def test_cut_and_function_names() -> None:
    assert cut_at_line("a\nbb\nccc\n", 6) == "a\nbb\n" and cut_at_line("abc", 10) == "abc"
    code = "def f(x):\n    return x\n\nclass A:\n    def g(self):\n        pass\n    def _h(self):\n        pass\ndef last("
    assert complete_functions(code) == ["f", "A.g"]


def test_every_assistant_turn_of_a_joined_conversation_is_trained() -> None:
    from dataclasses import replace

    from eaglewire.data.chat_masks import resolve_chat_template, tokenize_conversation
    from tests.helpers.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    joined = long_chat("train")[0]
    conv = replace(joined, messages=joined.messages[:40])
    assert conv.messages[-1].role == "assistant" and conv.user_turns >= 15
    result = tokenize_conversation(tok, conv, resolve_chat_template(tok))
    trained = tok.decode(result.input_ids[result.loss_mask].tolist())
    answers = [m.content for m in conv.messages if m.role == "assistant"]
    assert trained == "".join(f"{a}<|im_end|>" for a in answers)
