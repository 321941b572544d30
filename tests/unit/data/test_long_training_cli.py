"""`eaglewire data build` (the installed console script) refuses a joined conversation made from a
held-out chitchat conversation, naming its id, and builds one made from train conversations only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from eaglewire.data.formats import Conversation, Message
from eaglewire.data.long_training import joined_record_id
from tests.helpers.tiny import tiny_tokenizer

TRAIN_SOURCE = "chitchat:a07edb12-6b91-4138-b11e-02421888d699"  # a train-split chitchat conversation
EVAL_SOURCE = "chitchat:cdf96a2c-1ba5-4375-a65e-917b151ce04e"  # a held-out one

MESSAGES = (
    Message("user", "Hi there, how was the game?"),
    Message("assistant", "Great, we won!"),
    Message("user", "New topic. Any plans for the weekend?"),
    Message("assistant", "A long walk by the sea."),
)


def _jsonl(path: Path, sources: list[str]) -> tuple[Path, str]:
    record_id = joined_record_id(sources)
    path.write_text(json.dumps(Conversation(record_id, MESSAGES).to_json()) + "\n", encoding="utf-8")
    return path, record_id


def test_data_build_refuses_a_joined_record_with_a_held_out_source(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "eaglewire"
    assert exe.exists(), f"the console script {exe} is not installed (pip install -e .)"
    tiny_tokenizer().save_pretrained(tmp_path / "target")
    refused, refused_id = _jsonl(tmp_path / "refused.jsonl", [TRAIN_SOURCE, EVAL_SOURCE])
    built, _ = _jsonl(tmp_path / "built.jsonl", [TRAIN_SOURCE, TRAIN_SOURCE.replace("a07", "a08")])

    def build(path: Path) -> subprocess.Popen[str]:
        args = ["data", "build", "--target", str(tmp_path / "target"), "--input", str(path), "--no-progress"]
        return subprocess.Popen(
            [str(exe), *args, "--out", str(tmp_path / path.stem)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    runs = {path.stem: build(path) for path in (refused, built)}  # both at once
    out = {name: (p.wait(timeout=120), *p.communicate()) for name, p in runs.items()}
    rc, _, stderr = out["refused"]
    assert rc == 2, stderr
    assert refused_id in stderr and f"made from held-out {EVAL_SOURCE!r}" in stderr
    assert not (tmp_path / "refused").exists()
    rc, stdout, stderr = out["built"]
    assert rc == 0, stderr
    assert (tmp_path / "built" / "index.json").exists()
