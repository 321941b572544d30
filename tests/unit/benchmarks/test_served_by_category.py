"""benchmarks/served_by_category.py on a tiny bench of MT-bench rows, with a draft trained on the
target's greedy text so that its chain is accepted: one line per category and one for the whole set,
whose chain tau is the bench's own served-text prediction (same text, float32), and whose rounds
are the categories' rounds added up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks.served_by_category import main
from typer.testing import CliRunner

from eaglewire.cli import app
from eaglewire.draft.init import init_draft
from eaglewire.draft.io import save_draft
from eaglewire.target.identity import build_contract
from tests.helpers.tiny import CORPUS, make_tiny_target, save_tiny_target
from tests.unit.engine.conftest import (
    AUX_BOUNDARIES,
    NUM_LAYERS,
    REFERENCE_TOKENS,
    Tiny,
    chat_ids,
    plain_greedy,
    train_draft,
)

CATEGORIES = ("writing", "math", "writing")


def test_categories_add_up_to_the_served_prediction_of_the_whole_set(tmp_path: Path) -> None:
    target = make_tiny_target("llama", num_layers=NUM_LAYERS)
    contract = build_contract(target, AUX_BOUNDARIES)
    texts = CORPUS[: len(CATEGORIES)]
    prompt_ids = [chat_ids(target, t) for t in texts]
    references = [plain_greedy(target.model, p, REFERENCE_TOKENS) for p in prompt_ids]
    draft = train_draft(Tiny(target, contract, init_draft(target, contract), prompt_ids, references))
    target_dir = save_tiny_target(target, tmp_path / "target")
    draft_dir = save_draft(draft, contract, tmp_path / "draft")
    prompts = tmp_path / "mt.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [t]}) + "\n"
                               for i, (c, t) in enumerate(zip(CATEGORIES, texts, strict=True))))  # fmt: skip
    r = CliRunner().invoke(app, [
        "bench", "--target", str(target_dir), "--draft", str(draft_dir), "--prompts", str(prompts),
        "--max-new-tokens", "12", "--methods", "plain,eagle-chain", "--chain-steps", "2", "--warmup", "0",
        "--repeats", "1", "--device", "cpu", "--no-plots", "--out", str(tmp_path / "bench"),
    ])  # fmt: skip
    assert r.exit_code == 0, r.output
    bench = json.loads((tmp_path / "bench" / "bench.json").read_text())
    out = tmp_path / "by_category.json"
    args = ["--target", str(target_dir), "--draft", str(draft_dir), "--bench", str(tmp_path / "bench" / "bench.json"),
            "--chain", "2"]  # fmt: skip
    assert main([*args, "--out", str(out)]) == 0
    rows = {row["category"]: row for row in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["math", "writing", "(whole set)"]
    assert [rows[c]["prompts"] for c in rows] == [1, 2, 3]
    assert rows["math"]["rounds"] + rows["writing"]["rounds"] == rows["(whole set)"]["rounds"]
    chain = next(p for p in bench["served_predictions"] if p["method"] == "eagle-chain")
    assert rows["(whole set)"]["tau_chain"] > 1.5  # the chain was accepted: the replay has something to split
    assert rows["(whole set)"]["tau_chain"] == pytest.approx(chain["served_predicted_tau"], rel=1e-9)
    # this draft predicts the whole vocabulary: no label is outside it, so a larger one adds nothing
    assert rows["(whole set)"]["out_of_vocab_share"] == [0.0, 0.0]
    assert rows["(whole set)"]["tau_chain_full_vocab"] == rows["(whole set)"]["tau_chain"]
    # replayed on the device and dtype that served it, the text is the replay target's own greedy text
    assert [rows[c]["served_token_differs_share"] for c in rows] == [0.0, 0.0, 0.0]
    # the draft under bf16 autocast (as the H200's replay runs it): the same split, a nearby tau
    out_bf16 = tmp_path / "by_category_bf16.json"
    assert main([*args, "--precision", "bf16", "--out", str(out_bf16)]) == 0
    saved = json.loads(out_bf16.read_text())
    assert saved["precision"] == "bf16"
    bf16 = {row["category"]: row for row in saved["rows"]}
    assert list(bf16) == list(rows)
    assert bf16["(whole set)"]["tau_chain"] == pytest.approx(rows["(whole set)"]["tau_chain"], rel=0.2)
