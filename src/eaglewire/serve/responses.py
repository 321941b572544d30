"""Response bodies and stream chunks in the OpenAI shapes, with SGLang's and vLLM's extensions.

- `finish_reason`: "stop" (end of sequence, or a stop string), "length" (max_tokens or the context).
  `matched_stop` (SGLang's name: sglang 0.5.23 `srt/entrypoints/openai/protocol.py` line 511 on
  `CompletionResponseChoice`, line 1316 on the chat choice) says which: the eos token id, or the stop string.
- `sglext.spec_tokens_details` (SGLang 0.5.23 `SglExt`, protocol.py lines 470-481; response-level
  `sglext` on `CompletionResponse` line 536 and `ChatCompletionResponse` line 1344): the speculative statistics of
  this request (`spec_stats.spec_tokens_details`), whenever a draft is loaded. Streams carry them in a
  chunk of their own with `choices: []` after the last choice chunk, as SGLang's stream does
  (`serving_completions.py` lines 444-474, `serving_chat.py` lines 2703-2729), then the usage chunk
  when `stream_options.include_usage` asked for it.
- `return_token_ids` (vLLM 0.33.0 `CompletionRequest.return_token_ids`, completion/protocol.py line
  172): `token_ids` on the choice (per chunk when streaming) and `prompt_token_ids` (chat: on the
  response, completions: on the choice; in the first chunk when streaming). A chat choice also
  carries SGLang's names for the same ids, `prompt_token_ids` and `response_token_ids` (sglang 0.5.23
  protocol.py lines 1318-1319, filled by serving_chat.py lines 2975-2983; `prompt_token_ids` alone
  with `return_prompt_token_ids`).
- `return_meta_info` (SGLang, chat, not streamed; serving_chat.py line 2985): the choice's
  `meta_info` as SGLang's `TokenizerManager` builds it (tokenizer_manager.py lines 2507-2559: id,
  finish_reason as `{"type": "stop", "matched": ...}` / `{"type": "length", "length": n}`
  (schedule_batch.py lines 284-341), prompt_tokens, completion_tokens, cached_tokens) with the
  spec_* keys `_calculate_spec_decoding_metrics` adds (lines 3162-3200): SGLang's legacy place for them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eaglewire.serve.protocol import Endpoint
from eaglewire.serve.spec_stats import spec_tokens_details

if TYPE_CHECKING:
    from eaglewire.engine.api import GenerationResult

# The spec keys SGLang 0.5.23 writes into meta_info (tokenizer_manager.py lines 3164-3200)
SGLANG_META_SPEC_KEYS = (
    "spec_accept_rate",
    "spec_accept_length",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_verify_ct",
    "spec_correct_drafts_histogram",
)
FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "max_new_tokens": "length", "cancelled": "abort"}


def openai_finish_reason(engine_reason: str) -> str:
    """The engine's finish reason as OpenAI (and vLLM's metrics) spell it."""
    return FINISH_REASONS.get(engine_reason, engine_reason)


@dataclass
class Reply:
    """What every body and chunk of one request shares."""

    endpoint: Endpoint
    model: str
    prompt_ids: list[int]
    return_token_ids: bool
    num_draft_tokens: int | None  # None: no draft (no spec details)
    return_prompt_token_ids: bool = False
    return_meta_info: bool = False
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            prefix = "chatcmpl" if self.endpoint == "chat" else "cmpl"
            self.id = f"{prefix}-{uuid.uuid4().hex}"

    @property
    def object(self) -> str:
        return "chat.completion" if self.endpoint == "chat" else "text_completion"

    @property
    def chunk_object(self) -> str:
        return "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"

    def usage(self, result: GenerationResult) -> dict[str, int]:
        completion = len(result.token_ids)
        return {
            "prompt_tokens": len(self.prompt_ids),
            "completion_tokens": completion,
            "total_tokens": len(self.prompt_ids) + completion,
        }

    def sglext(self, result: GenerationResult) -> dict[str, Any] | None:
        if self.num_draft_tokens is None:
            return None
        details = spec_tokens_details(result.accepted_per_round, len(result.token_ids), self.num_draft_tokens)
        return {"spec_tokens_details": details}

    def body(self, result: GenerationResult, matched_stop: int | str | None) -> dict[str, Any]:
        """The whole (non-streamed) response."""
        choice: dict[str, Any] = {"index": 0}
        if self.endpoint == "chat":
            choice["message"] = {"role": "assistant", "content": result.text}
        else:
            choice["text"] = result.text
        choice |= {
            "logprobs": None,
            "finish_reason": openai_finish_reason(result.finish_reason),
            "matched_stop": matched_stop,
        }
        out: dict[str, Any] = {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(result),
        }
        if self.return_token_ids:
            choice["token_ids"] = list(result.token_ids)  # vLLM's name
            if self.endpoint == "chat":
                out["prompt_token_ids"] = list(self.prompt_ids)  # vLLM's place
                choice["response_token_ids"] = list(result.token_ids)  # SGLang's name
        if self.return_token_ids or (self.return_prompt_token_ids and self.endpoint == "chat"):
            choice["prompt_token_ids"] = list(self.prompt_ids)
        if self.return_meta_info:
            choice["meta_info"] = self.meta_info(result, matched_stop)
        ext = self.sglext(result)
        if ext is not None:
            out["sglext"] = ext
        return out

    def meta_info(self, result: GenerationResult, matched: int | str | None) -> dict[str, Any]:
        """SGLang's per-request meta_info (module doc)."""
        finish = openai_finish_reason(result.finish_reason)
        completion = len(result.token_ids)
        reason: dict[str, Any] = (
            {"type": "stop", "matched": matched}
            if finish == "stop"
            else {"type": "length", "length": completion}
            if finish == "length"
            else {"type": finish}
        )
        info: dict[str, Any] = {
            "id": self.id,
            "finish_reason": reason,
            "prompt_tokens": len(self.prompt_ids),
            "completion_tokens": completion,
            "cached_tokens": 0,
        }
        ext = self.sglext(result)
        if ext is not None:
            info |= {k: v for k, v in ext["spec_tokens_details"].items() if k in SGLANG_META_SPEC_KEYS}
        return info

    def chunk(
        self,
        text: str,
        *,
        token_ids: Sequence[int] = (),
        finish_reason: str | None = None,
        matched_stop: int | str | None = None,
        first: bool = False,
    ) -> dict[str, Any]:
        """One stream chunk with one choice (`first`: the chat role, the prompt's ids when asked)."""
        choice: dict[str, Any] = {"index": 0}
        if self.endpoint == "chat":
            choice["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
        else:
            choice["text"] = text
        choice |= {"logprobs": None, "finish_reason": finish_reason}
        if finish_reason is not None:
            choice["matched_stop"] = matched_stop
        out: dict[str, Any] = {**self._chunk_head(), "choices": [choice]}
        if self.return_token_ids:
            choice["token_ids"] = list(token_ids)
            if first:
                if self.endpoint == "chat":
                    out["prompt_token_ids"] = list(self.prompt_ids)
                else:
                    choice["prompt_token_ids"] = list(self.prompt_ids)
        return out

    def sglext_chunk(self, result: GenerationResult) -> dict[str, Any] | None:
        ext = self.sglext(result)
        return None if ext is None else {**self._chunk_head(), "choices": [], "sglext": ext}

    def usage_chunk(self, result: GenerationResult) -> dict[str, Any]:
        return {**self._chunk_head(), "choices": [], "usage": self.usage(result)}

    def _chunk_head(self) -> dict[str, Any]:
        return {"id": self.id, "object": self.chunk_object, "created": self.created, "model": self.model}


def matched_stop(
    result: GenerationResult, stops: Sequence[str], eos_token_ids: frozenset[int], full_text: str | None
) -> int | str | None:
    """What ended the generation (SGLang's `matched_stop`): the eos id, the first stop string in the
    text (`full_text`: the generated tokens decoded, before the cut), or None (length)."""
    if result.finish_reason == "eos" and result.token_ids and result.token_ids[-1] in eos_token_ids:
        return int(result.token_ids[-1])
    if result.finish_reason == "stop_string" and full_text is not None:
        found = [(full_text.find(s), s) for s in stops if s in full_text]
        return min(found)[1] if found else None
    return None
