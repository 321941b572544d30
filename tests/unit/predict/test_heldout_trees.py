"""The held-out prediction of a dynamic tree (`predict.heldout_trees`): on held-out records whose first
answers are the target's greedy continuation (float32, CPU), it equals the engine's measured rounds
exactly, through `eaglewire bench`'s path (`evaluate_predictor` -> `run_benchmark`'s prediction
check) and `eaglewire eval --tree NUM_STEPS,TOPK,NUM_DRAFT_TOKENS`, where the static tree of
`tree_for_spec` does not; every row says which method made its number; answers it cannot replay
are skipped and counted.

The engine tests' recipe: a tiny random Llama target, a draft trained on its greedy text after the
prompts (so rounds accept several drafts), three prompts. Each held-out answer holds more greedy
tokens than the horizon, so the text knows the drafts a last round verifies past it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from eaglewire.bench.harness import BenchConfig, run_benchmark
from eaglewire.bench.prompts import PromptSet
from eaglewire.bench.report import BenchReport
from eaglewire.cli import app
from eaglewire.contract.contract import Contract
from eaglewire.data.records import TokenizedDataset
from eaglewire.data.types import TokenizedRecord
from eaglewire.draft.io import save_draft
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.errors import ConfigError
from eaglewire.predict.evaluation import FIRST_ANSWER
from eaglewire.predict.heldout_trees import (
    HeldoutTreePredictor,
    answer_spans,
    collect_heldout_texts,
    evaluate_predictor,
)
from eaglewire.predict.predictor import (
    DYNAMIC_TREE_METHOD,
    prediction_markdown,
    prediction_rows,
    tree_for_spec,
)
from eaglewire.target.identity import tokenizer_hash
from eaglewire.target.loading import LoadedTarget
from tests.helpers.tiny import save_tiny_target
from tests.unit.predict.conftest import served_tiny

HORIZON = 30  # the bench's max_new_tokens, the held-out horizon
ANSWER_TOKENS = 40  # greedy tokens per held-out answer: past HORIZON + the tree's depth
TREE = SpecArgs(num_steps=3, topk=2, num_draft_tokens=6)
CHAIN = 3
SECOND_TURN = [5, 6, 7]  # not an answer (loss mask off), then a second answer that must not count


@dataclass
class Setup:
    target: LoadedTarget
    contract: Contract
    prompts: PromptSet
    root: Path
    draft_dir: Path
    turns_dir: Path  # each record: prompt, greedy first answer, a second turn with a random answer
    first_dir: Path  # each record: prompt, greedy answer (its only one)


def _dataset(target: LoadedTarget, records: list[TokenizedRecord], path: Path) -> Path:
    meta = {"split": "eval", "tokenizer_hash": tokenizer_hash(target.tokenizer)}
    TokenizedDataset.from_records(records, meta=meta).save(path)
    return path


def _record(record_id: str, parts: list[tuple[list[int], bool]]) -> TokenizedRecord:
    """A record from (token ids, is an answer) parts."""
    ids = torch.tensor([t for tokens, _ in parts for t in tokens], dtype=torch.long)  # [T]
    mask = torch.tensor([answer for tokens, answer in parts for _ in tokens], dtype=torch.bool)  # [T]
    return TokenizedRecord(record_id, ids, mask)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    tiny = served_tiny(ANSWER_TOKENS)
    target, contract, prompts, ids, greedy, draft = (
        tiny.target, tiny.contract, tiny.prompts, tiny.ids, tiny.greedy, tiny.draft
    )  # fmt: skip
    # the engine stops at eos: a greedy answer holding one would not be what the bench decodes
    assert not set(target.eos_token_ids) & {t for g in greedy for t in g}
    root = tmp_path_factory.mktemp("heldout")
    draft_dir = save_draft(draft, contract, root / "draft")
    gen = torch.Generator().manual_seed(0)
    turns = [
        _record(
            f"r{i}",
            [
                (p, False),
                (g, True),
                (SECOND_TURN, False),
                (torch.randint(3, target.vocab_size, (12,), generator=gen).tolist(), True),
            ],
        )  # fmt: skip
        for i, (p, g) in enumerate(zip(ids, greedy, strict=True))
    ]
    firsts = [
        _record(f"r{i}", [(p, False), (g, True)]) for i, (p, g) in enumerate(zip(ids, greedy, strict=True))
    ]
    return Setup(target, contract, prompts, root, draft_dir, _dataset(target, turns, root / "turns"),
                 _dataset(target, firsts, root / "first"))  # fmt: skip


Bench = tuple[BenchReport, HeldoutTreePredictor]  # the bench's report and the held-out predictor it was given


@pytest.fixture(scope="module")
def bench(setup: Setup) -> Bench:
    """`eaglewire bench --eval-data`'s path: the held-out predictor (first answers at the horizon),
    then the bench of plain, a chain and the tree on the prompts those answers follow."""
    predictor = evaluate_predictor(setup.draft_dir, setup.target, setup.turns_dir, num_steps=TREE.num_steps,
                                   horizon=HORIZON, answer=FIRST_ANSWER)  # fmt: skip
    cfg = BenchConfig(max_new_tokens=HORIZON, methods=("plain", "eagle-chain", "eagle-tree"), chain_steps=CHAIN,
                      tree_num_steps=TREE.num_steps, tree_topk=TREE.topk, tree_num_draft_tokens=TREE.num_draft_tokens,
                      warmup=0, repeats=1)  # fmt: skip
    return run_benchmark(setup.target, setup.draft_dir, setup.prompts, cfg, predictor=predictor), predictor


def test_heldout_tree_prediction_equals_the_engines_rounds(bench: Bench) -> None:
    report, predictor = bench
    tree = report.results["eagle-tree"]
    assert tree.mismatches == []  # float32: lossless, so it decoded the held-out greedy answers
    engine_rounds = [n for r in tree.runs for n in r.accepted_per_round]
    emitted = sum(e for r in tree.runs for e in r.emitted_per_round)
    replay = predictor.replay_dynamic_tree(TREE)
    assert list(replay.accepted_per_round) == engine_rounds  # round for round, the last ones whole
    assert (replay.rounds, replay.tokens) == (len(engine_rounds), emitted)
    assert max(engine_rounds) >= 2  # deep acceptances, not a trivial match
    (row,) = [r for r in report.predictions if r.setting["topk"] == TREE.topk]
    assert row.prediction_method == DYNAMIC_TREE_METHOD and row.note == ""
    assert row.predicted_tau == emitted / len(engine_rounds)
    assert row.predicted_tau == pytest.approx(tree.tau, abs=1e-12) and row.error == pytest.approx(
        0.0, abs=1e-12
    )
    # what the held-out prediction was before: the static tree approximating the dynamic one
    static = predictor.tau_tree(tree_for_spec(predictor, TREE))
    assert abs(static - row.predicted_tau) > 0.01
    assert row.position_averaged_tau is not None  # the secondary: the formula over that static tree
    # chains keep the evaluation's replay, exact on this text too
    (chain_row,) = [r for r in report.predictions if r.setting["topk"] == 1]
    assert chain_row.predicted_tau == pytest.approx(report.results["eagle-chain"].tau, abs=1e-12)
    # only first answers: the second turns' random answers are not replayed
    assert len(predictor.texts().texts) == 3 and predictor.texts().skipped == {}


def test_every_row_says_its_method(bench: Bench, tmp_path: Path) -> None:
    report, _ = bench
    methods = {r.setting["topk"]: r.prediction_method for r in report.predictions}
    assert methods == {1: "replay", TREE.topk: DYNAMIC_TREE_METHOD}
    report.write(tmp_path, plots=False)
    data = json.loads((tmp_path / "bench.json").read_text())
    assert {p["topk"]: p["prediction_method"] for p in data["predictions"]} == methods
    served = {r["method"]: r for r in data["served_predictions"]}
    assert served["eagle-tree"]["heldout_prediction_method"] == DYNAMIC_TREE_METHOD
    assert served["eagle-chain"]["heldout_prediction_method"] == "replay"
    md = prediction_markdown(report.predictions)
    assert "| method |" in md and f"| {DYNAMIC_TREE_METHOD} |" in md and "| replay |" in md


def test_eval_cli_decodes_an_engine_setting(setup: Setup, bench: Bench) -> None:
    """`eaglewire eval --tree 3,2,6` (the records' only answers are first answers): the engine's rounds
    again; `--tree 2x2` is a static tree and says so."""
    report, _ = bench
    target_dir = save_tiny_target(setup.target, setup.root / "target")
    args = ["eval", "--draft", str(setup.draft_dir), "--target", str(target_dir), "--data", str(setup.first_dir),
            "--num-steps", str(CHAIN), "--horizon", str(HORIZON), "--device", "cpu", "--json"]  # fmt: skip
    setting = ",".join(str(v) for v in (TREE.num_steps, TREE.topk, TREE.num_draft_tokens))
    res = CliRunner().invoke(app, [*args, "--tree", setting])
    assert res.exit_code == 0, (res.output, res.exception)
    ev = json.loads(res.stdout[res.stdout.index("{") :])
    assert (
        ev["tree_prediction_method"] == DYNAMIC_TREE_METHOD and ev["tree_nodes"] == TREE.num_draft_tokens - 1
    )
    assert ev["tree_setting"] == {"num_steps": 3, "topk": 2, "num_draft_tokens": 6}
    assert ev["tree_answers_replayed"] == 3 and ev["tree_answers_skipped"] == {}
    assert ev["tau_pred_tree"] == pytest.approx(report.results["eagle-tree"].tau, abs=1e-12)
    static = CliRunner().invoke(app, [*args, "--tree", "2x2"])
    assert static.exit_code == 0, (static.output, static.exception)
    assert (
        json.loads(static.stdout[static.stdout.index("{") :])["tree_prediction_method"]
        == "static_tree_replay"
    )


def test_answers_it_cannot_replay_are_skipped_and_counted(
    setup: Setup, caplog: pytest.LogCaptureFixture
) -> None:
    target, contract = setup.target, setup.contract
    limit = target.config.max_position_embeddings
    prompt = [1, 40, 41]
    records = [
        _record("two", [(prompt, False), ([50, 51, 52], True), (SECOND_TURN, False), ([60, 61], True)]),
        _record("none", [(prompt, False)]),
        _record("first", [([50, 51], True), (prompt, False), ([60, 61], True)]),
        _record("long", [([9] * (limit - 1), False), ([50] * 4, True)]),  # limit + 1 tokens kept
    ]
    assert answer_spans(records[0].loss_mask) == [(3, 6), (9, 11)]
    with caplog.at_level(logging.WARNING, logger="eaglewire.predict.heldout_trees"):
        firsts = collect_heldout_texts(records, target, contract, answer=FIRST_ANSWER, keep_tokens=2)
    assert [(t.record_id, t.prompt, t.answer) for t in firsts.texts] == [("two", tuple(prompt), (50, 51))]
    assert firsts.auxes[0].shape == (5, 3 * target.hidden_size)  # prompt + the answer's kept tokens
    assert firsts.skipped == {
        "fewer than 1 answer(s)": 1,
        "the answer starts the record: no prompt to prefill": 1,
        f"prompt + answer longer than the target's max_position_embeddings={limit}": 1,
    }
    assert "3 answers of 4 records skipped" in caplog.text
    # every answer: a later answer's prompt is the record before it, earlier answers included
    every = collect_heldout_texts(records[:1], target, contract, answer=None, keep_tokens=None)
    assert [t.answer for t in every.texts] == [(50, 51, 52), (60, 61)]
    assert every.texts[1].prompt == (*prompt, 50, 51, 52, *SECOND_TURN)
    # the aux is causal: the first text's rows are those of its own teacher-forced forward. The two
    # forwards have different lengths, so their float32 sums may round differently (AVX-512 vs AVX2)
    from eaglewire.predict.text_replay import text_aux

    torch.testing.assert_close(every.auxes[0], text_aux(target, contract, [*prompt, 50, 51, 52]))


def test_a_tree_with_nothing_to_replay_is_a_note(bench: Bench) -> None:
    _, predictor = bench
    empty = replace(predictor, records=[_record("none", [([1, 2, 3], False)])])
    (row,) = prediction_rows(empty, [(TREE, 2.0)])
    assert row.predicted_tau is None and "no held-out answer to replay" in row.note
    deep = SpecArgs(num_steps=TREE.num_steps + 1, topk=2, num_draft_tokens=6)
    with pytest.raises(ConfigError, match="exceeds the 3 steps evaluated"):
        predictor.replay_dynamic_tree(deep)
