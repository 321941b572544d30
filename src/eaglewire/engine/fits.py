"""Whether a request fits the target's context: the one rule every decoding entry point applies.

A request of P prompt tokens and up to M new tokens, verified with draft trees of N nodes
(`num_draft_tokens`, the root included; 0 for plain decoding), needs

    P + M + N <= the target's positions

where the target's positions are its `max_position_embeddings`, or the runner's `max_seq_len`
(its KV cache) when that is smaller. A round's tree starts at the root, at most at position
P + M - 2 (the prompt's last token is the first root), so the rule leaves a position to spare.

Who applies it (`ContextFit`):

* `SpeculativeDecoder.generate` per call (O(1): the fit is built once per decoder);
* `BatchEngine.submit` per request;
* the server's room per request (`serve.loading.ServedModel.max_new_tokens`: HTTP 400 there);
* every prompt of a set before any work (`check_all`): `eaglewire bench` through
  `bench.harness.Workload.max_seq_len`, which also sizes the runner; `eaglewire generate` up front.

Pure: no torch, so a command can check before it loads anything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eaglewire.errors import ConfigError

POSITIONS_KEY = "max_position_embeddings"


def model_positions(config: Any) -> int | None:
    """The target's `max_position_embeddings` from its HF config (object or config.json dict);
    None when the config has none (then only a runner's capacity bounds a request)."""
    value = config.get(POSITIONS_KEY) if isinstance(config, Mapping) else getattr(config, POSITIONS_KEY, None)
    if value is None and not isinstance(config, Mapping):  # multimodal configs nest the text model's
        text = getattr(config, "text_config", None)
        value = getattr(text, POSITIONS_KEY, None) if text is not None else None
    return int(value) if isinstance(value, int) and value > 0 else None


@dataclass(frozen=True)
class ContextFit:
    """The positions a request may use: `limit` (None: unknown, nothing is refused), of which
    `tree_tokens` stay free for one draft tree."""

    limit: int | None
    tree_tokens: int  # num_draft_tokens of the spec; 0 for plain decoding
    runner_bound: bool  # True: the limit is the runner's max_seq_len, smaller than the model's positions
    positions: int | None  # the model's max_position_embeddings (None: its config has none)

    @classmethod
    def of(cls, *, positions: int | None, capacity: int | None, tree_tokens: int) -> ContextFit:
        """positions: the model's max_position_embeddings; capacity: the runner's max_seq_len (None:
        no runner yet, e.g. checking a prompt set before loading weights); tree_tokens: as the field."""
        if tree_tokens < 0:
            raise ConfigError(f"tree_tokens: expected >= 0, got {tree_tokens}")
        runner_bound = capacity is not None and (positions is None or capacity < positions)
        return cls(
            limit=capacity if runner_bound else positions,
            tree_tokens=tree_tokens,
            runner_bound=runner_bound,
            positions=positions,
        )

    @property
    def budget(self) -> int | None:
        """Prompt tokens + new tokens a request may have at most (None: no known limit)."""
        return None if self.limit is None else self.limit - self.tree_tokens

    def room(self, prompt_tokens: int) -> int | None:
        """New tokens that fit after a prompt of `prompt_tokens` (< 1: none do; None: no known limit)."""
        return None if self.limit is None else self.limit - self.tree_tokens - prompt_tokens

    def fits(self, prompt_tokens: int, max_new_tokens: int) -> bool:
        return self.limit is None or prompt_tokens + max_new_tokens + self.tree_tokens <= self.limit

    def check(self, prompt_tokens: int, max_new_tokens: int, *, prompt: str = "the prompt") -> None:
        """ConfigError naming the lengths when the request does not fit (`prompt`: how to name it)."""
        if self.limit is not None and prompt_tokens + max_new_tokens + self.tree_tokens > self.limit:
            raise ConfigError(self.describe(prompt, prompt_tokens, max_new_tokens), fix=self.fix())

    def check_all(self, prompts: Sequence[tuple[str, int]], max_new_tokens: int, *, where: str) -> None:
        """Every (prompt id, prompt tokens) of a set, before any of them is decoded: a ConfigError
        naming the first that does not fit (and how many others do not), `where` naming the set."""
        if self.limit is None:
            return
        bad = [(pid, n) for pid, n in prompts if not self.fits(n, max_new_tokens)]
        if not bad:
            return
        pid, n = bad[0]
        message = f"{where}: " + self.describe(f"prompt {pid}", n, max_new_tokens)
        if len(bad) > 1:
            longest = max(bad, key=lambda b: b[1])
            message += (
                f"; {len(bad)} of its {len(prompts)} prompts do not fit (the longest: prompt {longest[0]}, "
                f"{longest[1]} tokens)"
            )
        raise ConfigError(message + "; nothing was decoded", fix=self.fix())

    def describe(self, prompt: str, prompt_tokens: int, max_new_tokens: int) -> str:
        assert self.limit is not None
        need = prompt_tokens + max_new_tokens + self.tree_tokens
        tree = (
            f" + a draft tree of {self.tree_tokens} tokens (num_draft_tokens)"
            if self.tree_tokens
            else " (plain decoding: no draft tree)"
        )
        if self.runner_bound:
            has = f"the runner holds max_seq_len={self.limit}"
            if self.positions is not None:
                has += f" (the target's max_position_embeddings={self.positions})"
        else:
            has = f"the target has max_position_embeddings={self.limit}"
        most = self.limit - self.tree_tokens - max_new_tokens
        after = (
            f"at most {most} prompt tokens fit with max_new_tokens={max_new_tokens}"
            if most >= 1
            else f"max_new_tokens={max_new_tokens} and the tree leave no room for a prompt"
        )
        return (
            f"{prompt} does not fit the target's context: {prompt_tokens} prompt tokens + max_new_tokens="
            f"{max_new_tokens}{tree} = {need} positions, but {has}; {after}"
        )

    def fix(self) -> str:
        up_to = "" if self.positions is None else f" up to the target's {self.positions}"
        fix = (
            "shorten or drop the prompt, lower --max-new-tokens"
            + (", use a smaller draft tree (--num-draft-tokens, --chain-steps)" if self.tree_tokens else "")
            + (
                f", or build the runner with a larger max_seq_len{up_to} (`eaglewire serve --context-length`)"
                if self.runner_bound
                else "; the target has no more positions"
            )
        )
        return fix
