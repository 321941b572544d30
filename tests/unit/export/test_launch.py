"""Launch commands: one consistent set of speculative arguments, from flags, a best setting, or the default."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest

from eaglewire.errors import ConfigError
from eaglewire.export import export_draft
from eaglewire.export.launch import BEST_SETTING_FILE, DEFAULT_NUM_STEPS
from tests.unit.export.conftest import MakeDraft


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def script_argv(path: Path) -> list[str]:
    line = next(x for x in path.read_text().splitlines() if x.startswith("exec "))
    return shlex.split(line[len("exec ") :])[:-1]  # drop the "$@" pass-through


def test_default_chain_is_consistent(make_draft: MakeDraft, tmp_path: Path) -> None:
    result = export_draft(make_draft(), "sglang", tmp_path / "e", target_path="/models/t")
    argv = script_argv(result.launch_file)
    assert os.access(result.launch_file, os.X_OK)
    assert shlex.join(argv) == result.launch_command
    assert flag(argv, "--speculative-algorithm") == "EAGLE3"
    assert flag(argv, "--model-path") == "/models/t"
    assert flag(argv, "--speculative-draft-model-path") == str((tmp_path / "e").resolve())
    steps, topk, nodes = (
        int(flag(argv, f))
        for f in ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens")
    )
    # topk=1: num_draft_tokens = num_steps + 1
    assert (steps, topk, nodes) == (DEFAULT_NUM_STEPS, 1, DEFAULT_NUM_STEPS + 1)
    assert "no recorded best setting" in result.spec_source


def test_recorded_best_setting_is_used(make_draft: MakeDraft, tmp_path: Path) -> None:
    src = make_draft()
    (src / BEST_SETTING_FILE).write_text(
        json.dumps({"num_steps": 5, "topk": 4, "num_draft_tokens": 8, "source": "bench run 7"})
    )
    sg = export_draft(src, "sglang", tmp_path / "s")
    argv = script_argv(sg.launch_file)
    assert [
        flag(argv, f)
        for f in ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens")
    ] == ["5", "4", "8"]
    assert "bench run 7" in sg.spec_source and "bench run 7" in sg.launch_file.read_text()
    vl = export_draft(src, "vllm", tmp_path / "v")
    spec = json.loads(flag(script_argv(vl.launch_file), "--speculative-config"))
    assert spec == {"method": "eagle3", "model": str((tmp_path / "v").resolve()), "num_speculative_tokens": 5}
    cfg = json.loads((vl.out / "config.json").read_text())
    # the same number in config.json and in the launch command
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 5


def test_best_setting_file_and_flags_precedence(make_draft: MakeDraft, tmp_path: Path) -> None:
    src = make_draft()
    (src / BEST_SETTING_FILE).write_text(
        json.dumps({"num_steps": 5, "topk": 4, "num_draft_tokens": 8, "source": "in dir"})
    )
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"num_steps": 2, "topk": 1, "num_draft_tokens": 3, "source": "passed"}))
    assert export_draft(src, "sglang", tmp_path / "a", best_setting=other).spec.num_steps == 2
    flags = export_draft(src, "sglang", tmp_path / "b", best_setting=other, num_steps=6)
    assert (flags.spec.num_steps, flags.spec.topk, flags.spec.num_draft_tokens) == (6, 1, 7)
    assert flags.spec_source == "command-line flags"


def test_inconsistent_settings_are_refused(make_draft: MakeDraft, tmp_path: Path) -> None:
    src = make_draft()
    with pytest.raises(ConfigError, match="SGLang would silently run num_draft_tokens=2"):
        export_draft(src, "sglang", tmp_path / "a", num_steps=1, topk=1, num_draft_tokens=16)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"num_steps": 1, "topk": 1, "num_draft_tokens": 16}))
    with pytest.raises(ConfigError, match=r"bad.json: num_draft_tokens=16"):
        export_draft(src, "vllm", tmp_path / "b", best_setting=bad)
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({"num_steps": 3, "topk": 1, "num_draft_token": 4}))
    with pytest.raises(ConfigError, match="num_draft_token: unknown key"):
        export_draft(src, "vllm", tmp_path / "c", best_setting=typo)
    with pytest.raises(ConfigError, match="--topk=4 needs --num-draft-tokens"):
        export_draft(src, "sglang", tmp_path / "d", num_steps=3, topk=4)
    assert not any((tmp_path / n).exists() for n in "abcd")
