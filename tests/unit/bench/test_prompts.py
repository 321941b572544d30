from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglewire.bench.prompts import (
    BUILTIN_PROMPT_SETS,
    encode_prompt,
    load_mt_bench,
    load_prompt_set,
    read_prompt_file,
)
from eaglewire.errors import ConfigError, DataFormatError

SHARED_MT_BENCH = Path(__file__).resolve().parents[3].parent / "shared" / "bench" / "mt_bench_questions.jsonl"


def test_mt_bench_has_80_first_turns() -> None:
    ps = load_mt_bench()
    assert len(ps.prompts) == 80
    first = ps.prompts[0]
    assert first.prompt_id == "mt-bench:81" and first.category == "writing"
    assert first.messages == (("user", first.text),)
    assert first.text.startswith("Compose an engaging travel blog post")
    assert len({p.prompt_id for p in ps.prompts}) == 80
    assert {p.category for p in ps.prompts} >= {"writing", "coding", "math"}
    if SHARED_MT_BENCH.exists():  # the packaged copy is the shared file (../shared/bench), first turns only
        raw = [json.loads(line) for line in SHARED_MT_BENCH.read_text().splitlines() if line.strip()]
        assert [p.text for p in ps.prompts] == [r["turns"][0] for r in raw]


def test_builtin_names_resolve_to_heldout_sets() -> None:
    assert set(BUILTIN_PROMPT_SETS) == {
        "chitchat-eval", "humaneval-eval", "mt-bench", "user-eval", "long-1k", "long-2k", "long-4k", "long-8k"
    }  # fmt: skip
    he = load_prompt_set("humaneval-eval")
    assert len(he.prompts) == 33  # HumanEval/0, /5, ..., /160: the documented held-out split
    assert all(int(p.prompt_id.rsplit("/", 1)[1]) % 5 == 0 for p in he.prompts)
    assert all(p.messages[-1][0] == "user" for p in he.prompts)
    assert len(load_prompt_set("mt-bench", num_prompts=3).prompts) == 3


def test_jsonl_shapes(tmp_path: Path) -> None:
    rows = [
        {"prompt": "plain prompt", "system": "be brief"},
        {"id": "m1", "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "first"},
                                  {"role": "assistant", "content": "answer"}, {"role": "user", "content": "second"}]},
        {"conversations": [{"from": "human", "value": "sharegpt turn"}, {"from": "gpt", "value": "x"}]},
        {"question_id": 7, "category": "math", "turns": ["turn one", "turn two"]},
    ]  # fmt: skip
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    ps = read_prompt_file(path)
    assert [p.messages for p in ps.prompts] == [
        (("system", "be brief"), ("user", "plain prompt")),
        (("system", "sys"), ("user", "first")),
        (("user", "sharegpt turn"),),
        (("user", "turn one"),),
    ]
    assert [p.prompt_id for p in ps.prompts] == ["p.jsonl:1", "m1", "p.jsonl:3", "mt-bench:7"]


def test_bad_input_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{not json\n')
    with pytest.raises(DataFormatError, match=r"bad.jsonl:2: invalid JSON"):
        read_prompt_file(path)
    path.write_text('{"messages": [{"role": "assistant", "content": "no user"}]}\n')
    with pytest.raises(DataFormatError, match=r"bad.jsonl:1: no user message"):
        read_prompt_file(path)
    with pytest.raises(ConfigError, match="not a built-in name"):
        load_prompt_set(tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match="num_prompts"):
        load_prompt_set("mt-bench", num_prompts=-1)


def test_encode_applies_chat_template(tiny_target) -> None:  # type: ignore[no-untyped-def]
    ps = load_mt_bench()
    tok = tiny_target.tokenizer
    ids = encode_prompt(tok, ps.prompts[0])
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n")
    assert encode_prompt(tok, ps.prompts[0], chat=False) == tok(ps.prompts[0].text)["input_ids"]
