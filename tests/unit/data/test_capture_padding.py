"""capture_records batches records of different lengths, right-padded and without a padding mask
(so SDPA may run flash attention): on every supported architecture each record's states equal
the record captured alone, unpadded. Pins the claim that causal attention never lets a real
token see the padding after it."""

from __future__ import annotations

import pytest
import torch

from eaglewire.data.build import build_dataset
from eaglewire.data.capture import capture_records
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
