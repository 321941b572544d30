"""capture_records batches records of different lengths, right-padded and without a padding mask
(so SDPA may run flash attention): on every supported architecture each record's states equal
the record captured alone, unpadded. Pins the claim that causal attention never lets a real
token see the padding after it."""

from __future__ import annotations

import pytest
import torch

from eaglewire.data.build import build_dataset
from eaglewire.data.capture_batches import capture_records, launch_shards
from eaglewire.target.capture import capture
from eaglewire.target.identity import build_contract
from tests.helpers.tiny import CAPTURE_ARCHITECTURES, make_tiny_target, tiny_tokenizer
from tests.unit.data.test_shards import convs


@pytest.mark.parametrize("arch", CAPTURE_ARCHITECTURES)
def test_padded_batch_equals_each_record_alone(arch: str) -> None:
    target = make_tiny_target(arch, num_layers=8)
    dataset = build_dataset(convs(9), tiny_tokenizer(), max_length=64, show_progress=False)[0]
    lengths = {int(dataset[i].input_ids.numel()) for i in range(len(dataset))}
    assert len(lengths) > 2  # the batches really are padded
    contract = build_contract(target, None, final_norm="pre", fingerprint=False)
    records = capture_records(
        target, dataset, range(len(dataset)), contract, batch_size=4, max_batch_tokens=4096
    )
    for i, rec in enumerate(records):
        alone = capture(
            target.model,
            dataset[i].input_ids[None],
            aux_boundaries=contract.aux_boundaries,
            final=contract.final,
        )
        assert rec.record_id == dataset.record_ids[i]
        torch.testing.assert_close(rec.aux, alone.aux[0], atol=1e-5, rtol=1e-4, msg=f"{arch} record {i} aux")
        torch.testing.assert_close(
            rec.final, alone.final[0], atol=1e-5, rtol=1e-4, msg=f"{arch} record {i} final"
        )


def test_launch_shards_packs_each_group_in_record_order() -> None:
    """Groups batched together (longest first, so a batch mixes groups and rows arrive out of order)
    still come back one packed buffer per group and tensor, each record's rows at its place: the
    same values as the records captured alone, and the ids and mask joined in group order."""
    target = make_tiny_target("llama", num_layers=8)
    dataset = build_dataset(convs(11), tiny_tokenizer(), max_length=64, show_progress=False)[0]
    contract = build_contract(target, None, final_norm="pre", fingerprint=False)
    groups = [[0, 3, 5, 7, 9], [1, 2, 4, 6, 8, 10]]
    contents = launch_shards(
        target, dataset, groups, contract, batch_size=3, max_batch_tokens=4096
    ).contents()
    assert [c.record_ids for c in contents] == [[dataset.record_ids[i] for i in g] for g in groups]
    for content, group in zip(contents, groups, strict=True):
        assert len(content.aux) == len(content.final) == 1  # one part per tensor: a handful of writes
        assert content.aux[0].shape == (content.num_tokens, contract.num_aux * target.hidden_size)
        assert torch.equal(content.input_ids[0], torch.cat([dataset[i].input_ids for i in group]))
        assert torch.equal(content.loss_mask[0], torch.cat([dataset[i].loss_mask for i in group]))
        for i, rec in zip(group, content.records(), strict=True):
            alone = capture(
                target.model,
                dataset[i].input_ids[None],
                aux_boundaries=contract.aux_boundaries,
                final=contract.final,
            )
            torch.testing.assert_close(rec.aux, alone.aux[0], atol=1e-5, rtol=1e-4, msg=f"record {i} aux")
            torch.testing.assert_close(
                rec.final, alone.final[0], atol=1e-5, rtol=1e-4, msg=f"record {i} final"
            )
