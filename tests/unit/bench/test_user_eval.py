"""The held-out user-like set (bench/data/user_eval.jsonl): its shape, and that none of its text is
shared with MT-bench or with the built-in training sets it must stay apart from."""

from __future__ import annotations

import json
import re
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from eaglewire.bench.prompts import MT_BENCH_FILE, USER_EVAL_FILE, load_mt_bench, load_prompt_set
from eaglewire.errors import ConfigError, DataFormatError

CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SHINGLE_WORDS = 12


def _rows() -> list[dict[str, str]]:
    text = resources.files("eaglewire.bench").joinpath("data").joinpath(USER_EVAL_FILE).read_text("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _shingles(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9']+", text.lower())
    return {tuple(words[i : i + SHINGLE_WORDS]) for i in range(len(words) - SHINGLE_WORDS + 1)}


def _overlaps(reference_texts: list[str]) -> list[str]:
    reference: set[tuple[str, ...]] = set()
    for text in reference_texts:
        reference |= _shingles(text)
    return [row["id"] for row in _rows() if _shingles(row["prompt"]) & reference]


def test_rows_cover_eight_categories_with_unique_ids() -> None:
    rows = _rows()
    assert len(rows) >= 80
    assert all(set(r) == {"id", "category", "prompt"} for r in rows)
    ids = [r["id"] for r in rows]
    assert len(set(ids)) == len(ids)
    assert all(r["id"].startswith(f"user-eval:{r['category']}-") for r in rows)
    counts = Counter(r["category"] for r in rows)
    assert set(counts) == set(CATEGORIES)
    assert min(counts.values()) >= 9, counts
    assert len({r["prompt"] for r in rows}) == len(rows)


def test_loads_as_builtin_prompt_set_with_categories() -> None:
    ps = load_prompt_set("user-eval")
    assert ps.name == "user-eval" and len(ps.prompts) == len(_rows())
    first = ps.prompts[0]
    assert first.prompt_id == "user-eval:writing-01" and first.category == "writing"
    assert first.messages == (("user", first.text),)
    assert {p.category for p in ps.prompts} == set(CATEGORIES)
    assert len(load_prompt_set("user-eval", num_prompts=8).prompts) == 8


def test_no_twelve_word_overlap_with_mt_bench() -> None:
    turns = []
    source = resources.files("eaglewire.bench").joinpath("data").joinpath(MT_BENCH_FILE)
    for line in source.read_text("utf-8").splitlines():
        if line.strip():
            turns += json.loads(line)["turns"]  # both turns, not only the first the bench uses
    assert len(load_mt_bench().prompts) == 80
    assert _overlaps(turns) == []


@pytest.mark.parametrize("name", ["chitchat", "humaneval"])
def test_no_twelve_word_overlap_with_builtin_training_data(name: str) -> None:
    # magpie is left out: its prompts are sampled from a target at build time, not stored anywhere.
    from eaglewire.data.builtin import load_builtin

    try:
        convs = load_builtin(name, split="all")
    except ConfigError as e:  # the source package is not installed here
        pytest.skip(str(e))
    assert _overlaps([m.content for c in convs for m in c.messages]) == []


def test_bench_sets_with_their_own_ids_are_held_out_whole() -> None:
    # The data side keeps its own list (data must not import bench); this ties the two together.
    from eaglewire.data.builtin import EVAL_ONLY_ID_PREFIXES, heldout_split

    assert {
        p.prompt_id.split(":")[0] + ":"
        for s in ("mt-bench", "user-eval", "long-1k")
        for p in load_prompt_set(s).prompts
    } == set(EVAL_ONLY_ID_PREFIXES)
    assert heldout_split("user-eval:math-03") == "eval" and heldout_split("mt-bench:81") == "eval"
    from eaglewire.bench.prompts import BUILTIN_PROMPT_SETS, IN_DISTRIBUTION_PROMPT_SETS
    from eaglewire.data.builtin import EVAL_ONLY_SET_NAMES

    assert set(EVAL_ONLY_SET_NAMES) == set(BUILTIN_PROMPT_SETS) - set(IN_DISTRIBUTION_PROMPT_SETS)


def test_nothing_trains_on_user_eval(tmp_path: Path) -> None:
    """`data build` (the step every training set passes through) refuses the set by name, and refuses
    a file of answers made for its prompts (regeneration keeps the ids); --split eval still builds."""
    from typer.testing import CliRunner

    from eaglewire.cli import app
    from tests.helpers.tiny import make_tiny_target, save_tiny_target

    target_dir = save_tiny_target(make_tiny_target("llama", num_layers=2), tmp_path / "target")
    answered = tmp_path / "answered.jsonl"
    rows = [
        {
            "id": r["id"],
            "messages": [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": "ok"}],
        }
        for r in _rows()[:3]
    ]
    answered.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runner = CliRunner()

    def build(spec: str, *extra: str) -> Any:
        args = ["data", "build", "--target", str(target_dir), "--input", spec, "--no-progress", *extra]
        return runner.invoke(app, [*args, "--out", str(tmp_path / f"ds{len(extra)}")])

    # run_app turns these EaglewireErrors into exit 2; the runner hands back the exception itself.
    for name in ("user-eval", "long-4k"):
        by_name = build(name).exception
        assert isinstance(by_name, ConfigError) and "evaluation only" in str(by_name), name
    as_file = build(str(answered)).exception
    assert isinstance(as_file, DataFormatError) and "held-out evaluation split" in str(as_file)
    as_eval = build(str(answered), "--split", "eval")
    assert as_eval.exit_code == 0, as_eval.output


def test_the_first_prompts_cover_every_category() -> None:
    """A run on the first N prompts (the cpu preset's 3) spans as many kinds of request as it can."""
    whole = load_prompt_set("user-eval").prompts
    first = load_prompt_set("user-eval", 8).prompts
    assert len({p.category for p in first}) == 8
    assert sorted(p.prompt_id for p in whole) == sorted(row["id"] for row in _rows())
