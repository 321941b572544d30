"""FastTargetRunner.resize / move_row (the batched engine's bucket changes): a row moved to another
slot, and a batch shrunk or grown around it, decodes on exactly as it would have in place."""

from __future__ import annotations

import pytest
import torch

from eaglewire.engine.runners.fast.runner import FastTargetRunner
from eaglewire.errors import ConfigError
from tests.unit.engine.conftest import plain_greedy
from tests.unit.engine.runners.tiny_targets import tiny

STEPS = 12


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 384, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


class Rows:
    """Plain greedy decoding of some rows of a runner: prefill into a row, then one token per step."""

    def __init__(self, runner: FastTargetRunner) -> None:
        self.runner = runner
        self.next: dict[int, int] = {}  # row -> the token to feed next
        self.position: dict[int, int] = {}
        self.out: dict[int, list[int]] = {}

    def prefill(self, row: int, prompt: list[int]) -> None:
        n = len(prompt)
        fwd = self.runner.prefill_rows(
            [row], torch.tensor([prompt]), torch.arange(n)[None], torch.tensor([n - 1])
        )
        self.runner.commit_rows([row], [n])
        self.next[row], self.position[row], self.out[row] = int(fwd.logits[0, -1].argmax()), n, []

    def step(self) -> None:
        B = self.runner.batch_size
        ids = torch.tensor([[self.next.get(r, 0)] for r in range(B)])  # idle rows: a dummy token
        pos = torch.tensor([[self.position.get(r, 0)] for r in range(B)])
        fwd = self.runner.forward(ids, pos)
        self.runner.commit_prefix(torch.tensor([int(r in self.next) for r in range(B)]))
        for r in self.next:
            self.out[r].append(self.next[r])
            self.next[r] = int(fwd.logits[r, -1].argmax())
            self.position[r] += 1

    def move(self, src: int, dst: int) -> None:
        self.runner.move_row(src, dst)
        for d in (self.next, self.position, self.out):
            d[dst] = d.pop(src)

    def drop(self, row: int) -> list[int]:
        self.runner.reset_rows([row])
        del self.next[row], self.position[row]
        return self.out.pop(row)


def test_a_moved_row_decodes_as_in_place_through_shrink_and_grow() -> None:
    target = tiny("llama")
    first, second, third = _prompt(19, 0), _prompt(7, 1), _prompt(11, 2)  # the longest leaves stale slots
    runner = FastTargetRunner(target, (), max_batch_size=3, max_seq_len=64)
    rows = Rows(runner)
    runner.reset(2)
    rows.prefill(0, first)
    rows.prefill(1, second)
    for _ in range(5):
        rows.step()
    assert rows.drop(0) == plain_greedy(target.model, first, 5)  # row 0 ends
    rows.move(1, 0)  # the running row moves down into it (over row 0's stale cache)...
    assert runner.lengths.tolist() == [len(second) + 5, 0]
    runner.resize(1)  # ...and the batch shrinks around it
    assert runner.batch_size == 1 and runner.lengths.tolist() == [len(second) + 5]
    for _ in range(3):
        rows.step()
    runner.resize(3)  # grow: the new rows are empty, row 0 keeps its tokens
    assert runner.lengths.tolist() == [len(second) + 8, 0, 0]
    rows.prefill(2, third)
    for _ in range(STEPS - 8):
        rows.step()
    assert rows.out[0] == plain_greedy(target.model, second, STEPS)
    rows.move(2, 1)  # a move up the batch's middle, then a shrink to 2
    runner.resize(2)
    for _ in range(4):
        rows.step()
    assert rows.out[1] == plain_greedy(target.model, third, STEPS - 8 + 4)
    assert rows.out[0] == plain_greedy(target.model, second, STEPS + 4)
    assert runner.lengths.tolist() == [len(second) + STEPS + 4, len(third) + STEPS - 8 + 4]


def test_resize_and_move_row_check_their_rows() -> None:
    runner = FastTargetRunner(tiny("llama"), (), max_batch_size=2, max_seq_len=32)
    for size in (0, 3):
        with pytest.raises(ConfigError, match="max_batch_size=2"):
            runner.resize(size)
    runner.reset(1)
    with pytest.raises(ConfigError, match="rows"):
        runner.move_row(1, 0)  # row 1 is outside the current batch of 1
    runner.resize(2)
    runner.move_row(1, 0)  # an empty row moves as an empty row
    assert runner.lengths.tolist() == [0, 0]
