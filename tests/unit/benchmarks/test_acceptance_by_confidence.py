"""benchmarks/acceptance_by_confidence.py --magpie: fresh Magpie prompts the target samples are
answered and scored like any prompt set, and the same seed samples the same prompts again."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from eaglewire.draft.init import init_draft
from eaglewire.draft.io import save_draft
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import load_target
from tests.helpers.tiny import make_tiny_target, save_tiny_target

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "acceptance_by_confidence.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("acceptance_by_confidence", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _tiny_target_and_draft(tmp_path: Path) -> tuple[Path, Path]:
    """A saved tiny target and an untrained draft for it: what the script loads from disk."""
    target = make_tiny_target("llama", num_layers=4)
    contract = build_contract(target, (1, 2, 3))
    target_dir = save_tiny_target(target, tmp_path / "target")
    return target_dir, save_draft(init_draft(target, contract), contract, tmp_path / "draft")


def test_fresh_magpie_prompts_are_scored_and_seeded(tmp_path: Path) -> None:
    script = load_script()
    target_dir, draft_dir = _tiny_target_and_draft(tmp_path)
    out = tmp_path / "conf.json"
    argv = ["--target", str(target_dir), "--draft", str(draft_dir), "--prompts", "", "--magpie", "3",
            "--magpie-seed", "5", "--max-new-tokens", "6", "--out", str(out)]  # fmt: skip
    assert script.main(argv) == 0
    sets = json.loads(out.read_text())["sets"]
    assert list(sets) == ["magpie-fresh"]  # --prompts "" leaves the built-in sets out
    fresh = sets["magpie-fresh"]
    assert fresh["prompts"] == 3 and fresh["positions"] > 0
    assert sum(b["positions"] for b in fresh["buckets"]) == fresh["positions"]
    spans = fresh["by_answer_position"]  # 6 new tokens: every scored label is among the first 16
    assert spans[0]["share"] == 1.0 and spans[0]["step0_accuracy"] == fresh["step0_accuracy"]
    loaded = load_target(str(target_dir), dtype="float32", device="cpu")
    first, again, other = (script.fresh_magpie_prompts(loaded, 3, seed, 0.5) for seed in (5, 5, 6))
    assert first == again and first != other  # the seed decides the prompts
    assert all(p.prompt_id.startswith("magpie:") and p.category == "magpie" for p in first)


def test_misses_are_split_by_where_in_the_answer_they_fall() -> None:
    script = load_script()
    part = {  # labels at answer tokens 1, 2, 20 and 60; the draft hits the first and the last
        "p1": torch.tensor([0.95, 0.4, 0.95, 0.99]),
        "margin": torch.tensor([0.9, 0.05, 0.9, 0.98]),
        "hit": torch.tensor([True, False, False, True]),
        "in_draft_vocab": torch.tensor([True, True, True, True]),
        "answer_pos": torch.tensor([1, 2, 20, 60]),
    }
    spans = script.summarise([part])["by_answer_position"]
    assert [(b["answer_from"], b["answer_to"]) for b in spans] == list(script.ANSWER_SPANS)
    assert [b["share"] for b in spans] == [0.5, 0.25, 0.25]
    assert [b["step0_accuracy"] for b in spans] == [0.5, 0.0, 1.0]
    # the miss at token 2 is not a sure one (p1 0.4)
    assert [b["sure_accuracy"] for b in spans] == [1.0, 0.0, 1.0]


def _magpie_file(path: Path, per_split: int) -> Path:
    """A Magpie prompt file as the quickstart writes it, with `per_split` prompts in each split."""
    from eaglewire.data.builtin import heldout_split

    rows: list[dict[str, object]] = []
    counts = {"train": 0, "eval": 0}
    i = 0
    while min(counts.values()) < per_split:
        rid = f"magpie:{i:016x}"
        split = heldout_split(rid)
        assert split is not None
        if counts[split] < per_split:
            counts[split] += 1
            rows.append({"id": rid, "messages": [{"role": "user", "content": f"Write note {i} ({split})."}]})
        i += 1
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_magpie_file_is_split_into_trained_and_heldout_sets(tmp_path: Path) -> None:
    script = load_script()
    from eaglewire.errors import ConfigError, DataFormatError

    prompts = _magpie_file(tmp_path / "magpie_prompts.jsonl", per_split=3)
    sets = script.magpie_file_sets(prompts, 2)
    assert list(sets) == ["magpie-trained", "magpie-heldout"]
    assert [len(v) for v in sets.values()] == [2, 2]
    assert all("(train)" in p.messages[0][1] for p in sets["magpie-trained"])
    assert all("(eval)" in p.messages[0][1] for p in sets["magpie-heldout"])
    with pytest.raises(DataFormatError, match=r"magpie_prompts.jsonl.*'train': 3") as short:
        script.magpie_file_sets(prompts, 4)
    assert "--magpie-file-prompts" in str(short.value)
    other = tmp_path / "other.jsonl"
    row = {"id": "mine:1", "messages": [{"role": "user", "content": "hello there"}]}
    other.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataFormatError, match=r"other.jsonl: prompt id 'mine:1'"):
        script.magpie_file_sets(other, 1)
    with pytest.raises(ConfigError, match="--magpie-file-prompts: expected at least 1"):
        script.magpie_file_sets(prompts, 0)


def test_magpie_file_sets_are_scored(tmp_path: Path) -> None:
    script = load_script()
    target_dir, draft_dir = _tiny_target_and_draft(tmp_path)
    prompts = _magpie_file(tmp_path / "magpie_prompts.jsonl", per_split=2)
    out = tmp_path / "conf.json"
    argv = ["--target", str(target_dir), "--draft", str(draft_dir), "--prompts", "", "--magpie-file",
            str(prompts), "--magpie-file-prompts", "2", "--max-new-tokens", "6", "--out", str(out)]  # fmt: skip
    assert script.main(argv) == 0
    sets = json.loads(out.read_text())["sets"]
    assert list(sets) == ["magpie-trained", "magpie-heldout"]
    assert all(s["prompts"] == 2 and s["positions"] > 0 for s in sets.values())
