"""Importers: files written in speculators' and SpecForge's offline layouts round-trip into our shards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from eaglewire.contract.fingerprint import StateKey
from eaglewire.data.build import build_dataset
from eaglewire.data.importers import import_hidden_states
from eaglewire.data.records import TokenizedDataset
from eaglewire.data.shards import ShardDataset
from eaglewire.errors import ConfigError, DataFormatError, FingerprintMismatchError
from eaglewire.target.capture import capture_all
from tests.helpers.tiny import make_tiny_target, save_tiny_target
from tests.unit.data.test_shards import convs

L = 8


@pytest.fixture(scope="module")
def setup(tmp_path_factory):  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("imp")
    target = make_tiny_target("llama", num_layers=L)
    target_dir = save_tiny_target(target, root / "target")
    ds, _ = build_dataset(convs(5), target.tokenizer, max_length=64, show_progress=False)
    ds.save(root / "ds")
    states = [
        {k: v[0] for k, v in capture_all(target.model, ds[i].input_ids[None]).items()} for i in range(len(ds))
    ]
    return root, target, target_dir, ds, states


def write_speculators(directory: Path, ds: TokenizedDataset, states, boundaries: list[int]) -> Path:  # type: ignore[no-untyped-def]
    hs_dir = directory / "hidden_states"
    hs_dir.mkdir(parents=True)
    for i in range(len(ds)):
        hs = torch.stack([states[i][StateKey(b)] for b in boundaries], dim=1)  # [T, n, Ht]
        save_file(
            {"token_ids": ds[i].input_ids, "hidden_states": hs.contiguous()},
            str(hs_dir / f"hs_{i}.safetensors"),
        )
    return directory


def write_specforge(directory: Path, ds: TokenizedDataset, states, aux_boundaries: list[int]) -> Path:  # type: ignore[no-untyped-def]
    group = directory / "rows_0-2000"
    group.mkdir(parents=True)
    for i in range(len(ds)):
        aux = torch.cat([states[i][StateKey(b)] for b in aux_boundaries], dim=-1)[None]  # [1, T, A*Ht]
        save_file(
            {
                "input_ids": ds[i].input_ids,
                "loss_mask": ds[i].loss_mask.long(),
                "aux_hidden_state": aux.contiguous(),
                "hidden_state": states[i][StateKey(L, "post")][None].contiguous(),
            },
            str(group / f"data_{i}.safetensors"),
        )
    return directory


def assert_same(
    shards: ShardDataset, ds: TokenizedDataset, states, aux_b: list[int], final: StateKey
) -> None:  # type: ignore[no-untyped-def]
    assert len(shards) == len(ds)
    Ht = shards.contract.target.hidden_size
    for i in range(len(ds)):
        r = shards[i]
        assert torch.equal(r.input_ids, ds[i].input_ids) and torch.equal(r.loss_mask, ds[i].loss_mask)
        for a, b in enumerate(aux_b):
            assert torch.equal(r.aux[:, a * Ht : (a + 1) * Ht], states[i][StateKey(b)])
        assert torch.equal(r.final, states[i][final])


def test_speculators_roundtrip_with_jsonl_masks(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, _, target_dir, ds, states = setup
    src = write_speculators(tmp_path / "spec", ds, states, [2, 4, 5, L])
    masks = tmp_path / "masks.jsonl"
    masks.write_text(
        "".join(
            json.dumps({"input_ids": ds[i].input_ids.tolist(), "loss_mask": ds[i].loss_mask.long().tolist()})
            + "\n"
            for i in range(len(ds))
        )
    )
    stats = import_hidden_states(
        "speculators",
        src,
        tmp_path / "out",
        target_dir=target_dir,
        layer_ids=[2, 4, 5, L],
        masks=masks,
        shard_records=2,
    )
    assert stats.records == 5 and stats.shards == 3
    shards = ShardDataset(tmp_path / "out", verify="eager")
    assert shards.contract.aux_boundaries == (2, 4, 5)
    assert (shards.contract.final.boundary, shards.contract.final.norm) == (L, "pre")
    assert shards.manifest["plan"]["imported_from"] == "speculators"
    assert_same(shards, ds, states, [2, 4, 5], StateKey(L))


def test_speculators_aux_ids_only_with_dataset_masks_verified_by_values(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root, target, target_dir, ds, states = setup
    src = write_speculators(tmp_path / "spec", ds, states, [2, 4, 5, L])
    import_hidden_states(
        "speculators",
        src,
        tmp_path / "out",
        target_dir=target_dir,
        layer_ids=[2, 4, 5],
        masks=root / "ds",
        verify_target=target,
    )
    shards = ShardDataset(tmp_path / "out")
    assert shards.contract.fingerprint is not None
    assert shards[0].record_id == ds.record_ids[0]  # ids come from the mask dataset
    assert_same(shards, ds, states, [2, 4, 5], StateKey(L))


def test_mislabelled_ids_are_caught_by_values(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root, target, target_dir, ds, states = setup
    # the engine really captured boundaries 3, 5, 6 (e.g. ids read with the wrong numbering)
    src = write_speculators(tmp_path / "spec", ds, states, [3, 5, 6, L])
    with pytest.raises(
        FingerprintMismatchError, match=r"aux\[0\]: declared boundary 2 but the values are boundary 3"
    ):
        import_hidden_states(
            "speculators",
            src,
            tmp_path / "out",
            target_dir=target_dir,
            layer_ids=[2, 4, 5, L],
            masks=root / "ds",
            verify_target=target,
        )


def test_specforge_roundtrip_ids_in_specforge_numbering(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, target, target_dir, ds, states = setup
    src = write_specforge(tmp_path / "sf", ds, states, [2, 4, 5])
    # SpecForge id i = output of layer i = boundary i + 1
    import_hidden_states(
        "specforge", src, tmp_path / "out", target_dir=target_dir, layer_ids=[1, 3, 4], verify_target=target
    )
    shards = ShardDataset(tmp_path / "out")
    assert shards.contract.aux_boundaries == (2, 4, 5)
    assert (shards.contract.final.boundary, shards.contract.final.norm) == (L, "post")
    assert shards[2].record_id == "specforge:data_2"
    assert_same(shards, ds, states, [2, 4, 5], StateKey(L, "post"))


def test_pickles_refused_and_masks_required(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _, _, target_dir, ds, states = setup
    group = tmp_path / "sf" / "rows_0-2000"
    group.mkdir(parents=True)
    (group / "data_0.ckpt").write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(DataFormatError, match="safetensors only, because unpickling") as e:
        import_hidden_states("specforge", tmp_path / "sf", tmp_path / "out", target_dir=target_dir)
    assert "weights_only=True" in str(e.value) and "save_file" in str(e.value)
    src = write_speculators(tmp_path / "spec", ds, states, [2, 4, 5, L])
    with pytest.raises(ConfigError, match="carry no loss mask"):
        import_hidden_states("speculators", src, tmp_path / "out2", target_dir=target_dir)
    with pytest.raises(ConfigError, match="hold 4 states per token"):
        import_hidden_states(
            "speculators",
            src,
            tmp_path / "out3",
            target_dir=target_dir,
            layer_ids=[2, 4],
            all_tokens_loss=True,
        )
    stats = import_hidden_states(
        "speculators", src, tmp_path / "out4", target_dir=target_dir, all_tokens_loss=True
    )
    assert stats.records == 5 and bool(ShardDataset(tmp_path / "out4")[0].loss_mask.all())
    with pytest.raises(ConfigError, match="engine"):
        import_hidden_states("vllm-v2", src, tmp_path / "out5", target_dir=target_dir)
