"""On CUDA, capture_records copies each record's rows into its group's pinned host buffers on a copy
stream while later batches run: every record equals the same batch captured and read back
synchronously, and the shards capture_dataset writes hold the CPU capture's values (float32).

Runs only where CUDA is present (the device machine): `pytest tests/gpu`."""

from __future__ import annotations

import pytest
import torch

from eaglewire.data.batching import length_batches
from eaglewire.data.build import build_dataset
from eaglewire.data.capture import capture_dataset
from eaglewire.data.capture_batches import capture_records
from eaglewire.data.shards import ShardDataset
from eaglewire.target.capture import capture
from eaglewire.target.identity import build_contract
from tests.helpers.tiny import make_tiny_target, tiny_tokenizer
from tests.unit.data.test_shards import convs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

BATCH_SIZE = 3
MAX_BATCH_TOKENS = 4096


def test_copy_stream_records_equal_a_synchronous_read_back(tmp_path) -> None:
    target = make_tiny_target("llama", num_layers=8)
    dataset = build_dataset(convs(23), tiny_tokenizer(), max_length=64, show_progress=False)[0]
    contract = build_contract(target, None, final_norm="pre", fingerprint=False)
    cpu_shards = tmp_path / "cpu"
    capture_dataset(target, dataset, cpu_shards, shard_records=5, batch_size=BATCH_SIZE, show_progress=False)
    target.model.to("cuda")
    indices = list(range(len(dataset)))
    records = capture_records(
        target, dataset, indices, contract, batch_size=BATCH_SIZE, max_batch_tokens=MAX_BATCH_TOKENS
    )
    lengths = [int(dataset[i].input_ids.numel()) for i in indices]
    with torch.no_grad():
        for group in length_batches(lengths, BATCH_SIZE, MAX_BATCH_TOKENS):
            width = max(lengths[i] for i in group)
            ids = torch.zeros((len(group), width), dtype=torch.long)
            for row, i in enumerate(group):
                ids[row, : lengths[i]] = dataset[i].input_ids
            states = capture(  # right-padded, no padding mask: as capture_records runs it
                target.model, ids.cuda(), aux_boundaries=contract.aux_boundaries, final=contract.final
            )
            aux, final = states.aux.cpu(), states.final.cpu()  # synchronous
            for row, i in enumerate(group):
                assert torch.equal(records[i].aux, aux[row, : lengths[i]]), i
                assert torch.equal(records[i].final, final[row, : lengths[i]]), i
    cuda_shards = tmp_path / "cuda"
    stats = capture_dataset(target, dataset, cuda_shards, shard_records=5, batch_size=BATCH_SIZE, show_progress=False)  # fmt: skip
    assert 0 < stats.gpu_forward_seconds < stats.seconds  # the compute stream's forwards were timed
    on_cpu, on_cuda = ShardDataset(cpu_shards), ShardDataset(cuda_shards)
    for i in range(len(dataset)):
        torch.testing.assert_close(on_cuda[i].aux, on_cpu[i].aux, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(on_cuda[i].final, on_cpu[i].final, atol=1e-4, rtol=1e-4)
    for depth in (1, 2):  # the host kept 1 or 2 batches ahead of the GPU: the same shards' values
        paced = tmp_path / f"paced{depth}"
        stats = capture_dataset(
            target,
            dataset,
            paced,
            shard_records=5,
            batch_size=BATCH_SIZE,
            show_progress=False,
            pace_batches=depth,
        )
        assert stats.pace_wait_seconds >= 0 and stats.records == len(dataset)
        on_paced = ShardDataset(paced)
        for i in range(len(dataset)):
            assert torch.equal(on_paced[i].aux, on_cuda[i].aux), (depth, i)
            assert torch.equal(on_paced[i].final, on_cuda[i].final), (depth, i)


def test_bf16_padded_batches_without_a_mask_equal_each_record_alone() -> None:
    """In bf16 SDPA may run flash attention on the unmasked, right-padded batches: each record's
    states still equal the record captured alone (within bf16 rounding)."""
    target = make_tiny_target("llama", num_layers=8, dtype=torch.bfloat16)
    target.model.to("cuda")
    dataset = build_dataset(convs(23), tiny_tokenizer(), max_length=64, show_progress=False)[0]
    contract = build_contract(target, None, final_norm="pre", fingerprint=False)
    records = capture_records(
        target,
        dataset,
        range(len(dataset)),
        contract,
        batch_size=BATCH_SIZE,
        max_batch_tokens=MAX_BATCH_TOKENS,
    )
    for i, rec in enumerate(records):
        alone = capture(
            target.model,
            dataset[i].input_ids[None].cuda(),
            aux_boundaries=contract.aux_boundaries,
            final=contract.final,
        )
        torch.testing.assert_close(rec.aux.float(), alone.aux[0].float().cpu(), atol=3e-2, rtol=3e-2)
        torch.testing.assert_close(rec.final.float(), alone.final[0].float().cpu(), atol=3e-2, rtol=3e-2)
