"""Prompt lengths against the target's positions (`engine.fits`) and `bench --prompts A,B` (`bench.by_context`),
through the installed `eaglewire` console script on a saved tiny target of 96 positions: several sets
in one run with a row per (set, method); a bad set name, or a prompt too long for the target, refused
(exit 2) before any decoding, naming the prompt and the lengths."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eaglewire.bench.prompts import encode_prompt, load_prompt_set
from eaglewire.cli import app
from eaglewire.draft.init import init_draft
from eaglewire.draft.io import save_draft
from eaglewire.errors import ConfigError
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import load_target, load_tokenizer
from tests.faults.harness import console_script
from tests.helpers.tiny import make_tiny_target, save_tiny_target

POSITIONS = 96
TOO_LONG = "Speculative decoding drafts tokens and the target verifies them. " * 12  # > 96 tokens
# tokens per prompt, tree of --chain-steps 2 (3 tokens): a prompt of more than 96 - 4 - 3 = 89 cannot fit
CORPUS_LONG = "The quick brown fox jumps over the lazy dog. What is your favourite book? 1, 2, 3, 4, 5."
COMMON = ["--max-new-tokens", "4", "--chain-steps", "2", "--device", "cpu"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("by-context")
    tiny = make_tiny_target("llama", num_layers=2)
    tiny.model.config.max_position_embeddings = POSITIONS
    target_dir = save_tiny_target(tiny, root / "target")
    loaded = load_target(target_dir, dtype="float32", device="cpu")
    contract = build_contract(loaded, (1, 2))
    draft_dir = save_draft(init_draft(loaded, contract), contract, root / "draft")

    def jsonl(name: str, prompts: list[str]) -> Path:
        path = root / name
        path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
        return path

    return {
        "root": root,
        "target": target_dir,
        "draft": draft_dir,
        "short": jsonl("short.jsonl", ["Hi!", "Hello! How are you?"]),
        "longer": jsonl("longer.jsonl", [CORPUS_LONG, CORPUS_LONG + " And more numbers."]),
        "too_long": jsonl("too_long.jsonl", ["Hi!", TOO_LONG, "Hello!"]),
    }


class Runs:
    """The console-script runs of this module, all started at once (each is mostly imports: run side by
    side they take about the time of the slowest); `get` waits for one."""

    def __init__(self, files: dict[str, Path], commands: dict[str, list[str]]) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "EAGLEWIRE_HOME": str(files["root"] / "home")}
        self._started = {
            name: subprocess.Popen(
                [console_script(), *argv],
                cwd=files["root"],
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )  # fmt: skip
            for name, argv in commands.items()
        }
        self._done: dict[str, subprocess.CompletedProcess[str]] = {}

    def get(self, name: str) -> subprocess.CompletedProcess[str]:
        if name not in self._done:
            proc = self._started[name]
            stdout, stderr = proc.communicate(timeout=180)
            self._done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
        return self._done[name]

    def close(self) -> None:
        for name in self._started:
            self.get(name)


@pytest.fixture(scope="module")
def runs(files: dict[str, Path]) -> Iterator[Runs]:
    target, draft, root = str(files["target"]), str(files["draft"]), files["root"]
    runs = Runs(files, {
        "two_sets": ["bench", "--target", target, "--draft", draft, "--prompts", f"{files['short']},{files['longer']}",
                     "--methods", "plain,eagle-chain", "--warmup", "0", "--repeats", "1", "--no-served-prediction",
                     "--out", str(root / "two-sets"), "--json", *COMMON],
        "bad_set": ["bench", "--target", str(root / "no-such-target"), "--prompts", f"{files['short']},no-such-set",
                    *COMMON],
        "bench_too_long": ["bench", "--target", target, "--draft", draft, "--prompts", str(files["too_long"]),
                           "--methods", "plain,eagle-chain", "--out", str(root / "refused"), *COMMON],
        "generate_too_long": ["generate", "--target", target, "--draft", draft, "--prompts-file",
                              str(files["too_long"]), "--num-steps", "2", "--topk", "1", "--num-draft-tokens", "3",
                              "--max-new-tokens", "4", "--device", "cpu"],
    })  # fmt: skip
    yield runs
    runs.close()


def _prompt_tokens(files: dict[str, Path], name: str) -> list[int]:
    """Each prompt's tokens as the bench encodes it (the saved tokenizer, the chat template)."""
    tokenizer = load_tokenizer(files["target"])
    return [len(encode_prompt(tokenizer, p)) for p in load_prompt_set(files[name]).prompts]


