"""Regeneration with the tiny target: multi-turn replay, and kill -9 + rerun = an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eaglewire.data.formats import Conversation, Message, read_conversations
from eaglewire.data.generation import SamplingConfig, pick_generate_fn
from eaglewire.data.regenerate import regenerate, scan_output
from eaglewire.errors import ConfigError, DataFormatError
from eaglewire.target.loading import load_target
from tests.helpers.tiny import make_tiny_target, save_tiny_target

EAGLEWIRE = str(Path(sys.executable).with_name("eaglewire"))


def test_multi_turn_replay_answers_every_user_turn(tmp_path: Path) -> None:
    target = make_tiny_target("llama", num_layers=2)
    convs = [
        Conversation(
            "two-turns",
            (
                Message("system", "be brief"),
                Message("user", "Hello! How are you?"),
                Message("assistant", "ORIGINAL ANSWER ONE"),
                Message("user", "What is your favourite book?"),
                Message("assistant", "ORIGINAL ANSWER TWO"),
            ),
        ),
        Conversation("prompt-only", (Message("user", "def add(a, b):"),)),
    ]
    seen_prompts: list[list[int]] = []
    real = pick_generate_fn()

    def recording(t, prompts, *args):  # type: ignore[no-untyped-def]
        seen_prompts.extend(prompts)
        return real(t, prompts, *args)

    out = tmp_path / "out.jsonl"
    cfg = SamplingConfig(max_new_tokens=5, temperature=0.0, top_p=1.0, seed=0, batch_size=2)
    stats = regenerate(target, convs, out, cfg, show_progress=False, generate_fn=recording)
    assert stats.written == 2 and stats.answers == 3
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["two-turns", "prompt-only"]
    roles = [m["role"] for m in rows[0]["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    answers = [m["content"] for m in rows[0]["messages"] if m["role"] == "assistant"]
    assert "ORIGINAL" not in "".join(answers)
    # the second turn's prompt holds the target's own first answer, not the original one
    tok = target.tokenizer
    second = tok.decode(seen_prompts[2])
    assert second.endswith("<|im_start|>assistant\n") and answers[0] in second and "ORIGINAL" not in second
    assert len(rows[0]["finish"]) == 2 and rows[1]["messages"][-1]["role"] == "assistant"
    # the output reads back as conversations
    back, _ = read_conversations(out, require_assistant=True)
    assert [c.record_id for c in back] == ["two-turns", "prompt-only"]
    # rerun with the same settings: nothing to do; other settings: refused
    assert regenerate(target, convs, out, cfg, show_progress=False).written == 0
    with pytest.raises(ConfigError, match="temperature: before=0.0 now=0.5"):
        regenerate(
            target,
            convs,
            out,
            SamplingConfig(max_new_tokens=5, temperature=0.5, top_p=1.0, seed=0, batch_size=2),
            show_progress=False,
        )
    with pytest.raises(DataFormatError, match="not in the input"):
        regenerate(target, convs[1:], out, cfg, show_progress=False)


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_kill9_then_rerun_gives_the_same_records(tmp_path: Path) -> None:
    target_dir = save_tiny_target(make_tiny_target("llama", num_layers=2), tmp_path / "target")
    words = [
        "hello",
        "how",
        "are",
        "you",
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "lazy",
        "dog",
        "numbers",
        "book",
    ]
    n = 20
    src = tmp_path / "in.jsonl"
    src.write_text(
        "".join(
            json.dumps({"id": f"r{i}", "prompt": " ".join(words[i % 7 : i % 7 + 4])}) + "\n" for i in range(n)
        )
    )
    settings = dict(max_new_tokens=4, temperature=0.8, top_p=0.9, seed=1, batch_size=2)
    out = tmp_path / "out.jsonl"
    cmd = [
        EAGLEWIRE,
        "data",
        "regenerate",
        "--target",
        str(target_dir),
        "--input",
        str(src),
        "--out",
        str(out),
        "--dtype",
        "float32",
        "--no-progress",
    ]
    for k, v in settings.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while _lines(out) < 3 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode() if proc.stderr else ""
    written = _lines(out)
    assert 3 <= written < n, f"the child finished or never started ({written} lines)"
    # also simulate a kill in the middle of a write: a truncated last line
    first = out.read_bytes().split(b"\n")[0]
    with open(out, "ab") as f:
        f.write(first[: len(first) // 2])

    target = load_target(target_dir, dtype="float32")
    convs, _ = read_conversations(src)
    cfg = SamplingConfig(**settings)  # type: ignore[arg-type]
    stats = regenerate(target, convs, out, cfg, show_progress=False)
    assert stats.already_done == written and stats.written == n - written
    reference = tmp_path / "reference.jsonl"
    regenerate(target, convs, reference, cfg, show_progress=False)
    assert out.read_bytes() == reference.read_bytes()  # same records, same order, none duplicated or missing
    assert sorted(scan_output(out)) == sorted(f"r{i}" for i in range(n))


def test_corrupt_middle_line_is_an_error(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    out.write_text('{"id": "a", "messages": []}\nnot json\n{"id": "b", "messages": []}\n')
    with pytest.raises(DataFormatError, match=r"o\.jsonl:2: not a regenerated record"):
        scan_output(out)


def test_time_budget_stops_between_batches_and_a_rerun_resumes(tmp_path: Path) -> None:
    target = make_tiny_target("llama", num_layers=2)
    convs = [Conversation(f"c{i}", (Message("user", f"question number {i}"),)) for i in range(4)]
    cfg = SamplingConfig(max_new_tokens=3, temperature=0.0, top_p=1.0, seed=0, batch_size=2)
    out = tmp_path / "out.jsonl"
    # a budget already spent once the first batch is written: exactly one batch, then a stop
    first = regenerate(target, convs, out, cfg, show_progress=False, max_seconds=1e-9)
    assert first.stopped_at_time_budget and first.written == 2
    rest = regenerate(target, convs, out, cfg, show_progress=False)
    assert not rest.stopped_at_time_budget and rest.written == 2 and rest.already_done == 2
    regenerate(target, convs, tmp_path / "whole.jsonl", cfg, show_progress=False)
    assert out.read_text() == (tmp_path / "whole.jsonl").read_text()


def test_cli_regenerates_opened_magpie_prompts_and_refuses_other_ones_on_a_rerun(tmp_path: Path) -> None:
    """`data regenerate --input builtin:magpie --magpie-opened-fraction`: the prompts (kept beside the
    output) start with the openings in that share; a rerun asking for another count stops, naming it."""
    from typer.testing import CliRunner

    from eaglewire.cli import app
    from eaglewire.data.magpie import MAGPIE_OPENINGS

    target_dir = save_tiny_target(make_tiny_target("llama", num_layers=2), tmp_path / "target")
    out = tmp_path / "magpie.jsonl"
    args = ["data", "regenerate", "--target", str(target_dir), "--input", "builtin:magpie", "--out", str(out)]
    args += [
        "--dtype",
        "float32",
        "--device",
        "cpu",
        "--no-progress",
        "--max-new-tokens",
        "4",
        "--batch-size",
        "8",
    ]
    res = CliRunner().invoke(app, [*args, "--magpie-prompts", "8", "--magpie-opened-fraction", "0.5"])
    assert res.exit_code == 0, res.output
    prompts, _ = read_conversations(out.with_name(out.name + ".prompts.jsonl"))
    opened = [c for c in prompts if c.messages[0].content.startswith(MAGPIE_OPENINGS)]
    assert prompts and 0 < len(opened) < len(prompts)
    again = CliRunner().invoke(app, [*args, "--magpie-prompts", "9", "--magpie-opened-fraction", "0.5"])
    assert isinstance(again.exception, ConfigError) and "num_prompts 8 -> 9" in str(again.exception)


def test_no_conversations_is_an_error_unless_allowed(tmp_path: Path) -> None:
    target = make_tiny_target("llama", num_layers=2)
    cfg = SamplingConfig(max_new_tokens=4, temperature=0.0, batch_size=2)
    out = tmp_path / "out.jsonl"
    with pytest.raises(DataFormatError, match="no conversations to regenerate") as e:
        regenerate(target, [], out, cfg, show_progress=False)
    assert "--allow-empty" in str(e.value) and not out.exists()
    stats = regenerate(target, [], out, cfg, show_progress=False, allow_empty=True)
    assert stats.written == 0 and out.read_text() == ""
