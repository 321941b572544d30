"""benchmarks/served_tree_grid.py on a tiny bench: its predictions of the bench's own chain and tree
equal the bench's served-text predictions (same text, same evaluation, float32), and a bench whose
prompts encode differently here is refused with the prompt named (run as a script: exit status 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks.served_tree_grid import main
from typer.testing import CliRunner

from eaglewire.cli import app
from eaglewire.draft.init import init_draft
from eaglewire.draft.io import save_draft
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import load_target
from tests.helpers.tiny import make_tiny_target, save_tiny_target

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "served_tree_grid.py"


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("grid")
    target_dir = save_tiny_target(make_tiny_target("llama"), root / "target")
    loaded = load_target(target_dir, dtype="float32", device="cpu")
    contract = build_contract(loaded)
    draft_dir = save_draft(init_draft(loaded, contract), contract, root / "draft")
    prompts = root / "prompts.jsonl"
    prompts.write_text('{"prompt": "Hello! How are you?"}\n{"prompt": "What is your favourite book?"}\n')
    r = CliRunner().invoke(app, [
        "bench", "--target", str(target_dir), "--draft", str(draft_dir), "--prompts", str(prompts),
        "--max-new-tokens", "12", "--methods", "plain,eagle-chain,eagle-tree", "--chain-steps", "2",
        "--num-steps", "3", "--topk", "2", "--num-draft-tokens", "5", "--warmup", "0", "--repeats", "1",
        "--device", "cpu", "--no-plots", "--out", str(root / "bench"),
    ])  # fmt: skip
    assert r.exit_code == 0, r.output
    return {"target": target_dir, "draft": draft_dir, "bench": root / "bench" / "bench.json", "root": root}


def grid_args(files: dict[str, Path], bench: Path, out: Path) -> list[str]:
    return ["--target", str(files["target"]), "--draft", str(files["draft"]), "--bench", str(bench),
            "--trees", "2,1,3", "3,2,5", "3,2,4", "--dynamic", "--out", str(out)]  # fmt: skip


def test_the_bench_settings_are_predicted_as_the_bench_predicted_them(bench_run, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert main(grid_args(bench_run, bench_run["bench"], tmp_path / "grid.json")) == 0
    rows = {
        (r["num_steps"], r["topk"], r["num_draft_tokens"]): r
        for r in json.loads((tmp_path / "grid.json").read_text())["rows"]
    }
    bench = json.loads(bench_run["bench"].read_text())
    served = {(s["num_steps"], s["topk"], s["num_draft_tokens"]): s for s in bench["served_predictions"]}
    for shape in ((2, 1, 3), (3, 2, 5)):
        assert rows[shape]["predicted_tau"] == pytest.approx(served[shape]["served_predicted_tau"], rel=1e-9)
        assert rows[shape]["measured_tau"] == served[shape]["measured_tau"]
    assert rows[(3, 2, 4)]["measured_tau"] is None and rows[(3, 2, 4)]["predicted_tau"] >= 1.0
    # the dynamic replay decodes the bench's own text: the chain's rounds are the bench's, except
    # that the replay's last round per prompt accepts nothing past the text (tests/unit/predict/test_text_replay.py)
    for shape, r in rows.items():
        assert 1.0 <= r["dynamic_tau"] <= shape[0] + 1
    chain = bench["methods"]["eagle-chain"]
    assert rows[(2, 1, 3)]["dynamic_tau"] <= chain["tau"] + 1e-9


def test_a_bench_of_other_prompts_is_refused(bench_run, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bench = json.loads(bench_run["bench"].read_text())
    bench["methods"]["plain"]["prompts"][1]["prompt_tokens"] += 1
    moved = tmp_path / "bench.json"
    moved.write_text(json.dumps(bench))
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    done = subprocess.run([sys.executable, str(SCRIPT), *grid_args(bench_run, moved, tmp_path / "grid.json")],
                          capture_output=True, text=True, env=env, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 2
    assert "encodes to" in done.stderr and str(moved) in done.stderr
