"""The real reference target (SmolLM2-135M-Instruct): masks, regeneration and Magpie prompts."""

from __future__ import annotations

from pathlib import Path

import pytest

from eaglewire.data.builtin import load_builtin
from eaglewire.data.chat_masks import resolve_chat_template, tokenize_conversation
from eaglewire.data.formats import Conversation
from eaglewire.data.generation import SamplingConfig
from eaglewire.data.magpie import generate_magpie_prompts
from eaglewire.data.regenerate import regenerate

pytestmark = pytest.mark.slow


def test_smollm2_masks_regeneration_and_magpie(smollm2, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    tok = smollm2.tokenizer
    conv = next(c for c in load_builtin("chitchat", "train") if len(c.messages) >= 4)
    r = tokenize_conversation(tok, conv, resolve_chat_template(tok))
    ids, mask = r.input_ids.tolist(), r.loss_mask.tolist()
    segments, cur = [], []
    for t, m in zip(ids, mask, strict=True):
        if m:
            cur.append(t)
        elif cur:
            segments.append(tok.decode(cur))
            cur = []
    assert segments == [m.content + "<|im_end|>" for m in conv.messages if m.role == "assistant"]

    cfg = SamplingConfig(max_new_tokens=8, temperature=0.0, top_p=1.0, seed=0, batch_size=2)
    out = tmp_path / "regen.jsonl"
    first_turns = Conversation(conv.record_id, conv.messages[:3])  # user, assistant, user: two answers
    stats = regenerate(smollm2, [first_turns], out, cfg, show_progress=False)
    assert stats.answers == 2 and stats.generated_tokens > 0

    prompts = generate_magpie_prompts(
        smollm2,
        2,
        sampling=SamplingConfig(max_new_tokens=16, temperature=1.0, top_p=1.0, seed=0, batch_size=2),
        keep_truncated=True,
        show_progress=False,
    )
    assert len(prompts) == 2 and all(len(p.messages[0].content) >= 8 for p in prompts)
