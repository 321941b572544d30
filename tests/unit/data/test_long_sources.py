"""Long-context material: joined chitchat conversations and transformers source files, by split."""

from __future__ import annotations

import logging

import pytest

from eaglewire.data import long_sources
from eaglewire.data.builtin import heldout_split, pysource_unit
from eaglewire.data.long_sources import (
    NEW_TOPIC,
    PYSOURCE_VERSION,
    chitchat_dialogues,
    docstring_sections,
    joined_conversations,
    model_units,
    pysource_files,
    pysource_root,
    strip_header,
)
from eaglewire.errors import ConfigError

# Pinned: a file's split is a function of its id alone (its model directory's bucket).
EVAL_FILE = "pysource:transformers/models/bamba/modeling_bamba.py"
TRAIN_FILE = "pysource:transformers/models/llama/modeling_llama.py"


def test_pysource_split_by_model_directory_pinned() -> None:
    assert pysource_unit(EVAL_FILE) == "pysource:transformers/models/bamba"
    assert pysource_unit("pysource:transformers/training_args.py") == "pysource:transformers/training_args.py"
    assert heldout_split(EVAL_FILE) == "eval" == heldout_split(EVAL_FILE.replace("modeling", "configuration"))
    assert heldout_split(TRAIN_FILE) == "train"
    assert heldout_split("pysource:transformers/models/esm/openfold_utils/loss.py") == "train"  # unit: esm


def test_pysource_files_partition_the_package() -> None:
    train, evals, every = pysource_files("train"), pysource_files("eval"), pysource_files("all")
    assert {f.record_id for f in train}.isdisjoint(f.record_id for f in evals)
    assert sorted(train + evals, key=lambda f: f.record_id) == every
    assert all(heldout_split(f.record_id) == "eval" for f in evals)
    assert {EVAL_FILE} <= {f.record_id for f in evals} and TRAIN_FILE in {f.record_id for f in train}
    assert not any(f.path.name == "__init__.py" or f.path.name.startswith("modular_") for f in every)
    assert 0.05 < len(evals) / len(every) < 0.15  # about 10% of the files, by model directory
    # a model directory's files are all in its split
    units = {pysource_unit(f.record_id) for f in evals if "/models/" in f.record_id}
    assert units <= {f"pysource:{u}" for u in model_units("eval")}
    assert units.isdisjoint(pysource_unit(f.record_id) for f in train)
    assert set(model_units("eval")).isdisjoint(model_units("train"))


def test_pysource_is_deterministic_and_reads_without_importing() -> None:
    first = pysource_files("eval", "modeling_")
    long_sources._all_pysource_files.cache_clear()
    assert pysource_files("eval", "modeling_") == first
    source = next(f for f in first if f.record_id == EVAL_FILE)
    text = source.text()
    assert not text.startswith("#") and "class BambaModel" in text
    sections = docstring_sections(source)
    assert sections and all(s.source_id == EVAL_FILE and len(s.text) >= 300 for s in sections)


def test_strip_header() -> None:
    assert strip_header("# Copyright\n#\n\n# License\n'''doc'''\nx = 1\n") == "'''doc'''\nx = 1\n"
    assert strip_header("") == ""


def test_other_version_warns_once(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(long_sources.importlib.metadata, "version", lambda name: "0.0.1")
    pysource_root.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="eaglewire.data.long_sources"):
            pysource_root()
            pysource_root()
    finally:
        pysource_root.cache_clear()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "transformers 0.0.1 is installed" in warnings[0] and PYSOURCE_VERSION in warnings[0]


def test_joined_conversations_alternate_and_keep_their_split() -> None:
    evals = joined_conversations("eval", 20_000)
    train = joined_conversations("train", 20_000)
    assert joined_conversations("eval", 20_000) == evals  # deterministic
    eval_ids = {i for j in evals for i in j.source_ids}
    train_ids = {i for j in train for i in j.source_ids}
    assert eval_ids.isdisjoint(train_ids) and eval_ids and train_ids
    assert all(heldout_split(i) == "eval" for i in eval_ids)
    assert all(heldout_split(i) == "train" for i in train_ids)
    for joined in (evals[0], train[0]):
        roles = [m.role for m in joined.messages]
        assert roles[0] == "user" and roles[-1] == "assistant"
        assert all(a != b for a, b in zip(roles, roles[1:], strict=False))
        assert joined.chars >= 20_000
        openings = [m for m in joined.messages if m.content.startswith(f"{NEW_TOPIC} ")]
        assert len(openings) == len(joined.source_ids) - 1
    # the first joined conversation is the first dialogues, in file order
    dialogues = chitchat_dialogues("eval")
    assert evals[0].source_ids == tuple(d.record_id for d in dialogues[: len(evals[0].source_ids)])
    with pytest.raises(ConfigError, match="min_chars: expected >= 1, got 0"):
        joined_conversations("eval", 0)
