"""The README's promises that can rot: its Python example runs, its first lines are the two commands
(`.ci/run` calls the second), and no sentence runs past 45 words."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from eaglewire.draft.init import init_draft
from eaglewire.draft.io import save_draft
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import load_target
from tests.helpers.tiny import make_tiny_target, save_tiny_target

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text()
# The example names the reference target and the CPU quickstart's draft; the test swaps in tiny ones.
EXAMPLE_TARGET = '"smollm2"'
EXAMPLE_DRAFT = '"runs/quickstart/cpu/train/draft"'
EXAMPLE_TOKENS = "max_new_tokens=48"  # 8 here: an untrained draft accepts nothing, so each token is a round
MAX_WORDS = 45


def python_block(text: str) -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    assert len(blocks) == 1, f"expected one python block in README.md, found {len(blocks)}"
    return blocks[0]


def prose(text: str) -> str:
    """The text without fenced blocks and table rows."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("|"))


def sentences(text: str) -> list[str]:
    """Paragraphs, headings and list items are separate units; inside one, a sentence ends at . ! or ?
    followed by whitespace."""
    units = re.split(r"\n\s*\n|\n(?=\s*(?:[-*] |\d+\. |#))", prose(text))
    out = []
    for unit in units:
        out += [s for s in re.split(r"(?<=[.!?])\s+", " ".join(unit.split())) if s]
    return out


@pytest.fixture
def one_thread() -> Iterator[None]:
    """A model this small runs fastest on one thread, and far faster than on two when the cores are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_python_example_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], one_thread: None
) -> None:
    code = python_block(README)
    for name in (EXAMPLE_TARGET, EXAMPLE_DRAFT, EXAMPLE_TOKENS):
        assert name in code, f"the test swaps {name} for a tiny target's"
    assert len(code.strip().splitlines()) <= 10
    target_dir = save_tiny_target(make_tiny_target("llama"), tmp_path / "target")
    loaded = load_target(str(target_dir))  # as the example loads it, so the contract's hashes match
    contract = build_contract(loaded)
    save_draft(init_draft(loaded, contract), contract, tmp_path / "draft")
    code = (
        code.replace(EXAMPLE_TARGET, repr(str(target_dir)))
        .replace(EXAMPLE_DRAFT, repr(str(tmp_path / "draft")))
        .replace(EXAMPLE_TOKENS, "max_new_tokens=8")
    )
    exec(compile(code, "README.md", "exec"), {})  # its own assert checks speculative == plain
    out = capsys.readouterr().out
    assert "tau " in out and "acceptance per position" in out


def test_the_first_lines_are_the_two_commands() -> None:
    lines = README.splitlines()
    assert lines[2] == "```bash"
    assert lines[3].startswith("bash scripts/quickstart.sh")
    assert lines[4].startswith("bash scripts/test.sh")
    assert "exec bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_no_sentence_is_over_45_words() -> None:
    found = sentences(README)
    assert len(found) > 50, "the sentence splitter found almost nothing: it no longer reads the README"
    long = [f"{len(s.split())} words: {s}" for s in found if len(s.split()) > MAX_WORDS]
    assert not long, "split these sentences:\n" + "\n".join(long)


def test_the_splitter_skips_code_and_tables() -> None:
    text = "One two.\n\n```bash\n" + "x " * 60 + "\n```\n\n| " + "y " * 60 + "|\n\n- an item\n- another. Two."
    assert sentences(text) == ["One two.", "- an item", "- another.", "Two."]
