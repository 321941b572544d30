"""benchmarks/scale_model.py and the forced acceptance it replays traces with (`engine.forced`).

Forced runs on CPU in float32 on a tiny random target, through the fast runner that verifies
inside its forward, in both round loops: the accepted paths are the given ones exactly. The tree
case uses a draft with a zero head (all draft logits equal), whose trees have the same shape every
round whatever the roots, so any path of that shape is a valid trace to force."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from benchmarks.engine_speed import build_target
from benchmarks.scale_model import TINY_TREE, main, read_traces, scale_draft

from eaglewire.cli.common import EXIT_INVALID_INPUT, run_script
from eaglewire.contract.numbering import default_boundaries
from eaglewire.engine.drafting import Drafter
from eaglewire.engine.forced import ForcedAcceptance
from eaglewire.engine.runners.fast.runner import FastTargetRunner
from eaglewire.engine.sampling import SamplingParams
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.engine.speculative import speculative_generate
from eaglewire.engine.verify import StopRule
from eaglewire.errors import ConfigError

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "scale_model.py"
MAX_SEQ_LEN = 160
SPECS = {"chain": SpecArgs.chain(4), "tree": TINY_TREE}


@pytest.fixture(scope="module")
def target():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: a second thread only adds synchronisation
    yield build_target("tiny", torch.device("cpu"), torch.float32)
    torch.set_num_threads(threads)


def tree_parents(draft, spec: SpecArgs, target) -> list[int]:
    """The parents of the (root-independent) tree a zero-head draft builds."""
    drafter = Drafter(draft, spec, max_seq_len=MAX_SEQ_LEN)
    aux = torch.randn(4, draft.config.aux_width)
    drafter.extend(aux, torch.tensor([5, 6, 7, 8]), start_position=0)
    return drafter.draft_tree(9, 4, SamplingParams()).parents.tolist()


def random_trace(parents: list[int], rounds: int, seed: int) -> list[list[int]]:
    """Per round a random node and its ancestors, root first."""
    rng = random.Random(seed)
    trace = []
    for _ in range(rounds):
        node, path = rng.randrange(len(parents)), []
        while node >= 0:
            path.append(node)
            node = parents[node]
        trace.append(path[::-1])
    return trace


@pytest.mark.parametrize("shape", sorted(SPECS))
def test_forced_run_accepts_the_given_paths_in_both_loops(target, shape):
    spec = SPECS[shape]
    draft = scale_draft(target, 256, head_logit_std=0.0)
    parents = tree_parents(draft, spec, target)
    assert len(parents) == spec.num_draft_tokens
    given = random_trace(parents, rounds=12, seed=3)
    assert any(len(p) > 2 for p in given)
    assert shape == "chain" or any(p != list(range(len(p))) for p in given)  # not only first-child paths
    prompt = list(range(3, 20))
    runner = FastTargetRunner(
        target, default_boundaries(target.num_layers), max_batch_size=1, max_seq_len=MAX_SEQ_LEN
    )
    forced = ForcedAcceptance(runner.max_seq_len, runner.device)
    runner.forced_acceptance = forced
    forced.load(len(prompt) - 1, given)
    stop = StopRule(sum(len(p) for p in given))  # eos off: the whole trace
    for ahead in (False, True):
        drafter = Drafter(draft, spec, max_seq_len=MAX_SEQ_LEN)
        trace = speculative_generate(
            runner, drafter, prompt, sampling=SamplingParams(), stop=stop, launch_ahead=ahead
        )
        assert trace.loop == ("launch_ahead" if ahead else "lockstep")
        assert trace.accepted_paths == given
        assert trace.emitted_per_round == [len(p) for p in given]
    runner.forced_acceptance = None  # decoding again compares tokens: a random draft accepts ~nothing
    drafter = Drafter(draft, spec, max_seq_len=MAX_SEQ_LEN)
    real = speculative_generate(runner, drafter, prompt, sampling=SamplingParams(), stop=stop)
    assert real.accepted_paths != given


def test_a_shorter_round_does_not_shift_the_rounds_after_it():
    forced = ForcedAcceptance(64, "cpu")
    forced.load(9, [[0, 1, 2], [0, 1], [0, 1, 2, 3]])  # roots at 9, 12, 14
    chain = torch.ones(4, 4, dtype=torch.bool).tril()[None]  # [1, 4, 4]
    for root, depth in ((9, 2), (12, 1), (14, 3), (11, 1), (13, 3), (15, 0)):
        agreed = forced.agreed(torch.arange(root, root + 4)[None], chain)
        assert agreed[0].tolist() == [i <= depth for i in range(4)], root
    with pytest.raises(ConfigError, match="root"):
        forced.load(0, [[1, 2]])


EXTRA_FLAGS = ["--weights-before-after", "--extra-trees", "3x2x6"]


def test_tiny_end_to_end(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SCRIPT.parents[1] / "src"), str(SCRIPT.parents[1])]),
    }
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--tiny", "--out", str(tmp_path), *EXTRA_FLAGS],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "scale.json").read_text())
    for key in ("projected_tiny_speedup_tree", "projected_tiny_speedup_chain", "draft_step_over_floor_tiny",
                "draft_tree_step_over_floor_tiny", "verify128_over_decode1_tiny"):  # fmt: skip
        assert result[key] > 0, key
    sets = read_traces([tmp_path / "tiny_bench.json"], None)
    assert sorted(result["trace_tau"].values()) == sorted(ts.tau_recorded for ts in sets)
    chain = next(r for r in result["settings"] if r["settings"]["topk"] == 1)
    # at the trace's own tau: tau_recorded tokens per round at the measured round and plain costs
    plain_ms = chain["plain_seconds"] / chain["new_tokens"] * 1000
    expected = chain["tau_recorded"] / chain["round_ms"] * plain_ms
    assert result["projected_tiny_speedup_chain_at_trace_tau"] == pytest.approx(expected, rel=1e-6)
    assert chain["replayed_exactly"] == 1.0 and chain["rounds"] == chain["rounds_recorded"]
    assert "Projection" in done.stdout and done.stdout.rstrip().endswith("|")
    # the draft parts with fused weights and (before) concatenated per forward, the extra tree timed too
    parts = result["components"]
    assert set(parts["draft"]) == set(parts["draft_unfused"]) >= {"chain 5x1x6", "tree 3x2x6"}
    for name, row in result["round_parts"].items():
        goal = 2.0 if name.startswith("chain") else 2.5
        assert row["parts_ms"] == pytest.approx(row["verify_ms"] + row["draft_round_ms"] + row["extend_ms"])
        assert row["tau_for_goal"] == pytest.approx(goal * row["parts_ms"] / parts["forward_ms"]["1"])
    # recorded prompt lengths, parts at 128 tokens; the draft-vs-verify check at that context
    assert result["meta"]["context_tokens"] is None and parts["context_tokens"] == 128
    assert set(result["draft_vs_verify"]) == set(parts["draft"])
    assert isinstance(result["draft_round_not_slower_than_verify_tiny"], bool)


def test_context_tokens_replay_at_that_context(tmp_path, capsys):
    """--context-tokens: every replayed prompt that long, the parts timed after it, and one PASS/FAIL
    line per draft setting for its round against its verify, a boolean each in scale.json."""
    threads = torch.get_num_threads()
    try:
        assert main(["--tiny", "--context-tokens", "200", "--out", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(threads)  # --tiny runs on one thread
    result = json.loads((tmp_path / "scale.json").read_text())
    assert result["meta"]["context_tokens"] == result["meta"]["parts_context_tokens"] == 200
    assert result["components"]["context_tokens"] == 200
    for row in result["settings"]:
        assert row["prompt_tokens_mean"] == 200
        if row["settings"]["topk"] == 1:  # a random draft's tree changes shape: only a chain replays exactly
            assert row["replayed_exactly"] == 1.0 and row["rounds"] == row["rounds_recorded"]
        assert row["plain_decode_ms"] > 0 and row["projected_decode_speedup"] > 0
    answer = max(t.new_tokens for ts in read_traces([tmp_path / "tiny_bench.json"], None) for t in ts.prompts)
    assert (
        result["meta"]["max_seq_len"] == 200 + answer + 128 + 1
    )  # the caches hold context + answer + a verify
    checks = result["draft_vs_verify"]
    assert set(checks) == {"chain 5x1x6", "tree 4x3x8"}
    for name, check in checks.items():
        forward = result["components"]["forward_ms"][str(check["verify_nodes"])]
        assert check["verify_ms"] == forward and check["context_tokens"] == 200
        assert check["draft_round_ms"] == result["components"]["draft"][name]["round_ms"]
        assert check["draft_not_slower"] is (check["draft_round_ms"] <= check["verify_ms"])
    assert result["draft_round_not_slower_than_verify_tiny"] is all(
        c["draft_not_slower"] for c in checks.values()
    )
    lines = [
        line for line in capsys.readouterr().out.splitlines() if line.startswith("draft vs verify at 200")
    ]
    assert len(lines) == 2 and all(line.endswith(("PASS", "FAIL")) for line in lines)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("-3", "expected >= 1 prompt tokens, got -3"),
        ("0", "expected >= 1 prompt tokens, got 0"),
        # the synthetic trace's answers are at most 24 tokens; the tiny shape has 4,096 positions
        ("4000", "4000 context tokens + 24 replayed new tokens (the longest trace) + a verify of 128 + 1"),
    ],
)
def test_a_bad_context_is_refused(tmp_path, capsys, value, said):
    threads = torch.get_num_threads()
    try:
        with pytest.raises(SystemExit) as exit_:
            run_script(lambda: main(["--tiny", "--context-tokens", value, "--out", str(tmp_path)]))
    finally:
        torch.set_num_threads(threads)
    assert exit_.value.code == EXIT_INVALID_INPUT == 2
    err = capsys.readouterr().err
    assert "--context-tokens" in err and said in err
    assert not (tmp_path / "scale.json").exists()
