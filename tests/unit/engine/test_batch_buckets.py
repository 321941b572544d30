"""Batch-size buckets and row compaction (pure host math), and the batch rule that picks a setting
per batch size from a cost table (`BatchRule`, `rule_policy`)."""

from __future__ import annotations

import itertools
import json

import pytest

from eaglewire.engine.batch.buckets import bucket_for, buckets, compaction_moves
from eaglewire.engine.batch.engine import setting_label
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.errors import ConfigError
from eaglewire.predict.by_batch import (
    PLAIN,
    RULE_VERSION,
    BatchRule,
    device_slug,
    load_rule,
    rule_path,
    rule_policy,
)

CHAIN, TREE = SpecArgs.chain(4), SpecArgs(num_steps=4, topk=3, num_draft_tokens=8)
C, T = setting_label(CHAIN), setting_label(TREE)


@pytest.mark.parametrize(
    ("max_rows", "expected"),
    [
        (1, [1]),
        (2, [1, 2]),
        (3, [1, 2, 3]),
        (4, [1, 2, 4]),
        (5, [1, 2, 4, 5]),
        (8, [1, 2, 4, 8]),
        (12, [1, 2, 4, 8, 12]),
    ],
)
def test_buckets_are_powers_of_two_then_the_largest(max_rows, expected):
    assert buckets(max_rows) == expected


def test_bucket_for_is_the_smallest_that_holds():
    assert [bucket_for(n, 5) for n in range(6)] == [1, 1, 2, 4, 4, 5]
    assert [bucket_for(n, 8) for n in range(9)] == [1, 1, 2, 4, 4, 8, 8, 8, 8]
    assert bucket_for(1, 1) == 1
    with pytest.raises(ValueError, match="6 rows do not fit a batch of at most 5"):
        bucket_for(6, 5)


def test_compaction_moves_examples():
    assert compaction_moves([False, True, False, True, True], 4) == [(4, 0)]
    assert compaction_moves([True, False, False, True], 2) == [(3, 1)]
    assert compaction_moves([False, False, True, True, True], 4) == [(4, 0)]
    assert compaction_moves([False, False, False, True, True], 2) == [(3, 0), (4, 1)]
    assert compaction_moves([True, True, False, False], 2) == []  # already inside: nothing moves
    assert compaction_moves([False] * 4, 1) == []
    with pytest.raises(ValueError, match="3 occupied rows do not fit a bucket of 2"):
        compaction_moves([True, False, True, True], 2)


@pytest.mark.parametrize("rows", range(1, 7))
def test_compaction_moves_bring_every_row_inside(rows):
    """Every occupancy of `rows` rows and every bucket that holds its occupied rows: the moves take
    each occupied row at or past the bucket to a distinct free row below it, and touch no other row."""
    for occupied in itertools.product([False, True], repeat=rows):
        for bucket in range(1, rows + 1):
            if sum(occupied) > bucket:
                with pytest.raises(ValueError):
                    compaction_moves(list(occupied), bucket)
                continue
            moves = compaction_moves(list(occupied), bucket)
            after = list(occupied)
            for src, dst in moves:
                assert src >= bucket > dst and after[src] and not after[dst], (occupied, bucket, moves)
                after[dst], after[src] = True, False
            assert not any(after[bucket:]) and sum(after) == sum(occupied)
            assert [after[r] for r in range(bucket) if occupied[r]] == [True] * sum(occupied[:bucket])


# Round costs (seconds) per batch size: the chain beats plain up to B = 4, the tree only at B = 1.
ROUNDS = {
    PLAIN: {1: 0.010, 2: 0.011, 4: 0.012, 8: 0.020},
    C: {1: 0.012, 2: 0.014, 4: 0.020, 8: 0.045},
    T: {1: 0.0125, 2: 0.020, 4: 0.032, 8: 0.080},
}
TAUS = {C: 2.0, T: 2.5}


def make_rule(**changes) -> BatchRule:
    fields = dict(device="NVIDIA H200 (cuda:0)", dtype="bfloat16", taus=dict(TAUS), round_seconds=ROUNDS)
    fields.update(changes)
    return BatchRule(**fields)  # type: ignore[arg-type]


def test_predicted_speedup_is_tau_times_plain_over_round():
    rule = make_rule()
    assert rule.batch_sizes == [1, 2, 4, 8]
    for setting, tau in TAUS.items():
        for b in rule.batch_sizes:
            assert rule.predicted_speedup(setting, b) == pytest.approx(
                tau * ROUNDS[PLAIN][b] / ROUNDS[setting][b]
            )
    assert rule.predicted_speedup(T, 1) == pytest.approx(2.0)
    assert rule.predicted_speedup(C, 8) == pytest.approx(40 / 45)
    assert rule.predicted_speedup("9x9x9", 1) is None  # no costs, no tau


def test_choice_picks_the_fastest_or_plain():
    rule = make_rule()
    assert [rule.choice(b) for b in (1, 2, 4, 8)] == [T, C, C, PLAIN]  # at 8 nothing beats 1.0
    assert rule.choice(1, [C]) == C and rule.choice(1, []) == PLAIN
    # a speed-up of exactly 1.0 does not beat plain decoding
    even = make_rule(taus={C: 1.0}, round_seconds={PLAIN: {1: 0.01}, C: {1: 0.01}})
    assert even.predicted_speedup(C, 1) == pytest.approx(1.0) and even.choice(1) == PLAIN
    # a setting with no cost at a measured size is never chosen there
    partial = make_rule(round_seconds={**ROUNDS, T: {1: 0.0125}})
    assert partial.predicted_speedup(T, 2) is None and partial.choice(2) == C and partial.choice(1) == T


