"""The loop on a tiny target: learning, resume equality, contract stop, NaN naming, outputs on disk."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from eaglewire.contract.contract import Contract
from eaglewire.draft.init import init_draft
from eaglewire.draft.io import load_draft
from eaglewire.errors import ConfigError, ContractMismatchError, TrainingError
from eaglewire.target.identity import build_contract
from eaglewire.train.config import TrainConfig
from eaglewire.train.distributed import init_distributed
from eaglewire.train.epoch_plans import EpochPlans
from eaglewire.train.loop import Trainer, train
from eaglewire.train.target_side import OfflineTarget, OnlineTarget, TargetHead

FAST = TrainConfig(
    ttt_steps=3,
    max_length=64,
    batch_size=4,
    learning_rate=3e-3,
    warmup_ratio=0.1,
    epochs=2,
    step_weight_decay=0.8,
)


def offline(target, contract, draft):
    return OfflineTarget(TargetHead.from_target(target, contract.final), contract, draft.draft_to_target)


def test_loss_decreases_on_tiny_dataset(
    tiny_target, tiny_contract, captured_records, eval_captured, tmp_path
):
    draft = init_draft(tiny_target, tiny_contract, seed=0)
    cfg = replace(FAST, epochs=12, eval_every=8)  # 16 packed records make 2 steps an epoch
    res = train(
        cfg,
        draft,
        tiny_contract,
        captured_records,
        offline(tiny_target, tiny_contract, draft),
        out_dir=tmp_path / "run",
        eval_data=eval_captured,
        progress=False,
    )
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_lines = [x for x in lines if x["split"] == "train"]
    evals = [x for x in lines if x["split"] == "eval"]
    assert res.optimizer_steps == len(train_lines) >= 20
    first = sum(x["loss"] for x in train_lines[:3]) / 3
    last = sum(x["loss"] for x in train_lines[-3:]) / 3
    assert last < 0.8 * first, (first, last)
    print("losses", [round(x["loss"], 2) for x in train_lines], [round(x["acc"][0], 2) for x in evals])
    assert evals[-1]["loss"] < evals[0]["loss"]
    assert evals[-1]["acc"][0] > evals[0]["acc"][0]
    for key in ("loss_per_step", "acc", "cond_acc", "lr", "grad_norm", "tokens_per_s", "oov_masked"):
        assert key in train_lines[-1]
    assert len(train_lines[-1]["acc"]) == cfg.ttt_steps
    # the final draft is a loadable draft directory with the contract
    loaded, contract = load_draft(res.draft_dir)
    assert contract == tiny_contract
    for k, v in draft.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v.cpu()), k


def test_resume_reaches_the_same_weights(tiny_target, tiny_contract, captured_records, tmp_path):
    cfg = replace(FAST, epochs=4, checkpoint_every=3, keep_checkpoints=1)
    full = init_draft(tiny_target, tiny_contract, seed=0)
    res_full = train(
        cfg,
        full,
        tiny_contract,
        captured_records,
        offline(tiny_target, tiny_contract, full),
        out_dir=tmp_path / "full",
        progress=False,
    )

    part = init_draft(tiny_target, tiny_contract, seed=0)
    run = tmp_path / "part"
    # "crash" two steps after the checkpoint at step 3: no checkpoint is written for steps 4-5
    early = train(
        cfg,
        part,
        tiny_contract,
        captured_records,
        offline(tiny_target, tiny_contract, part),
        out_dir=run,
        stop_after_steps=5,
        progress=False,
    )
    assert early.optimizer_steps == 5
    assert json.loads((run / "latest.json").read_text())["optimizer_step"] == 3
    # a different init: every weight must come from the checkpoint
    fresh = init_draft(tiny_target, tiny_contract, seed=7)
    res = train(
        replace(cfg, keep_checkpoints=2),  # cadence fields may change on resume
        fresh,
        tiny_contract,
        captured_records,
        offline(tiny_target, tiny_contract, fresh),
        out_dir=run,
        resume=True,
        progress=False,
    )
    assert res.optimizer_steps == res_full.optimizer_steps
    a, b = (
        load_file(str(res_full.draft_dir / "model.safetensors")),
        load_file(str(res.draft_dir / "model.safetensors")),
    )
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(b[k], a[k]), k  # bitwise: same rows, same order, same RNG, same optimizer state
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, res.optimizer_steps + 1))  # lines of the lost steps 4-5 were replaced
    # the config of a resumed run must be the run's own
    with pytest.raises(ConfigError, match="learning_rate"):
        train(
            replace(cfg, learning_rate=1.0),
            fresh,
            tiny_contract,
            captured_records,
            offline(tiny_target, tiny_contract, fresh),
            out_dir=run,
            resume=True,
            progress=False,
        )


def test_resume_refuses_a_plan_that_no_longer_lines_up(
    tiny_target, tiny_contract, captured_records, tmp_path, monkeypatch
):
    """The checkpoint keeps its epoch's plan of rows (sha256): resuming over the records in another
    order (a rebuilt dataset) or under another packing rule is refused, naming the epoch and both
    hashes, instead of continuing at a position that now points at other records."""
    import eaglewire.train.epoch_plans as epoch_plans

    cfg = replace(FAST, epochs=2, checkpoint_every=1)
    draft = init_draft(tiny_target, tiny_contract, seed=0)
    run = tmp_path / "run"
    side = offline(tiny_target, tiny_contract, draft)
    train(cfg, draft, tiny_contract, captured_records, side, out_dir=run, stop_after_steps=1, progress=False)
    state = json.loads(next(run.glob("checkpoints/step-*/trainer_state.json")).read_text())
    assert len(state["epoch_plan_sha256"]) == 64
    with pytest.raises(TrainingError, match=r"epoch 0's plan of rows \(sha256 [0-9a-f]{12}\) differs"):
        train(
            cfg, draft, tiny_contract, captured_records[::-1], side, out_dir=run, resume=True, progress=False
        )
    first_fit = epoch_plans.plan_rows
    with monkeypatch.context() as m:  # the rule before 2026-12-01: next-fit
        m.setattr(epoch_plans, "plan_rows", lambda *a, **k: first_fit(*a, **{**k, "open_rows": 1}))
        with pytest.raises(TrainingError, match="packing rule changed"):
            train(cfg, draft, tiny_contract, captured_records, side, out_dir=run, resume=True, progress=False)
    res = train(cfg, draft, tiny_contract, captured_records, side, out_dir=run, resume=True, progress=False)
    assert res.optimizer_steps > 1  # the same records under the same rule resume


def test_preparing_the_next_step_during_this_one_changes_nothing(
    tiny_target, tiny_contract, captured_records, tmp_path
):
    """The loop prepares step i+1's inputs inside step i (across epochs too); the weights are
    bitwise those of preparing each step on its own, in order."""
    cfg = replace(FAST, epochs=3)
    piped = init_draft(tiny_target, tiny_contract, seed=0)
    res = train(
        cfg,
        piped,
        tiny_contract,
        captured_records,
        offline(tiny_target, tiny_contract, piped),
        out_dir=tmp_path / "piped",
        progress=False,
    )
    alone = init_draft(tiny_target, tiny_contract, seed=0)
    trainer = Trainer(
        cfg,
        alone,
        tiny_contract,
        captured_records,
        offline(tiny_target, tiny_contract, alone),
        out_dir=tmp_path / "alone",
        eval_data=None,
        resume=False,
        ctx=init_distributed("cpu"),
    )
    visited = []
    while trainer.step < trainer.total_steps:
        if trainer.group >= len(trainer.plans[trainer.epoch]):
            trainer.epoch, trainer.group = trainer.epoch + 1, 0
            continue
        upcoming = trainer._upcoming()
        _, _, _, following = trainer._train_step(trainer._prepare(trainer.epoch, trainer.group))
        assert following is None  # nothing upcoming was asked for
        visited.append((trainer.epoch, trainer.group, upcoming))
        trainer.step, trainer.group = trainer.step + 1, trainer.group + 1
    assert res.optimizer_steps == trainer.total_steps == len(visited) and cfg.epochs > 1
    # `_upcoming` names exactly the step that follows, and nothing after the last one
    assert [v[2] for v in visited] == [v[:2] for v in visited[1:]] + [None]
    for (name, a), b in zip(piped.state_dict().items(), alone.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_contract_mismatch_stops_before_step_one(tiny_target, tiny_contract, captured_records, tmp_path):
    other = build_contract(tiny_target, aux_boundaries=[1, 4, 5], fingerprint=False)
    draft = init_draft(tiny_target, other, seed=0)
    before = {k: v.clone() for k, v in draft.state_dict().items()}
    with pytest.raises(ContractMismatchError) as err:
        train(
            FAST,
            draft,
            other,
            captured_records,
            offline(tiny_target, tiny_contract, draft),
            out_dir=tmp_path / "run",
            progress=False,
        )
    msg = str(err.value)
    assert "aux_boundaries: draft=[1, 4, 5] data=[2, 4, 5]" in msg
    assert "draft contract:" in msg and "data contract:" in msg  # both printed
    assert not (tmp_path / "run").exists()
    assert all(torch.equal(v, draft.state_dict()[k]) for k, v in before.items())


def test_non_finite_loss_names_step_and_records(tiny_target, tiny_contract, captured_records, tmp_path):
    records = list(captured_records[:4])
    bad = records[2]
    records[2] = replace(bad, aux=bad.aux.clone().fill_(float("inf")))
    draft = init_draft(tiny_target, tiny_contract, seed=0)
    with pytest.raises(TrainingError, match="optimizer step 1 ") as err:
        train(
            replace(FAST, batch_size=4, epochs=1),
            draft,
            tiny_contract,
            records,
            offline(tiny_target, tiny_contract, draft),
            out_dir=tmp_path / "run",
            progress=False,
        )
    assert bad.record_id in str(err.value)


def test_online_inputs_equal_offline_inputs(tiny_target, tiny_contract, token_records, captured_records):
    """The online path (one target forward over the packed rows, each record attending to itself
    only) and the offline path (records captured alone, target head on `final`) hand the draft the
    same aux states and the same restricted target distribution, padding slots included."""
    d2t = torch.arange(0, tiny_target.vocab_size, 2)  # a draft vocab of every other token
    head = TargetHead.from_target(tiny_target, tiny_contract.final)
    online, offline_side = (
        OnlineTarget(tiny_target, tiny_contract, d2t),
        OfflineTarget(head, tiny_contract, d2t),
    )
    rows = [
        tuple(slot for slot in r)
        for r in __import__("eaglewire.train.batches", fromlist=["plan_rows"]).plan_rows(
            [len(r.input_ids) for r in token_records[:6]], range(6), max_length=64, pack=True
        )
    ]
    from eaglewire.train.batches import fetch_rows

    a = online.prepare(rows, fetch_rows(token_records, rows), torch.device("cpu"))
    b = offline_side.prepare(rows, fetch_rows(captured_records, rows), torch.device("cpu"))
    assert torch.equal(a.batch.input_ids, b.batch.input_ids) and torch.equal(a.batch.doc_ids, b.batch.doc_ids)
    torch.testing.assert_close(a.aux, b.aux, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(a.target.probs, b.target.probs, rtol=1e-4, atol=1e-5)
    assert torch.equal(a.target.in_vocab, b.target.in_vocab)
    assert 0 < int(a.target.in_vocab[a.batch.doc_ids >= 0].sum()) < int((a.batch.doc_ids >= 0).sum())


def test_online_training_runs(tiny_target, tiny_contract, token_records, tmp_path):
    draft = init_draft(tiny_target, tiny_contract, seed=0)
    res = train(
        replace(FAST, epochs=1, max_steps=2),
        draft,
        tiny_contract,
        token_records,
        OnlineTarget(tiny_target, tiny_contract, draft.draft_to_target),
        out_dir=tmp_path / "run",
        progress=False,
    )
    assert res.optimizer_steps == 2 and res.tokens > 0
    assert (tmp_path / "run" / "train_config.json").exists()
    with pytest.raises(ConfigError, match="already holds a training run"):
        train(
            replace(FAST, epochs=1, max_steps=2),
            draft,
            tiny_contract,
            token_records,
            OnlineTarget(tiny_target, tiny_contract, draft.draft_to_target),
            out_dir=tmp_path / "run",
            progress=False,
        )


def test_target_head_from_directory_matches_the_model(tiny_target, tiny_contract, tmp_path):
    from tests.helpers.tiny import save_tiny_target

    save_tiny_target(tiny_target, tmp_path / "target")
    final = torch.randn(5, tiny_target.hidden_size)
    for norm in ("pre", "post"):
        fs = replace(tiny_contract.final, norm=norm)
        torch.testing.assert_close(
            TargetHead.from_pretrained(tmp_path / "target", fs)(final),
            TargetHead.from_target(tiny_target, fs)(final),
        )
    assert isinstance(tiny_contract, Contract)


def test_target_head_in_the_targets_dtype_computes_what_the_target_does(tiny_target, tiny_contract):
    """Offline training on a GPU recomputes the labels in the dtype the target ran in (bf16): the
    head then equals the bf16 target's own final norm + lm_head, and float32 stays the CPU rule."""
    import copy

    from eaglewire.target.architectures import target_parts
    from eaglewire.train.run import offline_head_dtype

    bf16 = copy.deepcopy(tiny_target)
    bf16.model.to(torch.bfloat16)
    parts = target_parts(bf16.model)
    final = torch.randn(7, tiny_target.hidden_size).to(torch.bfloat16)
    with torch.no_grad():
        expected = parts.lm_head(parts.final_norm(final)).float()  # the target's own bf16 path
    head = TargetHead.from_target(bf16, tiny_contract.final, dtype=torch.bfloat16)
    assert head.lm_head_weight.dtype == torch.bfloat16
    torch.testing.assert_close(head(final), expected, rtol=0, atol=0)
    assert head(final).dtype == torch.float32
    contract = replace(tiny_contract, dtype="bfloat16")
    assert offline_head_dtype(contract, torch.device("cuda")) == torch.bfloat16
    assert offline_head_dtype(contract, torch.device("cpu")) == torch.float32


