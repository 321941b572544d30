"""On CUDA, offline training joins the records' states in pinned host memory and copies them to the
device without blocking the host. Queued behind other work, so that each staging buffer is freed
before its copy has run (and a later one could take its memory), the inputs still equal the same
rows prepared with the head on the CPU (float32).

Runs only where CUDA is present (the device machine): `pytest tests/gpu`."""

from __future__ import annotations

import pytest
import torch

from eaglewire.data.build import build_dataset
from eaglewire.data.capture import capture_dataset
from eaglewire.data.shards import ShardDataset
from eaglewire.data.vocab import build_draft_vocab
from eaglewire.train.batches import Slot, fetch_rows
from eaglewire.train.target_side import OfflineTarget, TargetHead
from tests.helpers.tiny import make_tiny_target, tiny_tokenizer
from tests.unit.data.test_shards import convs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_offline_inputs_on_cuda_equal_the_cpu_ones(tmp_path) -> None:
    target = make_tiny_target("llama", num_layers=8)
    dataset = build_dataset(convs(12), tiny_tokenizer(), max_length=64, show_progress=False)[0]
    capture_dataset(target, dataset, tmp_path / "shards", shard_records=5, show_progress=False)
    shards = ShardDataset(tmp_path / "shards")
    d2t = build_draft_vocab(dataset, 64, vocab_size=target.vocab_size).draft_to_target
    head = TargetHead.from_target(target, shards.contract.final)
    # two rows of two records each, the second record of each row cut short
    lengths = [int(shards[i].input_ids.numel()) for i in range(4)]
    rows = [
        (Slot(0, 0, lengths[0]), Slot(1, lengths[0], lengths[1] - 2)),
        (Slot(2, 0, lengths[2]), Slot(3, lengths[2], lengths[3] - 1)),
    ]
    records = fetch_rows(shards, rows)
    cpu = OfflineTarget(head, shards.contract, d2t).prepare(rows, records, torch.device("cpu"))
    cuda = torch.device("cuda")
    side = OfflineTarget(
        TargetHead.from_target(target, shards.contract.final), shards.contract, d2t, device=cuda
    )
    busy = torch.randn(4096, 4096, device=cuda)
    for _ in range(20):  # work queued ahead of the copies, so they run after their buffers are freed
        busy = busy @ busy / 64
    got = side.prepare(rows, records, cuda)
    torch.cuda.synchronize()
    assert got.aux.device.type == "cuda"
    torch.testing.assert_close(got.aux.cpu(), cpu.aux)
    torch.testing.assert_close(got.target.probs.cpu(), cpu.target.probs, atol=1e-5, rtol=1e-4)
    assert torch.equal(got.target.token.cpu(), cpu.target.token)
    assert torch.equal(got.target.in_vocab.cpu(), cpu.target.in_vocab)
    assert torch.equal(got.batch.input_ids.cpu(), cpu.batch.input_ids)
