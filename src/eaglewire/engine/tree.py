"""Draft trees: explicit parent pointers, and everything derived from them.

A tree has N nodes. Node 0 is the *root*: the last accepted token, not yet in the target's
cache. Every other node is a drafted token whose parent is the token before it. Nodes are
ordered so that a parent always precedes its children (parents[i] < i), which makes every
prefix of the node list a valid tree and the verification walk a single forward scan.

    depths[i]        0 for the root, depths[parents[i]] + 1 otherwise
    positions[i]     root_position + depths[i]
    ancestor_mask    [N, N] bool, [i, j] = node j is node i or one of its ancestors; the target's
                     tree attention mask (each node sees the committed prefix plus this row)

A chain is the topk = 1 special case: parents = [-1, 0, 1, 2, ...].

EAGLE-2 selection (`select_nodes`): the drafter scores candidates by cumulative draft
log-probability; the best `num_draft_tokens - 1` are kept. A child's score never exceeds its
parent's (log-probabilities are <= 0), and ties are broken toward earlier candidates (parents
are created before children), so the kept set is always closed under "parent of".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eaglewire.engine.beam import stable_ranks
from eaglewire.errors import expected_actual


@dataclass(frozen=True)
class DraftTree:
    """N = num_nodes. All tensors live on the drafter's device."""

    tokens: torch.Tensor  # [N] int64 target token ids; tokens[0] is the root
    parents: torch.Tensor  # [N] int64 node index of each node's parent; -1 for the root
    depths: torch.Tensor  # [N] int64; 0 for the root
    depth_limit: (
        int  # an upper bound on depths (known without reading the device): the ancestor walk's length
    )
    # [N, V] float32: for a sampled chain, the processed draft distribution node i was drawn from
    # (row 0 unused). None when nodes are deterministic top-k picks (greedy or tree drafting).
    draft_probs: torch.Tensor | None = None
    scores: torch.Tensor | None = None  # [N] cumulative draft log-probability of each node (root 0)
    # [N, N] the ancestor mask when the drafter already computed it (inside its CUDA graph)
    ancestors: torch.Tensor | None = None

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def max_path_nodes(self) -> int:
        """The most nodes an accepted path can have, root included: a bound known on the host."""
        return min(self.depth_limit + 1, self.num_nodes)

    def positions(self, root_position: int) -> torch.Tensor:
        """[N] absolute positions: the root at `root_position`, each node one deeper than its parent."""
        return self.depths + root_position

    def ancestor_mask(self) -> torch.Tensor:
        """[N, N] bool: [i, j] is True when j == i or j is an ancestor of i."""
        if self.ancestors is not None:
            return self.ancestors
        return ancestor_mask(self.parents, max_depth=self.depth_limit)

    def children(self) -> list[list[int]]:
        """Host-side child lists in node order (siblings in the order they were ranked)."""
        kids: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for i, p in enumerate(self.parents.tolist()):
            if p >= 0:
                kids[p].append(i)
        return kids


@dataclass(frozen=True)
class DeviceRoot:
    """The next round's root while only the device knows it (a launch-ahead loop has not read the
    verdict that decides it yet): token and position [1] int64 on the device, and a host upper
    bound on the position (to size caches and pick windows; masks read the true position)."""

    token: torch.Tensor
    position: torch.Tensor
    position_bound: int


def root_only(root_token: int | torch.Tensor, device: torch.device | str = "cpu") -> DraftTree:
    """The tree of plain decoding: just the root (verification then emits the target's next token).
    root_token: an id, or a [1] tensor on `device` (a `DeviceRoot`'s)."""
    zero = torch.zeros(1, dtype=torch.long, device=device)
    return DraftTree(tokens=zero + root_token, parents=zero - 1, depths=zero, depth_limit=0)


def depths_from_parents(parents: torch.Tensor) -> torch.Tensor:
    """parents [N] (parents[0] = -1, parents[i] < i) -> depths [N], walking each node's parent."""
    depth = [0] * len(parents)
    for i, p in enumerate(parents.tolist()):
        depth[i] = 0 if p < 0 else depth[p] + 1
    return torch.tensor(depth, dtype=torch.long, device=parents.device)


