"""Server-sent events and the text a stream may already show.

A stream sends text as rounds are verified, yet its concatenated text must equal the non-streamed
text of the same request (the final text is cut before a stop string). So `TextDeltas` shows only
text that cannot change any more: it holds back a trailing partial UTF-8 character (decoded as
U+FFFD) and any tail that could still grow into a stop string, and it never shows text that a
longer decode rewrote (a tokenizer's clean-up can merge a space into the next token). The rest
comes in the last chunk, from the final text.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # proxies pass each event on at once
}


def sse(payload: dict[str, Any]) -> bytes:
    """One server-sent event carrying a JSON object."""
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode("utf-8") + b"\n\n"


def stop_prefix_length(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of a stop string (0: none)."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best


class TextDeltas:
    """The new text to send after each round (`push`) and at the end (`finish`)."""

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str]) -> None:
        self._decode = decode
        self._stops = tuple(stops)
        self._ids: list[int] = []
        self.sent = ""

    def push(self, new_ids: Sequence[int]) -> str:
        """Tokens a round added -> the text that may be shown now ("" when nothing is certain yet)."""
        self._ids.extend(int(t) for t in new_ids)
        if not new_ids:
            return ""
        text = self._decode(self._ids).rstrip("\ufffd")
        for stop in self._stops:  # the engine ends on a stop string; never show one
            at = text.find(stop)
            if at >= 0:
                text = text[:at]
        text = text[: len(text) - stop_prefix_length(text, self._stops)]
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta

    def finish(self, final_text: str) -> str:
        """The rest of the final (non-streamed) text."""
        if not final_text.startswith(self.sent):  # a decode that rewrote shown text: cannot be unsent
            log.warning(
                "streamed text %r is not a prefix of the final text %r: the tokenizer's decode is not "
                "prefix-stable here",
                self.sent[-40:],
                final_text[-40:],
            )
            return ""
        delta, self.sent = final_text[len(self.sent) :], final_text
        return delta
