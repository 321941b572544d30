"""Engine faults for the checks that exist to catch an engine bug (`generate --check-lossless`, the
bench's greedy check). The fault harness puts this folder on PYTHONPATH and names the fault in
EAGLEWIRE_TEST_FAULT; Python imports this module at start-up, before the command runs.

- `accept-first-draft`: greedy verification accepts the root's first child whenever the target
  rejected every draft token: the draft's token is emitted as if the target had chosen it. Exactly
  the bug a lossless check must catch: the output is no longer the target's own greedy text.
"""

from __future__ import annotations

import os

FAULT = os.environ.get("EAGLEWIRE_TEST_FAULT")


def _accept_first_draft() -> None:
    import torch

    import eaglewire.engine.runners.fast.greedy as runner_greedy
    import eaglewire.engine.verify as verify

    real = verify.greedy_paths

    def greedy_paths(
        tokens: torch.Tensor,
        ancestors: torch.Tensor,
        target_logits: torch.Tensor,
        agreed: torch.Tensor | None = None,
    ) -> torch.Tensor:
        packed = real(tokens, ancestors, target_logits, agreed)  # [B, 1 + 2N]: n, path nodes, emitted tokens
        N = tokens.shape[1]
        if N < 2:
            return packed
        rejected = packed[:, 0] == 1  # only the root: every draft token was rejected
        packed = packed.clone()
        packed[rejected, 0] = 2
        packed[rejected, 2] = 1  # node 1 is the root's first child (parents come before children)
        packed[rejected, 1 + N] = tokens[rejected, 1]  # the draft's token, unverified
        packed[rejected, 2 + N] = target_logits[rejected, 1].argmax(dim=-1)
        return packed

    verify.greedy_paths = greedy_paths
    runner_greedy.greedy_paths = greedy_paths


if FAULT == "accept-first-draft":
    _accept_first_draft()
elif FAULT:
    raise SystemExit(f"tests/faults/inject: unknown EAGLEWIRE_TEST_FAULT={FAULT!r}")
