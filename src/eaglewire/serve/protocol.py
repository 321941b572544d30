"""OpenAI request bodies -> one checked `GenerationRequest`; OpenAI-style error bodies.

Pure Python (no torch, no pydantic): every field is checked here, and a bad one becomes a
`RequestError` (HTTP 400) whose message names the field, what it expects and what it got:

    {"error": {"message": "max_tokens: expected an integer >= 1 or null, got \\"ten\\" (a string)",
               "type": "invalid_request_error", "param": "max_tokens", "code": "invalid_type"}}

What is accepted (both endpoints): `model` (any name: there is one model; responses carry ours),
`max_tokens`, `temperature` (default 1.0, as OpenAI's), `top_p`, `stop` (a string or a list),
`seed` (default: a fresh random seed per request), `stream`, `stream_options.include_usage`,
`return_token_ids` (vLLM's and SGLang's extension: the prompt's and the completion's token ids) and
`return_spec_tokens_details` (SGLang's flag; the details are returned whenever a draft is loaded).
`/v1/chat/completions` takes `messages` (system / user / assistant turns, content a string or text
parts), `max_completion_tokens`, and SGLang's `return_prompt_token_ids` and `return_meta_info` (not
with stream, as SGLang); `/v1/completions` takes `prompt` (text, or token ids; one prompt per request). Fields that ask for something this server does not do (n > 1, logprobs, penalties,
tools, echo, ...) are refused by name with their only accepted value; a field no OpenAI-compatible
server defines is refused as unrecognized (the OpenAI API's own answer), never silently ignored.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

MAX_SEED = 2**63 - 2  # torch.Generator takes a signed 64-bit seed; the draft's generator uses seed + 1

Endpoint = Literal["chat", "completion"]
ROLES = ("system", "user", "assistant")


class RequestError(Exception):
    """An HTTP error answer with an OpenAI-style body. 400 by default (the request is at fault)."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int = 400,
        type: str = "invalid_request_error",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status = status
        self.type = type
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class GenerationRequest:
    """One checked request. Exactly one of `messages` (chat) / `prompt` (completions) is set."""

    endpoint: Endpoint
    messages: tuple[dict[str, str], ...] | None  # chat turns, content flattened to text
    prompt: str | tuple[int, ...] | None  # completions: text, or token ids as given
    max_tokens: int | None  # None: completions 16 (OpenAI's default), chat: what the context holds
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    seed: int | None  # None: a random seed is drawn per request
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage
    return_token_ids: bool
    return_prompt_token_ids: bool = False  # SGLang (chat): the prompt's ids on the choice
    return_meta_info: bool = False  # SGLang (chat, not streamed): the choice's meta_info


def parse_json_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a RequestError naming what is wrong with it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(f"request body: invalid UTF-8 at byte {e.start}", code="invalid_json") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as e:
        raise RequestError(
            f"request body: invalid JSON ({e.msg} at line {e.lineno} column {e.colno})", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise RequestError(f"request body: expected a JSON object, got {_kind(body)}", code="invalid_json")
    return body


# Fields other servers define that ask for something we do not do: accepted only at these values.
_NO_OP: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "top_logprobs": (None, 0),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "echo": (None, False),
    "suffix": (None, ""),
    "response_format": (None, {"type": "text"}),
}
_IGNORED = ("user", "parallel_tool_calls", "return_spec_tokens_details", "model")
_COMMON = (
    "max_tokens", "temperature", "top_p", "stop", "seed", "stream", "stream_options", "return_token_ids",
)  # fmt: skip
_FIELDS: dict[Endpoint, frozenset[str]] = {
    "chat": frozenset(
        (
            *_COMMON,
            *_IGNORED,
            "messages",
            "max_completion_tokens",
            "logprobs",
            "n",
            "presence_penalty",
            "frequency_penalty",
            "logit_bias",
            "top_logprobs",
            "tools",
            "tool_choice",
            "functions",
            "response_format",
            "return_prompt_token_ids",
            "return_meta_info",
        )
    ),  # fmt: skip
    "completion": frozenset(
        (
            *_COMMON,
            *_IGNORED,
            "prompt",
            "logprobs",
            "n",
            "best_of",
            "presence_penalty",
            "frequency_penalty",
            "logit_bias",
            "echo",
            "suffix",
        )
    ),  # fmt: skip
}


