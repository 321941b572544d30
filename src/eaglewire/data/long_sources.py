"""Long material for long-context prompts (and, from the train split, long training records), read from
packages the project installs: no network, no hub, no torch.

- chitchat: consecutive chitchat conversations (file order) joined into one multi-turn conversation;
  a split's material comes from that chitchat split only.
- pysource: `.py` files of the installed `transformers` (pinned below) and their docstrings; split by
  `heldout_split('pysource:<path>')`, which holds out about 10% of the model directories whole.

Joined conversations: each chitchat conversation with both speakers, cut to end on an assistant turn
(a trailing user turn is dropped so that the next conversation's user turn follows an assistant turn);
every conversation after the first opens its first user turn with "New topic." so that the roles keep
alternating and the change of subject reads naturally.

pysource files: every `.py` file of the package except `__init__.py` (mostly lazy-import tables) and
`modular_*.py` (the sources transformers generates `modeling_*.py` from: near copies). A record's id is
`pysource:transformers/<path>`, e.g. `pysource:transformers/models/llama/modeling_llama.py`.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

from eaglewire.data.builtin import PYSOURCE_PREFIX, Split, heldout_split, load_builtin
from eaglewire.data.formats import Conversation, Message
from eaglewire.errors import ConfigError

log = logging.getLogger(__name__)

PYSOURCE_PACKAGE = "transformers"
# The version the documented prompt sets were built from (requirements/cpu.txt pins it); another
# version has other files, so the prompts differ from the documented ones.
PYSOURCE_VERSION = "5.17.0"
NEW_TOPIC = "New topic."
# Docstrings shorter than this are mostly a one-line summary or a usage example: no document.
MIN_DOCSTRING_CHARS = 300


@dataclass(frozen=True)
class JoinedConversation:
    """Consecutive chitchat conversations as one; `source_ids` are their `chitchat:<uuid>` ids, in order."""

    messages: tuple[Message, ...]
    source_ids: tuple[str, ...]

    @property
    def chars(self) -> int:
        return sum(len(m.content) for m in self.messages)


@dataclass(frozen=True)
class SourceFile:
    """One `.py` file of the pinned package; `path` is where it is installed."""

    record_id: str  # pysource:transformers/models/llama/modeling_llama.py
    path: Path

    def text(self) -> str:
        """The file's text without its leading comment block (the license header)."""
        return strip_header(self.path.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class DocSection:
    """The docstring of one class or function of a pysource file: a section of a document."""

    source_id: str  # the file's pysource id
    title: str  # 'Class', 'Class.method' or 'function'
    text: str


def chitchat_dialogues(split: Split) -> list[Conversation]:
    """The chitchat conversations of `split` that have both speakers, each ending on an assistant turn,
    in the package's file order."""
    out = []
    for conv in load_builtin("chitchat", split=split):
        messages = list(conv.messages)
        while messages and messages[-1].role != "assistant":
            messages.pop()
        if any(m.role == "user" for m in messages):
            out.append(Conversation(conv.record_id, tuple(messages)))
    return out


def join_dialogues(dialogues: list[Conversation]) -> JoinedConversation:
    """One conversation of `dialogues` in order; each after the first opens with NEW_TOPIC."""
    messages: list[Message] = []
    for i, conv in enumerate(dialogues):
        first, *rest = conv.messages
        opening = first if i == 0 else Message(first.role, f"{NEW_TOPIC} {first.content}")
        messages += [opening, *rest]
    return JoinedConversation(tuple(messages), tuple(c.record_id for c in dialogues))


def joined_conversations(split: Split, min_chars: int) -> list[JoinedConversation]:
    """The dialogues of `split` grouped in order into joined conversations of at least `min_chars`
    characters of content each (a shorter remainder at the end is left out)."""
    if min_chars < 1:
        raise ConfigError(f"min_chars: expected >= 1, got {min_chars}")
    out: list[JoinedConversation] = []
    group: list[Conversation] = []
    chars = 0
    for conv in chitchat_dialogues(split):
        group.append(conv)
        chars += sum(len(m.content) for m in conv.messages)
        if chars >= min_chars:
            out.append(join_dialogues(group))
            group, chars = [], 0
    return out


@functools.lru_cache(maxsize=1)
def pysource_root() -> Path:
    """The installed package's directory (found without importing it); warns once when its version is
    not PYSOURCE_VERSION."""
    spec = importlib.util.find_spec(PYSOURCE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"long-context material needs the package {PYSOURCE_PACKAGE!r}, which is not installed",
            fix=f"pip install {PYSOURCE_PACKAGE}=={PYSOURCE_VERSION}",
        )
    version = importlib.metadata.version(PYSOURCE_PACKAGE)
    if version != PYSOURCE_VERSION:
        log.warning(
            "%s %s is installed, the long-context prompts are documented for %s: their code and documents "
            "differ from the documented ones (lengths and splits still hold)",
            PYSOURCE_PACKAGE, version, PYSOURCE_VERSION,
        )  # fmt: skip
    return Path(next(iter(spec.submodule_search_locations)))


@functools.lru_cache(maxsize=1)
def _all_pysource_files() -> tuple[SourceFile, ...]:
    root = pysource_root()
    out = []
    for path in root.rglob("*.py"):
        if path.name == "__init__.py" or path.name.startswith("modular_") or "__pycache__" in path.parts:
            continue
        rel = path.relative_to(root.parent).as_posix()
        out.append(SourceFile(f"{PYSOURCE_PREFIX}{rel}", path))
    return tuple(sorted(out, key=lambda f: f.record_id))


def pysource_files(split: Split, name_prefix: str = "") -> list[SourceFile]:
    """The package's files in `split`, sorted by id; only those whose file name starts with
    `name_prefix` (e.g. 'modeling_') when given."""
    return [
        f
        for f in _all_pysource_files()
        if f.path.name.startswith(name_prefix) and (split == "all" or heldout_split(f.record_id) == split)
    ]


def strip_header(text: str) -> str:
    """`text` without the comment lines (and blank lines) it opens with."""
    lines = text.splitlines(keepends=True)
    start = 0
    while start < len(lines) and (not lines[start].strip() or lines[start].lstrip().startswith("#")):
        start += 1
    return "".join(lines[start:])


@functools.lru_cache(maxsize=256)
def docstring_sections(source: SourceFile) -> tuple[DocSection, ...]:
    """The docstrings of `source`'s top-level classes, their methods and its functions with at least
    MIN_DOCSTRING_CHARS characters, in file order (read with `ast`: nothing is imported)."""
    tree = ast.parse(source.path.read_text(encoding="utf-8"), filename=str(source.path))
    out = []
    for title, node in _documented_nodes(tree):
        doc = ast.get_docstring(node)
        if doc and len(doc) >= MIN_DOCSTRING_CHARS:
            out.append(DocSection(source.record_id, title, doc))
    return tuple(out)


def _documented_nodes(tree: ast.Module) -> list[tuple[str, ast.ClassDef | ast.FunctionDef]]:
    """('Class', class), ('Class.method', method) and ('function', function), in file order."""
    out: list[tuple[str, ast.ClassDef | ast.FunctionDef]] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out.append((node.name, node))
        elif isinstance(node, ast.ClassDef):
            out.append((node.name, node))
            out += [(f"{node.name}.{fn.name}", fn) for fn in node.body if isinstance(fn, ast.FunctionDef)]
    return out


def model_units(split: Split) -> list[str]:
    """Model directories of the package in `split` ('transformers/models/<model>'), sorted."""
    root = pysource_root()
    units = sorted(p.name for p in (root / "models").iterdir() if p.is_dir() and p.name != "__pycache__")
    rels = [f"{root.name}/models/{u}" for u in units]
    # a directory's split is that of any file in it
    return [r for r in rels if split == "all" or heldout_split(f"{PYSOURCE_PREFIX}{r}/__init__.py") == split]
