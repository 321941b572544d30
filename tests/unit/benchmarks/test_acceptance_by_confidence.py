"""benchmarks/acceptance_by_confidence.py --magpie and --magpie-file: fresh Magpie prompts the target
samples, and a quickstart's Magpie file split into trained and held-out prompts, are answered and scored
like any prompt set; the same seed samples the same prompts again. One end-to-end run (`scored`) serves
the assertions about the scored sets."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from eaglewire.draft.init import init_draft
from eaglewire.draft.io import save_draft
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import load_target
from tests.helpers.tiny import make_tiny_target, save_tiny_target

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "acceptance_by_confidence.py"


@pytest.fixture(scope="module")
def script() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("acceptance_by_confidence", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


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


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_target(
        make_tiny_target("llama", num_layers=4), tmp_path_factory.mktemp("conf") / "target"
    )


@pytest.fixture(scope="module")
def scored(script: ModuleType, target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The script's sets for 3 fresh Magpie prompts (seed 5) and a Magpie file of 2 + 2, with an untrained
    draft, 6 new tokens each."""
    root = tmp_path_factory.mktemp("conf_run")
    target = load_target(str(target_dir), dtype="float32", device="cpu")
    contract = build_contract(target, (1, 2, 3))
    draft_dir = save_draft(init_draft(target, contract), contract, root / "draft")
    prompts = _magpie_file(root / "magpie_prompts.jsonl", per_split=2)
    out = root / "conf.json"
    argv = ["--target", str(target_dir), "--draft", str(draft_dir), "--prompts", "", "--magpie", "3",
            "--magpie-seed", "5", "--magpie-file", str(prompts), "--magpie-file-prompts", "2",
            "--max-new-tokens", "6", "--out", str(out)]  # fmt: skip
    assert script.main(argv) == 0
    return json.loads(out.read_text())["sets"]


def test_fresh_magpie_prompts_are_scored(scored: dict[str, Any]) -> None:
    # --prompts "" leaves the built-in sets out
    assert list(scored) == ["magpie-fresh", "magpie-trained", "magpie-heldout"]
    fresh = scored["magpie-fresh"]
    assert fresh["prompts"] == 3 and fresh["positions"] > 0
    assert sum(b["positions"] for b in fresh["buckets"]) == fresh["positions"]
    spans = fresh["by_answer_position"]  # 6 new tokens: every scored label is among the first 16
    assert spans[0]["share"] == 1.0 and spans[0]["step0_accuracy"] == fresh["step0_accuracy"]


def test_the_seed_decides_the_fresh_prompts(script: ModuleType, target_dir: Path) -> None:
    loaded = load_target(str(target_dir), dtype="float32", device="cpu")
    first, again, other = (script.fresh_magpie_prompts(loaded, 3, seed, 0.5) for seed in (5, 5, 6))
    assert first == again and first != other
    assert all(p.prompt_id.startswith("magpie:") and p.category == "magpie" for p in first)


def test_magpie_file_sets_are_scored(scored: dict[str, Any]) -> None:
    assert all(scored[name]["prompts"] == 2 and scored[name]["positions"] > 0
               for name in ("magpie-trained", "magpie-heldout"))  # fmt: skip


def test_misses_are_split_by_where_in_the_answer_they_fall(script: ModuleType) -> None:
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


def test_magpie_file_is_split_into_trained_and_heldout_sets(script: ModuleType, tmp_path: Path) -> None:
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