def test_several_sets_in_one_run_a_row_per_set_and_method(files: dict[str, Path], runs: Runs) -> None:
    out = files["root"] / "two-sets"
    done = runs.get("two_sets")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["prompt_sets"] == [str(files["short"]), str(files["longer"])]
    rows = {(r["prompt_set"], r["method"]): r for r in report["by_context"]}
    assert set(rows) == {(s, m) for s in report["prompt_sets"] for m in ("plain", "eagle-chain")}
    for name in ("short", "longer"):
        lengths = _prompt_tokens(files, name)
        for method in ("plain", "eagle-chain"):
            row = rows[str(files[name]), method]
            assert row["num_prompts"] == 2 and row["prompt_tokens_max"] == max(lengths)
            assert row["prompt_tokens_median"] == statistics.median(lengths)
            assert row["prompt_tokens_mean"] == pytest.approx(statistics.fmean(lengths))
            assert row["tokens_per_s"] > 0
        chain = rows[str(files[name]), "eagle-chain"]
        assert chain["tau"] >= 1.0 and len(chain["per_position_acceptance"]) == 2
        assert chain["speedup_vs_plain"] > 0 and rows[str(files[name]), "plain"]["tau"] is None
    assert (
        rows[str(files["longer"]), "plain"]["prompt_tokens_mean"]
        > rows[str(files["short"]), "plain"]["prompt_tokens_mean"]
    )
    # each set's whole report is kept, and the table and plot are written
    assert set(report["sets"]) == set(report["prompt_sets"])
    assert report["sets"][str(files["short"])]["methods"]["eagle-chain"]["greedy_matches_reference"] is True
    assert "| prompt set | prompts | prompt tokens median / mean |" in (out / "bench.md").read_text()
    assert (out / "tau_by_context.png").is_file() and (out / "bench.json").is_file()


def test_a_bad_set_among_several_is_named_before_the_model_loads(runs: Runs) -> None:
    """The target does not even exist: the sets are read (and refused) before it would be loaded."""
    done = runs.get("bad_set")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--prompts: set 2 of 2, 'no-such-set'" in done.stderr and "no-such-target" not in done.stderr


def test_bench_refuses_a_prompt_too_long_for_the_target_before_decoding(
    files: dict[str, Path], runs: Runs
) -> None:
    out = files["root"] / "refused"
    done = runs.get("bench_too_long")
    assert done.returncode == 2, done.stdout + done.stderr
    n = _prompt_tokens(files, "too_long")[1]
    assert n > POSITIONS
    assert (
        f"prompt set {files['too_long']}: prompt too_long.jsonl:2 does not fit the target's context: {n} prompt "
        f"tokens + max_new_tokens=4 + a draft tree of 3 tokens (num_draft_tokens) = {n + 7} positions, but the "
        f"target has max_position_embeddings={POSITIONS}; at most 89 prompt tokens fit" in done.stderr
    )
    assert "fix: shorten or drop the prompt, lower --max-new-tokens" in done.stderr
    assert not out.exists()  # nothing ran, nothing was written


def test_generate_refuses_a_prompt_too_long_for_the_target_before_decoding(
    files: dict[str, Path], runs: Runs
) -> None:
    done = runs.get("generate_too_long")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"--prompts-file {files['too_long']}: prompt 1 does not fit the target's context" in done.stderr
    assert f"max_position_embeddings={POSITIONS}" in done.stderr
    assert "--- prompt" not in done.stdout  # not even the prompts that fit were decoded


def test_the_check_runs_before_the_weights_load(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process: the tokenizer and config of the directory are enough to refuse the set."""

    def no_weights(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the weights were loaded before the prompts were checked")

    monkeypatch.setattr("eaglewire.target.loading.load_target", no_weights)
    r = CliRunner().invoke(app, ["bench", "--target", str(files["target"]), "--prompts", str(files["too_long"]),
                                 "--methods", "plain", "--out", str(files["root"] / "in-process"), *COMMON])  # fmt: skip
    assert isinstance(r.exception, ConfigError), r.output
    assert "prompt too_long.jsonl:2 does not fit" in str(r.exception) and "(plain decoding" in str(
        r.exception
    )
