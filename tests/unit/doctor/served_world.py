"""A tiny world in which served acceptance says which wiring a server uses (`eaglewire doctor --served` tests).

The usual tiny target (weights at std 0.02) writes loops that any draft predicts from the token alone,
and its boundaries differ little: every miswiring then serves nearly as well as the right one. Here the
target's weights are drawn at std 0.2 (`INIT_RANGE`), so its greedy answers do not repeat and its
residual stream changes layer by layer; the draft is trained for a few seconds on the target's own
greedy answers to the very prompts the doctor sends (`PROMPTS`), three unrolled steps, until it predicts
them (step-0 accuracy 1.0). Under its wiring a chain of 3 then accepts ~2.6 drafts per round; shifted,
reordered or embedding-fed aux states accept clearly fewer, each a different number.

Real parts only: a Hugging Face model saved as safetensors, a real eaglewire draft (`save_draft`) and
real SGLang / vLLM exports written by `eaglewire.export`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from eaglewire.contract.contract import Contract
from eaglewire.draft.init import init_draft
from eaglewire.draft.io import save_draft
from eaglewire.draft.model import Eagle3Draft
from eaglewire.target.capture import capture
from eaglewire.target.identity import build_contract
from eaglewire.target.loading import LoadedTarget
from tests.helpers.tiny import CORPUS, save_tiny_target, tiny_config, tiny_tokenizer

INIT_RANGE = 0.2
NUM_LAYERS = 8
PROMPTS = CORPUS[:6]
ANSWER_TOKENS = 40
TRAIN_STEPS = 60
UNROLLED = 3
CHAIN = 3  # the served chain: --num-steps 3 --topk 1 --num-draft-tokens 4


@dataclass(frozen=True)
class ServedWorld:
    target: LoadedTarget
    contract: Contract
    draft: Eagle3Draft
    prompt_ids: list[list[int]]  # chat-templated, as a server encodes them
    answers: list[list[int]]  # the target's greedy answer to each
    target_dir: Path
    draft_dir: Path
    prompts_file: Path  # JSONL, one {"prompt": ...} per line: what --prompts sends


def chaotic_target(seed: int = 0) -> LoadedTarget:
    from transformers import AutoModelForCausalLM

    tok = tiny_tokenizer()
    torch.manual_seed(seed)
    cfg = tiny_config("llama", vocab_size=len(tok), num_layers=NUM_LAYERS)
    cfg.initializer_range = INIT_RANGE
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval().requires_grad_(False)
    return LoadedTarget(model=model, tokenizer=tok, path=Path("<tiny-llama-chaotic>"))


def chat_ids(target: LoadedTarget, text: str) -> list[int]:
    tok = target.tokenizer
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return [int(t) for t in tok(rendered, add_special_tokens=False)["input_ids"]]


@torch.no_grad()
def greedy(target: LoadedTarget, prompt: list[int], n: int) -> list[int]:
    """At most n greedy tokens with the Hugging Face model's own KV cache (to the end of sequence, as a server)."""
    out = target.model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return [int(t) for t in out[0, len(prompt) :]]


def train_on_answers(
    target: LoadedTarget, contract: Contract, prompts: list[list[int]], answers: list[list[int]]
) -> Eagle3Draft:
    """Next-token cross-entropy on the target's greedy answers, `UNROLLED` steps feeding the draft's own
    hidden back (training-time test, in miniature), until the draft predicts the answers."""
    draft = init_draft(target, contract, seed=1)
    rows = []
    for prompt, answer in zip(prompts, answers, strict=True):
        seq = torch.tensor([prompt + answer])
        states = capture(target.model, seq, aux_boundaries=contract.aux_boundaries, final=contract.final,
                         return_logits=True)  # fmt: skip
        assert states.logits is not None
        rows.append((states.aux[:, :-1], seq[:, 1:], states.logits[0].argmax(-1)[1:]))
    params = [p for name, p in draft.named_parameters() if name != "embed_tokens.weight"]
    opt = torch.optim.Adam(params, lr=1e-2)
    draft.train()
    for _ in range(TRAIN_STEPS):
        loss = torch.zeros(())
        for aux, tokens, labels in rows:
            positions = torch.arange(tokens.shape[1])[None]
            first = draft.project(aux)
            hidden = first
            for step in range(UNROLLED):
                out = draft(tokens, hidden, positions)
                loss = loss + F.cross_entropy(out.logits[0, step:], labels[step:])
                hidden = torch.cat([first[:, :1], out.hidden[:, :-1]], dim=1)  # row t gets row t-1's output
        opt.zero_grad()
        (loss / len(rows)).backward()
        opt.step()
    return draft.eval().requires_grad_(False)


def build_world(base: Path) -> ServedWorld:
    """The target, its trained draft and the prompt file under `base` (about 4 s on one core)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target = chaotic_target()
        contract = build_contract(target)
        prompt_ids = [chat_ids(target, p) for p in PROMPTS]
        answers = [greedy(target, p, ANSWER_TOKENS) for p in prompt_ids]
        draft = train_on_answers(target, contract, prompt_ids, answers)
    finally:
        torch.set_num_threads(threads)
    target_dir = save_tiny_target(target, base / "target")
    draft_dir = save_draft(draft, build_contract(target, fingerprint=True), base / "draft")
    prompts_file = base / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS), encoding="utf-8")
    return ServedWorld(target, contract, draft, prompt_ids, answers, target_dir, draft_dir, prompts_file)


def export(world: ServedWorld, fmt: str, out: Path) -> Path:
    from eaglewire.export.exporting import export_draft

    export_draft(world.draft_dir, fmt, out, target_path=str(world.target_dir))  # type: ignore[arg-type]
    return out


def edit_config(directory: Path, dotted: str, value: object) -> None:
    """Edit one key of an export's config.json by hand, as a user would ("a.b" edits a nested key)."""
    path = directory / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    *parents, key = dotted.split(".")
    holder = config
    for p in parents:
        holder = holder[p]
    holder[key] = value
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
