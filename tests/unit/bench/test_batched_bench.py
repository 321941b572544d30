"""`eaglewire bench --batch-sizes` through the installed console script, on a saved tiny target and an
untrained draft (float32, CPU): every method at every batch size, the rule saved into the draft, and
the float32 verdict on batched greedy tokens, both ways."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from eaglewire.bench.batched import BatchBenchConfig, BatchBenchReport, BatchRun
from eaglewire.draft.init import init_draft
from eaglewire.draft.io import save_draft
from eaglewire.engine.spec_args import SpecArgs
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import LoadedTarget, load_target
from tests.faults.harness import console_script
from tests.helpers.tiny import save_tiny_target


@pytest.fixture(scope="module")
def files(tiny_target: LoadedTarget, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("batched-bench")
    target_dir = save_tiny_target(tiny_target, root / "target")
    loaded = load_target(target_dir, dtype="float32", device="cpu")
    contract = build_contract(loaded)
    draft_dir = save_draft(init_draft(loaded, contract), contract, root / "draft")
    prompts = root / "prompts.jsonl"
    prompts.write_text(
        '{"prompt": "Hello! How are you?"}\n{"prompt": "What is your favourite book?"}\n{"prompt": "x"}\n'
    )
    return {"target": target_dir, "draft": draft_dir, "prompts": prompts, "root": root}


def _bench(files: dict[str, Path], *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [console_script(), "bench", "--target", str(files["target"]), "--draft", str(files["draft"]),
            "--prompts", str(files["prompts"]), "--max-new-tokens", "5", "--chain-steps", "2", "--num-steps", "2",
            "--topk", "2", "--num-draft-tokens", "4", "--device", "cpu", "--no-plots", *extra]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EAGLEWIRE_HOME": str(files["root"] / "home")}
    return subprocess.run(argv, cwd=files["root"], env=env, capture_output=True, text=True, timeout=180)


def test_every_method_at_every_batch_size_and_the_rule_saved(files: dict[str, Path]) -> None:
    out = files["root"] / "out"
    done = _bench(files, "--batch-sizes", "1,2", "--write-best", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "batch_bench.json").read_text())
    runs = {(r["method"], r["batch"]): r for r in report["runs"]}
    assert set(runs) == {(m, b) for m in ("plain", "eagle-chain", "eagle-tree") for b in (1, 2)}
    for (method, batch), r in runs.items():
        assert r["requests"] == max(3, 2 * batch) and r["tokens"] > 0
        assert r["rounds"] > 0 and 0 < r["rounds_seconds"] <= r["seconds"] and r["prefill_seconds"] > 0
        if method != "plain":  # float32: every request's tokens are plain greedy's at the same batch size
            assert r["matches_plain"] == r["requests"], r
    assert set(report["speedup_by_batch"]) == {"eagle-chain", "eagle-tree"}
    assert set(report["predicted_speedup_by_batch"]["eagle-tree"]) == {"1", "2"}
    saved = list((files["draft"] / "batch_rules").glob("*.json"))
    assert [p.name for p in saved] == ["cpu.json"] and (out / "batch_rule.json").is_file()
    assert "rounds / prefill / other %" in done.stdout


def test_a_batch_size_below_one_is_refused_before_anything_runs(files: dict[str, Path]) -> None:
    out = files["root"] / "refused"
    done = _bench(files, "--batch-sizes", "0,2", "--out", str(out))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--batch-sizes" in done.stderr + done.stdout and not out.exists()


def _report(matches: int) -> BatchBenchReport:
    cfg = BatchBenchConfig((2,), ("plain", "eagle-chain"), SpecArgs.chain(2), SpecArgs.chain(2), 5)
    run = BatchRun("eagle-chain", 2, 4, 20, 1.0, [1.0] * 4, 1.5, 0.01, matches_plain=matches)
    return BatchBenchReport("p", "", "cpu", "float32", cfg, runs=[run])


@pytest.mark.parametrize(("matches", "says"), [(4, []), (3, ["eagle-chain at batch 2: 1 of 4 requests"])])
def test_what_the_float32_verdict_reads(matches: int, says: list[str]) -> None:
    """The differences `bench --batch-sizes` hands to its float32 verdict (exit 1, tested with the
    single-request bench's): none when every request matched plain, else each run named."""
    assert _report(matches).greedy_differences() == says