def test_tensorboard_missing_is_a_clear_error(tmp_path):
    import importlib.util

    from eaglewire.train.reporting import open_tensorboard

    if importlib.util.find_spec("tensorboard") is not None:
        pytest.skip("tensorboard is installed here")
    with pytest.raises(ConfigError, match="pip install tensorboard"):
        open_tensorboard(tmp_path)


def test_online_packing_refuses_a_sliding_window_shorter_than_its_rows(token_records):
    """The packed forward's custom mask replaces transformers' own, window included: a target whose
    layers see fewer tokens than a row holds is refused, naming both numbers and the way out."""
    from eaglewire.train.batches import fetch_rows, plan_rows
    from tests.helpers.tiny import make_tiny_target

    target = make_tiny_target("mistral")
    target.model.config.sliding_window = 16
    contract = build_contract(target, fingerprint=False)
    side = OnlineTarget(target, contract, torch.arange(0, target.vocab_size, 2))
    records = token_records[:6]
    rows = plan_rows([len(r.input_ids) for r in records], range(6), max_length=64, pack=True)
    with pytest.raises(ConfigError, match="sliding_window=16") as err:
        side.prepare(rows, fetch_rows(records, rows), torch.device("cpu"))
    assert "max_length <= 16" in str(err.value)


def test_compiled_draft_forward_trains_the_same_weights(
    tiny_target, tiny_contract, captured_records, tmp_path, monkeypatch
):
    """compile=True runs each TTT step's draft forward through torch.compile (dynamic shapes) with
    the chain's attention left eager, so every step reuses the first step's graphs (one graph per
    step would mean S forward and S backward compiles); training ends at the same weights as
    eager. aot_eager: dynamo and AOT autograd as on the GPU, without inductor's C++ toolchain on a
    CPU runner."""
    from torch._dynamo.utils import counters

    import eaglewire.train.objective as objective

    monkeypatch.setattr(objective, "COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    counters.clear()
    cfg = replace(FAST, epochs=1, max_steps=3)

    def trained(config: TrainConfig, name: str) -> dict[str, torch.Tensor]:
        draft = init_draft(tiny_target, tiny_contract, seed=0)
        out = tmp_path / name
        train(config, draft, tiny_contract, captured_records, offline(tiny_target, tiny_contract, draft), out_dir=out, progress=False)  # fmt: skip
        return {k: v.clone() for k, v in draft.state_dict().items()}

    weights = {
        compiled: trained(replace(cfg, compile=compiled), f"compile-{compiled}") for compiled in (False, True)
    }
    graphs = counters["stats"]["unique_graphs"]
    assert graphs > 0  # it did compile
    trained(replace(cfg, compile=True, ttt_steps=7), "compile-7-steps")  # none of the graphs is a step's own
    assert counters["stats"]["unique_graphs"] == graphs, (graphs, counters["stats"]["unique_graphs"])
    for name, eager in weights[False].items():
        torch.testing.assert_close(weights[True][name], eager, rtol=1e-4, atol=1e-5, msg=name)
    with pytest.raises(ConfigError, match="compile=True with parallel='fsdp'"):
        replace(cfg, compile=True, parallel="fsdp")


def test_a_step_bounded_run_plans_only_the_epochs_it_reaches(
    tiny_target, tiny_contract, captured_records, tmp_path
):
    """max_steps with epochs=10_000 (benchmarks/draft_levers.py) plans the epochs max_steps reaches,
    not 10,000 (the quickstart's 25,867 records take 0.16 s an epoch to plan on the CI's CPU: 26
    minutes before step one; H200 run 17 lost its lever screen to it), and trains the weights that
    the run with just those epochs trains."""
    bounded = replace(FAST, epochs=10_000, max_steps=5)  # 16 packed records make 2 steps an epoch
    draft = init_draft(tiny_target, tiny_contract, seed=0)
    trainer = Trainer(
        bounded,
        draft,
        tiny_contract,
        captured_records,
        offline(tiny_target, tiny_contract, draft),
        out_dir=tmp_path / "bounded",
        eval_data=None,
        resume=False,
        ctx=init_distributed("cpu"),
    )
    reached = -(-bounded.max_steps // len(trainer.plans[0]))
    assert (trainer.total_steps, trainer.exact_total) == (bounded.max_steps, True)
    res = trainer.run(stop_after_steps=None, progress=False)
    assert trainer.plans.planned <= 2 * reached  # counted once for the schedule, once when trained
    exact = init_draft(tiny_target, tiny_contract, seed=0)
    res_exact = train(
        replace(bounded, epochs=reached),
        exact,
        tiny_contract,
        captured_records,
        offline(tiny_target, tiny_contract, exact),
        out_dir=tmp_path / "exact",
        progress=False,
    )
    assert res.optimizer_steps == res_exact.optimizer_steps == bounded.max_steps
    for (name, a), b in zip(draft.state_dict().items(), exact.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def _trainer(cfg, target, contract, records, out_dir):
    draft = init_draft(target, contract, seed=0)
    side = offline(target, contract, draft)
    return Trainer(cfg, draft, contract, records, side, out_dir=out_dir, eval_data=None, resume=False,
                   ctx=init_distributed("cpu"))  # fmt: skip


def test_a_time_bounded_run_plans_each_epoch_when_it_gets_there(
    tiny_target, tiny_contract, captured_records, tmp_path, caplog
):
    """max_seconds with epochs=10_000 (draft_levers.py --set max_steps=0 max_seconds=200): the clock
    ends the run, and only the epochs it reached were planned (all 10,000 first cost an H200 lever
    screen its 900 s on 2026-12-03 without a trained step). The log says the clock can lead the
    schedule: a bare "an estimated 3720000 steps" read as a warmup that never ends (2y)."""
    timed = replace(FAST, epochs=10_000, max_seconds=1.0)
    with caplog.at_level(logging.INFO, logger="eaglewire.train.loop"):
        trainer = _trainer(timed, tiny_target, tiny_contract, captured_records, tmp_path / "timed")
    assert "or max_seconds=1, whichever is further along" in caplog.text
    assert (trainer.total_steps, trainer.exact_total) == (len(trainer.plans[0]) * 10_000, False)
    assert trainer.plans.planned == 1
    res = trainer.run(stop_after_steps=None, progress=False)
    assert 0 < res.optimizer_steps < trainer.total_steps and trainer.elapsed >= timed.max_seconds
    assert trainer.plans.planned <= trainer.epoch + 2  # epoch 0 twice at most, and the one prefetched


def test_a_time_bounded_run_whose_epochs_run_out_trains_every_step_of_them(
    tiny_target, tiny_contract, captured_records, tmp_path
):
    """The schedule's estimate (epochs x the first epoch's steps) neither cuts a run whose later
    epochs pack into more steps nor stretches one into steps that do not exist."""
    lengths = [len(r.input_ids) for r in captured_records]
    for seed in range(200):  # one record a step, so an epoch's steps are its packed rows, which vary by order
        cfg = replace(FAST, batch_size=1, epochs=2, max_seconds=3600.0, seed=seed)
        plans = EpochPlans(lengths, cfg, world_size=1)
        if len(plans[1]) > len(plans[0]):  # the estimate falls short: the run must not stop at it
            break
    else:
        pytest.fail("no seed below 200 packs epoch 1 of these records into more rows than epoch 0")
    trainer = _trainer(cfg, tiny_target, tiny_contract, captured_records, tmp_path / "timed")
    assert trainer.total_steps == 2 * len(plans[0]) and not trainer.exact_total
    res = trainer.run(stop_after_steps=None, progress=False)
    assert res.optimizer_steps == len(plans[0]) + len(plans[1])
