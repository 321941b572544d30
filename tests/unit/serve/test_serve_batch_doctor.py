"""`eaglewire doctor --served --concurrency N` against `eaglewire serve --max-batch 8` (issue 53 item 2):
with eight clients sending at once the verdict is the one a single client gets
(tests/unit/doctor/test_served_http.py): exit 0 for a correct deployment, exit 1 naming
`served.aux.shifted` for a miswired one, and the server's two acceptance reports agree over all of them. The doctor runs through the installed
console script; the servers are the package's own, on 127.0.0.1, on the doctor tests' world (a draft
trained on the target's greedy answers to the prompts the doctor sends, so that wirings tell apart)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from eaglewire.engine.spec_args import SpecArgs
from eaglewire.serve.loading import LoadOptions, load_served_model
from tests.faults.harness import console_script
from tests.unit.doctor.served_world import ANSWER_TOKENS, CHAIN, ServedWorld, build_world, edit_config, export
from tests.unit.serve.world import running

MAX_BATCH = 8
SHIFTED = [3, 5, 6]  # vLLM ids read as boundaries: each aux state one layer late (trained: 2, 4, 5)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> ServedWorld:
    base = tmp_path_factory.mktemp("served-batch")
    w = build_world(base)
    out = export(w, "vllm", base / "vllm")
    shifted = base / "vllm-shifted"
    shutil.copytree(out, shifted)
    edit_config(shifted, "eagle_aux_hidden_state_layer_ids", SHIFTED)
    return w


@pytest.fixture(scope="module")
def urls(world: ServedWorld) -> Iterator[dict[str, str]]:
    """deployment -> a --max-batch 8 server of its own (the doctor compares /metrics around all of its
    requests: nothing else may use the server meanwhile)."""
    drafts = {
        "correct": (world.draft_dir, "auto"),
        "shifted": (world.draft_dir.parent / "vllm-shifted", "vllm"),
    }
    with ExitStack() as stack:
        out = {}
        for name, (draft, engine) in drafts.items():
            options = LoadOptions(
                target=str(world.target_dir), draft=draft, engine=engine, sglang_version=None,  # type: ignore[arg-type]
                vllm_version=None, spec=SpecArgs.chain(CHAIN), dtype="float32", device="cpu", runner="auto",
                context_length=None, max_batch=MAX_BATCH,
            )  # fmt: skip
            served = load_served_model(options, "tiny")  # a model each: a server's engine owns its rows
            out[name] = stack.enter_context(running(served, max_queue=8)).url
        yield out


def test_the_verdict_is_the_same_from_eight_clients_at_once(
    world: ServedWorld, urls: dict[str, str], tmp_path: Path
) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EAGLEWIRE_HOME": str(tmp_path / "home"), "COLUMNS": "200",
           "NO_COLOR": "1"}  # fmt: skip
    procs = {}
    for name, url in urls.items():
        argv = [console_script(), "doctor", "--served", url, "--engine", "eaglewire", "--draft", str(world.draft_dir),
                "--target", str(world.target_dir), "--prompts", str(world.prompts_file),
                "--max-tokens", str(ANSWER_TOKENS), "--concurrency", str(MAX_BATCH)]  # fmt: skip
        procs[name] = subprocess.Popen(
            argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    outputs = {key: proc.communicate(timeout=180)[0] for key, proc in procs.items()}
    codes = {key: proc.returncode for key, proc in procs.items()}
    shown = "\n".join(f"--- {k}: exit {codes[k]}\n{v[-3000:]}" for k, v in outputs.items())
    assert codes == {"correct": 0, "shifted": 1}, shown
    text = " ".join(outputs["shifted"].split())
    assert "[error] served.aux.shifted:" in text, shown
    assert "every prompt's verifications equal: exact" in text, shown
    assert "served.stats_disagree" not in " ".join(outputs["correct"].split()), shown
