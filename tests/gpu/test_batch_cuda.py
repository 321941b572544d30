"""On CUDA (graphs per batch-size bucket, compiled code), the batched speculative engine gives every
request the greedy tokens of its prompt decoded alone (float32), chain and tree, at B = 1, 2, 5
with refills and early stops; in bf16 it finishes every row at its requested length, with the
drafter's graphs captured per bucket.

Runs only where CUDA is present (the device machine): `pytest tests/gpu`."""

from __future__ import annotations

import copy

import pytest
import torch

from eaglewire.engine.batch.drafter import BatchDrafter
from eaglewire.engine.batch.engine import BatchEngine, BatchRequest
from eaglewire.engine.runners.fast.runner import FastTargetRunner
from eaglewire.engine.verify import StopRule
from tests.gpu.conftest import SPECS, TOKENS, tiny_on_cuda
from tests.unit.engine.conftest import Tiny

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

MAX_ROWS = 5
MAX_SEQ_LEN = 256
LENGTHS = [40, 12, 40, 25, 7, 40, 1]  # 7 requests: more than the rows of every B


@pytest.fixture(scope="module")
def cuda_tiny() -> tuple[Tiny, torch.nn.Module]:
    return tiny_on_cuda(TOKENS, extra_prompts=[[17]])  # the one-token prompt too


@pytest.fixture(scope="module")
def engines(cuda_tiny):
    """(runner, drafter) by (shape, dtype), built once: their graphs stay captured across B."""
    tiny, trained = cuda_tiny
    made: dict[tuple[str, torch.dtype], tuple[FastTargetRunner, BatchDrafter]] = {}

    def get(shape: str, dtype: torch.dtype) -> tuple[FastTargetRunner, BatchDrafter]:
        if (shape, dtype) not in made:
            runner = FastTargetRunner(
                tiny.target,
                tiny.contract.aux_boundaries,
                max_batch_size=MAX_ROWS,
                max_seq_len=MAX_SEQ_LEN,
                dtype=dtype,
            )
            draft = trained if dtype == torch.float32 else copy.deepcopy(trained).to(dtype)
            drafter = BatchDrafter(draft, SPECS[shape], max_rows=MAX_ROWS, max_seq_len=MAX_SEQ_LEN)
            assert runner.use_graphs and drafter.use_graphs
            made[shape, dtype] = runner, drafter
        return made[shape, dtype]

    return get


def _requests(tiny: Tiny) -> tuple[list[BatchRequest], list[list[int]], list[str]]:
    """7 requests over the 4 prompts (an eos row, a stop-string row, lengths 1..40) and the tokens
    and finish reason each must give: its reference as its stop rule cuts it."""
    decode = lambda ids: str(tiny.target.tokenizer.decode(ids, skip_special_tokens=True))  # noqa: E731
    prompt_of = [0, 1, 2, 3, 1, 0, 3]
    rules = [StopRule(n) for n in LENGTHS]
    rules[1] = StopRule(40, eos_token_ids=frozenset({tiny.references[1][7]}))  # ends at or before 8
    rules[4] = StopRule(40, stop_strings=("tsh",), decode=decode)  # in references[1]'s text
    requests, expected, finish = [], [], []
    for p, rule in zip(prompt_of, rules, strict=True):
        kept, why = rule.cut([], tiny.references[p])
        assert why is not None
        requests.append(BatchRequest(list(tiny.prompts[p]), rule))
        expected.append(kept)
        finish.append(why)
    assert finish[1] == "eos" and finish[4] == "stop_string"
    return requests, expected, finish


def _drafted_buckets(drafter: BatchDrafter) -> set[int]:
    graphs = drafter._graphs
    assert graphs is not None, "the drafter fell back to eager drafting"
    return {key[1] for key in graphs._graphs if isinstance(key, tuple) and key[0] == "draft"}


@pytest.mark.parametrize("B", [1, 2, 5])
@pytest.mark.parametrize("shape", sorted(SPECS))
def test_batched_graphs_equal_plain_greedy(cuda_tiny, engines, shape, B):
    tiny, _ = cuda_tiny
    runner, drafter = engines(shape, torch.float32)
    requests, expected, finish = _requests(tiny)
    engine = BatchEngine(runner, drafter, max_rows=B)
    traces = engine.run(requests)
    for i, trace in enumerate(traces):
        assert trace.token_ids == expected[i], f"{shape}/B={B}: request {i}"
        assert trace.finish_reason == finish[i], f"{shape}/B={B}: request {i}"
    buckets = {b for b, _label in engine.stats.seconds}
    assert max(buckets) == B
    assert buckets <= _drafted_buckets(drafter)  # every bucket drafted through its own graphs
    assert runner.graph_stats[0] > 0
    chat = [traces[0], traces[2]]  # the trained draft's drafts were accepted through the graphs
    assert sum(len(t.token_ids) for t in chat) / sum(t.num_verifications for t in chat) > 1.5


@pytest.mark.parametrize("shape", sorted(SPECS))
def test_bf16_batch_finishes_every_row(cuda_tiny, engines, shape):
    tiny, _ = cuda_tiny
    runner, drafter = engines(shape, torch.bfloat16)
    prompt_of = [0, 1, 2, 3, 1, 0, 3]
    requests = [
        BatchRequest(list(tiny.prompts[p]), StopRule(n)) for p, n in zip(prompt_of, LENGTHS, strict=True)
    ]
    engine = BatchEngine(runner, drafter, max_rows=MAX_ROWS)
    traces = engine.run(requests)
    assert [len(t.token_ids) for t in traces] == LENGTHS
    assert all(t.finish_reason == "max_new_tokens" for t in traces)
    vocab = tiny.target.config.vocab_size
    assert all(0 <= tok < vocab for t in traces for tok in t.token_ids)
    buckets = {b for b, _label in engine.stats.seconds}
    assert MAX_ROWS in buckets and len(buckets) > 1  # it started full and shrank as rows ended
    assert buckets <= _drafted_buckets(drafter)