def test_unmeasured_sizes_take_the_next_measured_size_up():
    rule = make_rule()
    assert [rule.measured_size(b) for b in (1, 2, 3, 4, 5, 7, 8, 9, 100)] == [1, 2, 4, 4, 8, 8, 8, 8, 8]
    for setting in TAUS:
        assert rule.predicted_speedup(setting, 3) == rule.predicted_speedup(setting, 4)
        assert rule.predicted_speedup(setting, 5) == rule.predicted_speedup(setting, 8)
        assert rule.predicted_speedup(setting, 64) == rule.predicted_speedup(setting, 8)  # past the largest
    assert rule.choice(3) == C and rule.choice(5) == PLAIN and rule.choice(1000) == PLAIN


def test_auto_off_batch():
    rule = make_rule()
    assert rule.auto_off_batch(T) == 4  # 2.5 * 12 / 32 < 1
    assert rule.auto_off_batch(C) == 8
    never = make_rule(taus={C: 5.0}, round_seconds={PLAIN: ROUNDS[PLAIN], C: ROUNDS[C]})
    assert never.auto_off_batch(C) is None
    assert rule.auto_off_batch("9x9x9") is None


def test_table_and_describe():
    rule = make_rule()
    table = rule.table()
    assert [row["batch"] for row in table] == [1, 2, 4, 8]
    assert [row["choice"] for row in table] == [T, C, C, PLAIN]
    assert table[0]["plain_round_ms"] == pytest.approx(10.0)
    text = rule.describe()
    assert "B=  1" in text and f"-> {T}" in text and f"-> {PLAIN}" in text


def test_the_rule_checks_its_costs():
    with pytest.raises(ConfigError, match="plain"):
        make_rule(round_seconds={C: ROUNDS[C]})
    with pytest.raises(ConfigError, match="have a tau but no round costs"):
        make_rule(round_seconds={PLAIN: ROUNDS[PLAIN], C: ROUNDS[C]})  # TREE has a tau only


def test_json_round_trip(tmp_path):
    rule = make_rule(tau_source="predicted", measured_at="2026-05-20", command="eaglewire bench", notes=["n"])
    data = rule.to_json()
    data = json.loads(json.dumps(data))  # plain JSON: batch sizes become string keys
    assert data["version"] == RULE_VERSION
    assert data["choice_by_batch"] == {"1": T, "2": C, "4": C, "8": PLAIN}
    assert data["auto_off_batch"] == {C: 8, T: 4}
    assert data["predicted_speedup_by_batch"][T]["1"] == pytest.approx(2.0)
    assert BatchRule.from_json(data) == rule
    path = rule_path(tmp_path / "draft", rule.device)
    assert path == tmp_path / "draft" / "batch_rules" / "nvidia-h200.json"
    assert rule.save(path) == path and load_rule(path) == rule


def test_load_rule_refuses_a_wrong_version_and_a_malformed_file(tmp_path):
    data = make_rule().to_json()
    wrong = tmp_path / "wrong_version.json"
    wrong.write_text(json.dumps({**data, "version": RULE_VERSION + 1}))
    with pytest.raises(ConfigError, match="wrong_version.json") as err:
        load_rule(wrong)
    assert "version" in str(err.value) and "bench --batch-sizes" in str(err.value)
    unversioned = tmp_path / "unversioned.json"
    unversioned.write_text(json.dumps({k: v for k, v in data.items() if k != "version"}))
    with pytest.raises(ConfigError, match="unversioned.json"):
        load_rule(unversioned)
    for name, text in [
        ("not_json.json", "{not json"),
        ("no_costs.json", json.dumps({k: v for k, v in data.items() if k != "round_seconds"})),
        ("bad_cost.json", json.dumps({**data, "round_seconds": {PLAIN: {"one": 0.1}}})),
        ("a_list.json", json.dumps({**data, "taus": [1, 2]})),
    ]:
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(ConfigError, match=name):
            load_rule(path)
    with pytest.raises(ConfigError, match="missing.json"):
        load_rule(tmp_path / "missing.json")


def test_device_slug():
    assert device_slug("NVIDIA H200 (cuda:0)") == "nvidia-h200"
    assert device_slug("cpu (x86_64, 2 threads)") == "cpu"
    assert device_slug("NVIDIA H100 80GB HBM3 (cuda:1)") == "nvidia-h100-80gb-hbm3"
    assert device_slug("") == "unknown" and device_slug("!!") == "unknown"


def test_rule_policy_follows_the_choice():
    rule = make_rule()
    policy = rule_policy(rule, {C: CHAIN, T: TREE})
    assert [policy(n) for n in range(1, 10)] == [TREE, CHAIN, CHAIN, CHAIN, None, None, None, None, None]
    # only the settings the engine offers: without the tree, B = 1 takes the chain
    chain_only = rule_policy(rule, {C: CHAIN})
    assert [chain_only(n) for n in (1, 2, 4, 8)] == [CHAIN, CHAIN, CHAIN, None]
    # a label the rule has no costs for is never chosen
    unknown = rule_policy(rule, {setting_label(SpecArgs.chain(2)): SpecArgs.chain(2)})
    assert [unknown(n) for n in (1, 2, 4, 8)] == [None] * 4
