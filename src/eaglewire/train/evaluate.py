"""Offline evaluation: per-step accuracy and a *predicted* acceptance length (tau) from held-out data.

Runs the same training-time-test forward as training (ground-truth tokens, the draft's own hidden
states, serving positions and masks) and records, for every position t and step s, the rank of
the target's argmax token among the draft's logits (0 = the draft's top-1 is that token).

Estimator (greedy verification; tau counts the bonus token, as SGLang/vLLM/EAGLE do):

* chain of k draft tokens: tau_pred = 1 + sum_{s=1..k} prod_{j<=s} cond_acc_j, where cond_acc_j
  is the accuracy of draft token j over the positions whose tokens 1..j-1 were all right
  (`EvalResult.summary()["cond_acc"][j-1]`). Each product is the probability that the first s
  draft tokens are all accepted.
* tree: a tree is a set of nodes, each a path of ranks (r_1, ..., r_d) from the root, e.g.
  (0,), (1,), (0, 0): "the draft's best token, its second best, and the best continuation of the
  first". Under greedy verification a node is accepted iff at every depth j the target's token is
  the draft's rank-r_j token, so tau_pred = 1 + sum_nodes P(node), with
  P(r_1..r_d) = prod_j  #{positions valid at depth j whose ranks at depths < j are r_1..r_{j-1}
                          and whose rank at depth j is r_j} / #{... the same without the last condition}.
  For the chain (0,)*s this is exactly the product of cond_acc above.

Assumptions (what makes it a prediction, not a measurement): the draft at depth j is fed the
ground-truth token, which equals the accepted token when the data is the target's own greedy
output (regenerate it); sibling order equals the draft's ranking, as in EAGLE's top-k expansion;
prompts in the eval set resemble the served ones. A dynamic tree (SGLang's topk/num_steps/
num_draft_tokens reranking) is approximated by the static tree of the same nodes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from itertools import product
from typing import Any

import torch
from torch import nn

from eaglewire.errors import ConfigError
from eaglewire.train.batches import RecordSource, Row, fetch_rows, plan_rows, record_lengths
from eaglewire.train.distributed import DistContext, all_gather_objects, all_reduce_sum
from eaglewire.train.loss import StepCounts
from eaglewire.train.target_side import TargetSide
from eaglewire.train.ttt import step_in_range, step_valid

log = logging.getLogger(__name__)
RANK_CAP = 32767  # ranks are stored as int16


def predicted_tau_chain(cond_acc: Sequence[float], k: int) -> float:
    """tau_pred = 1 + sum_{s=1..k} prod_{j<=s} cond_acc[j-1]; a NaN (no positions) counts as 0."""
    if k < 0 or k > len(cond_acc):
        raise ConfigError(
            f"chain length k={k}: expected 0..{len(cond_acc)} (accuracy measured for {len(cond_acc)} steps)"
        )
    tau, prod = 1.0, 1.0
    for a in cond_acc[:k]:
        prod *= a if math.isfinite(a) else 0.0
        tau += prod
    return tau


def full_tree(topk: int, depth: int) -> list[tuple[int, ...]]:
    """Every rank path with ranks < topk and length 1..depth (a full topk-ary tree)."""
    return [p for d in range(1, depth + 1) for p in product(range(topk), repeat=d)]


def validate_tree(tree: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    nodes = [tuple(int(r) for r in p) for p in tree]
    known = set(nodes)
    for p in nodes:
        if not p or min(p) < 0:
            raise ConfigError(f"tree node {list(p)}: expected a non-empty path of ranks >= 0")
        if len(p) > 1 and p[:-1] not in known:
            raise ConfigError(f"tree node {list(p)}: its parent {list(p[:-1])} is not in the tree")
    if len(known) != len(nodes):
        raise ConfigError("tree: duplicated nodes")
    return nodes


def predicted_tau_tree(ranks: torch.Tensor, valid: torch.Tensor, tree: Sequence[Sequence[int]]) -> float:
    """ranks [N, S] int, valid [N, S] bool (per position and depth, see module docstring)."""
    nodes = validate_tree(tree)
    depth = max(len(p) for p in nodes)
    if depth > ranks.shape[1]:
        raise ConfigError(
            f"tree depth {depth} exceeds the {ranks.shape[1]} steps evaluated",
            fix=f"evaluate with --num-steps {depth}",
        )
    tau = 1.0
    for path in nodes:
        match = torch.ones(ranks.shape[0], dtype=torch.bool)
        prob = 1.0
        for j, r in enumerate(path):
            den = valid[:, j] & match
            match = match & (ranks[:, j] == r)
            n_den = int(den.sum())
            prob *= int((den & match).sum()) / n_den if n_den else 0.0
        tau += prob
    return tau


@dataclass
class EvalResult:
    counts: StepCounts
    step_weights: list[float]
    ranks: torch.Tensor  # [N, S] int16, positions in range at step 0
    valid: torch.Tensor  # [N, S] bool
    records: int
    tokens: int

    @property
    def num_steps(self) -> int:
        return int(self.counts.table.shape[0])

    def summary(self) -> dict[str, Any]:
        return {**self.counts.summary(self.step_weights), "records": self.records, "tokens": self.tokens}

    def tau_chain(self, k: int) -> float:
        return predicted_tau_chain(self.summary()["cond_acc"], k)

    def tau_tree(self, tree: Sequence[Sequence[int]]) -> float:
        return predicted_tau_tree(self.ranks, self.valid, tree)


def eval_rows(data: RecordSource[Any], *, max_length: int, pack: bool, max_records: int) -> list[Row]:
    """Held-out rows in record order (no shuffling), at most `max_records` records."""
    lengths = record_lengths(data)
    n = len(lengths) if max_records <= 0 else min(max_records, len(lengths))
    return plan_rows(lengths, list(range(n)), max_length=max_length, pack=pack)


@torch.no_grad()
def evaluate_model(
    model: nn.Module,
    target_side: TargetSide,
    data: RecordSource[Any],
    rows: Sequence[Row],
    *,
    ctx: DistContext,
    batch_size: int,
    num_steps: int,
    step_weights: list[float],
    autocast: AbstractContextManager[Any],
    with_ranks: bool = True,
) -> EvalResult:
    """Evaluate a TTTObjective (possibly DDP/FSDP-wrapped) on `rows`; all processes must call this.

    Batches are dealt round-robin over processes; every process runs the same number of forwards
    (a process with nothing left repeats batch 0 and discards it), which FSDP's collectives need.
    """
    batches = [list(rows[i : i + batch_size]) for i in range(0, len(rows), batch_size)]
    counts = StepCounts(num_steps, device=ctx.device)
    rank_parts: list[torch.Tensor] = []
    valid_parts: list[torch.Tensor] = []
    tokens = torch.zeros((), dtype=torch.float64, device=ctx.device)
    rounds = math.ceil(len(batches) / ctx.world_size) if batches else 0
    was_training = model.training
    model.eval()
    for r in range(rounds):
        idx = r * ctx.world_size + ctx.rank
        real = idx < len(batches)
        part = batches[idx] if real else batches[0]
        inputs = target_side.prepare(part, fetch_rows(data, part), ctx.device)
        with autocast:
            out = model(inputs, with_ranks=with_ranks)
        if not real:
            continue
        counts.table += out.counts
        b = inputs.batch
        tokens += b.num_tokens
        if with_ranks and out.ranks is not None:
            keep = step_in_range(b.doc_ids, 0)  # [B, T]
            rank_parts.append(out.ranks[:, keep].T.clamp_max(RANK_CAP).to(torch.int16).cpu())  # [N, S]
            valid = torch.stack(
                [step_valid(b.doc_ids, b.loss_mask, s) for s in range(num_steps)]
            )  # [S, B, T]
            valid_parts.append(valid[:, keep].T.cpu())
    model.train(was_training)
    all_reduce_sum(counts.table, ctx)
    all_reduce_sum(tokens, ctx)
    ranks = torch.cat(rank_parts) if rank_parts else torch.zeros(0, num_steps, dtype=torch.int16)
    valid_t = torch.cat(valid_parts) if valid_parts else torch.zeros(0, num_steps, dtype=torch.bool)
    if with_ranks and ctx.distributed:
        ranks = torch.cat(all_gather_objects(ranks, ctx))
        valid_t = torch.cat(all_gather_objects(valid_t, ctx))
    num_records = sum(len(row) for row in rows)
    return EvalResult(counts, step_weights, ranks, valid_t, num_records, int(tokens))


def evaluate_draft(
    draft: Any,
    draft_contract: Any,
    target_side: TargetSide,
    data: RecordSource[Any],
    *,
    num_steps: int,
    batch_size: int = 1,
    max_length: int = 2048,
    pack: bool = True,
    max_records: int = 0,
    device: str | torch.device = "cpu",
    precision: str = "auto",
    step_weight_decay: float = 0.8,
) -> EvalResult:
    """Evaluate a trained draft (an Eagle3Draft) on held-out records in one process.

    Checks the data's contract against the draft's first (ContractMismatchError names both).
    """
    from eaglewire.train.objective import TTTObjective, autocast_for
    from eaglewire.train.target_side import check_data_contract

    check_data_contract(draft_contract, target_side.data_contract)
    target_side.verify(draft_contract)
    dev = torch.device(device)
    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=dev)
    model = TTTObjective(draft.to(dev), num_steps)
    rows = eval_rows(data, max_length=max_length, pack=pack, max_records=max_records)
    return evaluate_model(
        model,
        target_side,
        data,
        rows,
        ctx=ctx,
        batch_size=batch_size,
        num_steps=num_steps,
        step_weights=[step_weight_decay**s for s in range(num_steps)],
        autocast=autocast_for(precision, dev),
    )