def check_parents(parents: torch.Tensor) -> None:
    """Raise ValueError unless node 0 is the only root and every parent precedes its child."""
    ps = parents.tolist()
    if not ps or ps[0] != -1:
        raise ValueError(expected_actual("parents[0] (the root)", -1, ps[0] if ps else "an empty tree"))
    for i, p in enumerate(ps[1:], start=1):
        if not 0 <= p < i:
            raise ValueError(f"parents[{i}] = {p}: a node's parent must be an earlier node (0..{i - 1})")


def tree_from_parents(
    tokens: torch.Tensor, parents: torch.Tensor, draft_probs: torch.Tensor | None = None
) -> DraftTree:
    """Build a tree from explicit parent pointers (validated)."""
    if tokens.shape != parents.shape:
        raise ValueError(
            expected_actual(
                "tokens/parents shapes", "equal", f"{tuple(tokens.shape)} vs {tuple(parents.shape)}"
            )
        )
    check_parents(parents)
    depths = depths_from_parents(parents)
    return DraftTree(
        tokens=tokens, parents=parents, depths=depths, depth_limit=int(depths.max()), draft_probs=draft_probs
    )


def ancestor_mask(parents: torch.Tensor, *, max_depth: int) -> torch.Tensor:
    """parents [..., N] -> [..., N, N] bool ancestor-or-self mask, by following parent pointers
    `max_depth` times (leading dims: independent trees, one per batch row).

    Runs as tensor ops only (no host synchronisation), so it is cheap inside the decode loop.
    """
    n = parents.shape[-1]
    mask = torch.eye(n, dtype=torch.bool, device=parents.device).expand(*parents.shape, n).clone()
    cursor = parents.clone()  # cursor[i] = the ancestor of i being visited (-1 = walked past the root)
    for _ in range(max_depth):
        alive = cursor >= 0
        visit = torch.zeros_like(mask).scatter(-1, cursor.clamp(min=0)[..., None], alive[..., None])
        mask |= visit
        cursor = torch.where(alive, parents.gather(-1, cursor.clamp(min=0)), cursor)
    return mask


def select_nodes(
    scores: torch.Tensor, parents: torch.Tensor, num_select: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE-2 reranking over a candidate pool (leading dims: independent pools, one per batch row).

    scores [..., C] cumulative draft log-probabilities; parents [..., C] index of each candidate's
    parent candidate (-1 = the root); candidates are in creation order (a parent before its children).
    Keeps the `num_select` best (ties to the earlier candidate) and returns
    (kept [..., n] candidate indices in creation order, node_parents [..., n+1] parent pointers of the
    resulting tree with the root as node 0 and kept[j] as node j + 1).
    """
    C = scores.shape[-1]
    if num_select > C:
        raise ValueError(f"num_select={num_select} exceeds the {C} candidates")
    keep = stable_ranks(scores) < num_select  # [..., C] (no sort: see stable_ranks)
    node_of = torch.where(keep, keep.cumsum(-1), -1)  # candidate index -> node index (-1 = not kept)
    # kept candidates in creation order (parents before children); the others go to a spare slot
    slot = torch.where(keep, node_of - 1, num_select)
    lead = scores.shape[:-1]
    kept = torch.zeros(*lead, num_select + 1, dtype=torch.long, device=scores.device)
    candidates = torch.arange(C, device=scores.device).expand(*lead, C)
    kept = kept.scatter(-1, slot, candidates)[..., :num_select]
    kept_parents = parents.gather(-1, kept)
    from_root = kept_parents < 0
    node_parents = torch.where(
        from_root, torch.zeros_like(kept_parents), node_of.gather(-1, kept_parents.clamp(min=0))
    )
    root = torch.full((*lead, 1), -1, dtype=parents.dtype, device=parents.device)
    return kept, torch.cat([root, node_parents], dim=-1)
