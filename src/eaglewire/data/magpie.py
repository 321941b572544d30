"""Magpie: user prompts sampled from the target itself, for users with no dataset.

The target is fed only its chat template's user-turn prefix (e.g. `<|im_start|>user\\n`, with
any default system prompt the template adds) and samples what a user would say; it stops at
its end-of-turn token. Prompts are deduplicated (case and whitespace folded) and get the id
`magpie:<sha256(text)[:16]>`, so the held-out split (see builtin.py) is fixed by the text.
Sampling is seeded per round, so the same target and settings give the same prompts.

`opened_fraction` > 0 starts that share of each round's rows with an instruction opening
(`MAGPIE_OPENINGS`, cycled): the target then completes a request of that kind, and the prompt is
the opening plus the completion. A small target left alone mostly asks for help ("Can you ...",
"I'm ..."); openings add the imperative requests of other kinds (write, rewrite, solve, extract,
play a role) that chat benchmarks ask.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path

from tqdm import tqdm

from eaglewire.data.chat_masks import resolve_chat_template, user_turn_prefix
from eaglewire.data.formats import Conversation, Message, read_conversations
from eaglewire.data.generation import GenerateFn, SamplingConfig, generate_answers, pick_generate_fn
from eaglewire.errors import ConfigError
from eaglewire.io_utils import atomic_write_text, sha256_text
from eaglewire.target.loading import LoadedTarget

log = logging.getLogger(__name__)

DEFAULT_MAGPIE_SAMPLING = SamplingConfig(max_new_tokens=96, temperature=1.0, top_p=1.0, seed=0, batch_size=32)
MIN_PROMPT_CHARS = 8
# Give up after this many rounds per batch of prompts still needed (duplicates run out eventually).
ROUNDS_PER_BATCH = 4

# Generic first words of requests, one kind after another: writing, rewriting, explaining,
# reasoning and math, code, extraction and classification, roles, comparison and opinion. Written
# here from those kinds, not taken from any evaluation set.
MAGPIE_OPENINGS: tuple[str, ...] = (
    "Write",
    "Rewrite",
    "Explain",
    "Solve",
    "Implement",
    "Extract",
    "Imagine you are",
    "Compare",
    "Compose",
    "Summarize",
    "Describe",
    "Calculate",
    "Write a Python function",
    "Identify",
    "Pretend to be",
    "Discuss",
    "Draft",
    "Edit",
    "Why",
    "Suppose",
    "Debug",
    "Classify",
    "Act as",
    "Evaluate",
)


def openings_for_round(batch_size: int, fraction: float, rnd: int, openings: tuple[str, ...]) -> list[str]:
    """Per row of round `rnd`: its opening ("" for an unopened row). The first round(fraction *
    batch_size) rows are opened, cycling through `openings` across rounds."""
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"magpie opened_fraction: expected 0..1, got {fraction}")
    opened = round(fraction * batch_size) if openings else 0
    return [openings[(rnd * opened + j) % len(openings)] if j < opened else "" for j in range(batch_size)]


def dedup_key(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower())


def magpie_id(text: str) -> str:
    return "magpie:" + hashlib.sha256(dedup_key(text).encode("utf-8")).hexdigest()[:16]


def generate_magpie_prompts(
    target: LoadedTarget,
    num_prompts: int = 1000,
    *,
    sampling: SamplingConfig = DEFAULT_MAGPIE_SAMPLING,
    chat_template: str | None = None,
    keep_truncated: bool = False,
    show_progress: bool = True,
    generate_fn: GenerateFn | None = None,
    opened_fraction: float = 0.0,
    openings: tuple[str, ...] = MAGPIE_OPENINGS,
) -> list[Conversation]:
    """Up to `num_prompts` distinct single-turn user prompts sampled from `target`.

    `keep_truncated` keeps prompts cut at `max_new_tokens` (otherwise only prompts the target
    ended itself are kept). `opened_fraction` of each round's rows start with one of `openings`
    (see the module docstring); 0 samples every row from the bare user-turn prefix.
    """
    if num_prompts < 1:
        raise ConfigError(f"num_prompts: expected >= 1, got {num_prompts}")
    if sampling.temperature <= 0:
        raise ConfigError("magpie sampling.temperature must be > 0: greedy decoding yields one prompt")
    tok = target.tokenizer
    if tok is None:
        raise ConfigError(f"target {target.path} has no tokenizer; Magpie needs its chat template")
    template = resolve_chat_template(tok, chat_template)
    prefix = user_turn_prefix(tok, template)
    openings_for_round(sampling.batch_size, opened_fraction, 0, openings)  # checks the fraction
    # the prefix and each opening in use tokenized together, as the text would be
    used = ("", *openings) if opened_fraction > 0 else ("",)
    row_ids = {o: list(tok(prefix + o, add_special_tokens=False)["input_ids"]) for o in used}
    longest = max(len(ids) for ids in row_ids.values())
    fn = generate_fn or pick_generate_fn()  # one backend (and runner) for every round
    reserve = getattr(fn, "reserve", None)
    if reserve is not None:
        reserve(sampling.batch_size, longest + sampling.max_new_tokens)
    seen: set[str] = set()
    out: list[Conversation] = []
    max_rounds = ROUNDS_PER_BATCH * (num_prompts // sampling.batch_size + 1)
    stats: dict[str, int] = {"duplicates": 0, "too_short": 0, "truncated": 0}
    bar = tqdm(total=num_prompts, desc="magpie prompts", disable=not show_progress, unit="prompt")
    for rnd in range(max_rounds):
        if len(out) >= num_prompts:
            break
        row_openings = openings_for_round(sampling.batch_size, opened_fraction, rnd, openings)
        results = generate_answers(
            target, [row_ids[o] for o in row_openings], sampling, sampling.seed + rnd, generate_fn=fn
        )
        for opening, (ids, finish) in zip(row_openings, results, strict=True):
            text = (opening + tok.decode(ids, skip_special_tokens=True)).strip()
            if finish == "length" and not keep_truncated:
                stats["truncated"] += 1
                continue
            if len(text) < MIN_PROMPT_CHARS:
                stats["too_short"] += 1
                continue
            key = dedup_key(text)
            if key in seen:
                stats["duplicates"] += 1
                continue
            seen.add(key)
            out.append(Conversation(magpie_id(text), (Message("user", text),)))
            bar.update(1)
            if len(out) >= num_prompts:
                break
    bar.close()
    log.info(
        "magpie: %d prompts (asked %d); dropped %d duplicates, %d too short, %d cut at max_new_tokens",
        len(out),
        num_prompts,
        stats["duplicates"],
        stats["too_short"],
        stats["truncated"],
    )
    if len(out) < num_prompts:
        log.warning(
            "magpie: only %d of %d distinct prompts after %d rounds", len(out), num_prompts, max_rounds
        )
    return out


def cached_magpie_prompts(
    target: LoadedTarget,
    path: Path,
    num_prompts: int,
    *,
    sampling: SamplingConfig = DEFAULT_MAGPIE_SAMPLING,
    chat_template: str | None = None,
    show_progress: bool = True,
    opened_fraction: float = 0.0,
    generate_fn: GenerateFn | None = None,
) -> list[Conversation]:
    """Magpie prompts kept in `path` (JSONL): read when present, else sampled and written atomically.

    Regeneration reruns reuse the file, so a resumed run answers exactly the same prompts. What they
    were sampled with is kept beside it (`<path>.settings.json`); a rerun asking for other prompts
    (another count, opened share, temperature, top-p, length, seed or template) is refused instead
    of answering the old ones. The batch size (and `generate_fn`'s rows) are left out: they set the
    pace, not what was asked.
    """
    path = Path(path)
    settings = {
        "num_prompts": num_prompts,
        "opened_fraction": opened_fraction,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_new_tokens": sampling.max_new_tokens,
        "seed": sampling.seed,
        "chat_template_sha256": None if chat_template is None else sha256_text(str(chat_template)),
    }
    recorded = path.with_name(path.name + ".settings.json")
    if path.exists() and recorded.exists():
        old = json.loads(recorded.read_text())
        changed = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
        if changed:
            raise ConfigError(
                f"{path}: these Magpie prompts were sampled with other settings than asked now: "
                + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changed.items()),
                fix=f"delete {path} and {recorded.name} to sample again, or rerun with the old settings",
            )
    if not path.exists():
        convs = generate_magpie_prompts(
            target,
            num_prompts,
            sampling=sampling,
            chat_template=chat_template,
            show_progress=show_progress,
            opened_fraction=opened_fraction,
            generate_fn=generate_fn,
        )
        atomic_write_text(recorded, json.dumps(settings, indent=1) + "\n")  # first: never prompts without it
        atomic_write_text(path, "".join(json.dumps(c.to_json(), ensure_ascii=False) + "\n" for c in convs))
    return read_conversations(path)[0]