def parse_request(endpoint: Endpoint, body: Mapping[str, Any]) -> GenerationRequest:
    """Check every field of a chat or completions body (see the module doc)."""
    unknown = sorted(set(body) - _FIELDS[endpoint])
    if unknown:
        path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
        raise RequestError(
            f"unrecognized request argument(s) {', '.join(unknown)} for {path}; this server reads "
            f"{', '.join(sorted(_FIELDS[endpoint]))}",
            param=unknown[0],
            code="unknown_parameter",
        )
    for name, allowed in _NO_OP.items():
        if name in body and not any(_same(body[name], a) for a in allowed):
            shown = " or ".join(json.dumps(a) for a in allowed)
            raise RequestError(
                f"{name}: this server supports only {shown}, got {json.dumps(body[name])}",
                param=name,
                code="unsupported_value",
            )
    if not isinstance(body.get("model", ""), str | None):
        raise _bad("model", "a string or null", body["model"])
    logprobs_off = (None, False) if endpoint == "chat" else (None, 0)
    if "logprobs" in body and not any(_same(body["logprobs"], a) for a in logprobs_off):
        raise RequestError(
            f"logprobs: this server returns no log-probabilities, got {json.dumps(body['logprobs'])}",
            param="logprobs",
            code="unsupported_value",
        )
    max_tokens = _optional_int(body, "max_tokens", 1)
    if endpoint == "chat":
        completion_max = _optional_int(body, "max_completion_tokens", 1)
        if max_tokens is not None and completion_max is not None and max_tokens != completion_max:
            raise RequestError(
                f"max_tokens={max_tokens} and max_completion_tokens={completion_max} disagree",
                param="max_completion_tokens",
                code="invalid_value",
            )
        max_tokens = completion_max if completion_max is not None else max_tokens
    stream = _bool(body, "stream", False)
    meta_info = _bool(body, "return_meta_info", False)
    if meta_info and stream:
        raise RequestError(
            "return_meta_info is not supported with streaming (as in SGLang): set stream=false",
            param="return_meta_info",
            code="invalid_value",
        )
    return GenerationRequest(
        endpoint=endpoint,
        messages=_messages(body) if endpoint == "chat" else None,
        prompt=_prompt(body) if endpoint == "completion" else None,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, low=0.0),
        top_p=_top_p(body),
        stop=_stop(body),
        seed=_optional_int(body, "seed", 0, MAX_SEED),
        stream=stream,
        include_usage=_include_usage(body, stream),
        return_token_ids=_bool(body, "return_token_ids", False),
        return_prompt_token_ids=_bool(body, "return_prompt_token_ids", False),
        return_meta_info=meta_info,
    )


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return (text if len(text) <= 60 else text[:57] + "...") + f" ({_kind(value)})"


def _same(value: Any, allowed: Any) -> bool:
    """JSON equality that keeps booleans apart from numbers (false is not 0)."""
    if isinstance(value, bool) != isinstance(allowed, bool):
        return False
    return bool(value == allowed)


def _bad(name: str, expected: str, value: Any, code: str = "invalid_type") -> RequestError:
    return RequestError(f"{name}: expected {expected}, got {_shown(value)}", param=name, code=code)


def _optional_int(body: Mapping[str, Any], name: str, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    bound = f">= {low}" if high is None else f"in [{low}, {high}]"
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 64.0 is the integer 64 in JSON
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, f"an integer {bound} or null", value)
    if value < low or (high is not None and value > high):
        raise _bad(name, f"an integer {bound}", value, code="invalid_value")
    return value


def _number(body: Mapping[str, Any], name: str, default: float, *, low: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(name, f"a number >= {low} or null", value)
    if value < low:
        raise _bad(name, f"a number >= {low}", value, code="invalid_value")
    return float(value)


def _top_p(body: Mapping[str, Any]) -> float:
    value = _number(body, "top_p", 1.0, low=0.0)
    if not 0.0 < value <= 1.0:
        raise _bad("top_p", "a number in (0, 1]", body.get("top_p"), code="invalid_value")
    return value


def _bool(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(name, "true, false or null", value)
    return value


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise _bad("stop", "a string, an array of strings, or null", value)
    if any(s == "" for s in items):
        raise RequestError(
            "stop: an empty stop string matches before the first token", param="stop", code="invalid_value"
        )
    return tuple(dict.fromkeys(items))  # duplicates change nothing


def _include_usage(body: Mapping[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise _bad("stream_options", 'an object such as {"include_usage": true}, or null', options)
    unknown = sorted(set(options) - {"include_usage", "continuous_usage_stats"})
    if unknown:
        raise RequestError(
            f"stream_options: unrecognized key(s) {', '.join(unknown)} (this server reads include_usage)",
            param="stream_options",
            code="unknown_parameter",
        )
    if options.get("continuous_usage_stats"):
        raise RequestError(
            "stream_options.continuous_usage_stats: this server sends the usage once, in the last chunk",
            param="stream_options",
            code="unsupported_value",
        )
    if not stream:
        raise RequestError(
            "stream_options: only allowed with stream=true", param="stream_options", code="invalid_value"
        )
    return _bool(options, "include_usage", False)


def _messages(body: Mapping[str, Any]) -> tuple[dict[str, str], ...]:
    value = body.get("messages")
    if not isinstance(value, list) or not value:
        raise _bad("messages", "a non-empty array of {role, content} objects", value)
    out = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _bad(where, "a {role, content} object", message)
        unknown = sorted(set(message) - {"role", "content", "name"})
        if unknown:
            raise RequestError(
                f"{where}: unrecognized key(s) {', '.join(unknown)} (this server reads role and content)",
                param=where,
                code="unknown_parameter",
            )
        role = message.get("role")
        if role not in ROLES:
            raise _bad(f"{where}.role", f"one of {', '.join(ROLES)}", role, code="invalid_value")
        out.append({"role": str(role), "content": _content(message.get("content"), f"{where}.content")})
    return tuple(out)


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for j, part in enumerate(value):
            if not (
                isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
            ):
                raise _bad(f"{where}[{j}]", 'a text part {"type": "text", "text": "..."}', part)
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(where, "a string or an array of text parts", value)


def _prompt(body: Mapping[str, Any]) -> str | tuple[int, ...]:
    value = body.get("prompt")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]  # a batch of one
    if isinstance(value, str):
        return value
    if (
        isinstance(value, list)
        and value
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    ):
        if any(t < 0 for t in value):
            raise _bad("prompt", "token ids >= 0", value, code="invalid_value")
        return tuple(value)
    if isinstance(value, list) and len(value) > 1 and all(isinstance(p, str | list) for p in value):
        raise RequestError(
            f"prompt: one prompt per request (batch 1), got a batch of {len(value)}",
            param="prompt",
            code="unsupported_value",
        )
    raise _bad("prompt", "a string, or a non-empty array of token ids", value)
