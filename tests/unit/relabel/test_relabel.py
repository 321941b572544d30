"""`eaglewire data relabel` and `eaglewire draft relabel`, in process, on real tiny targets and real files.

Data: shards whose labels say [2, 6, 9] but whose columns are really [3, 7, 10] (captured for real) are
relabelled only after the values prove it; the tensors never change, a second run writes nothing, a wrong
list (or another target) is refused with the command that would be right. Drafts: a copy with the same
config and weights (byte for byte) and a contract rebuilt on the target; the source is never written.
The fix commands the doctor prints parse as the real CLI's.
"""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path

import pytest
import torch
import typer

from eaglewire.cli import app
from eaglewire.contract.contract import Contract, FinalState
from eaglewire.contract.fingerprint import StateKey
from eaglewire.data.shards import ShardDataset, ShardWriter
from eaglewire.data.types import ShardContent
from eaglewire.doctor.data_check import check_data_against_target, relabel_data_command
from eaglewire.doctor.wiring_verdict import relabel_draft_command
from eaglewire.draft.init import init_draft
from eaglewire.draft.io import load_draft, save_draft
from eaglewire.errors import BoundaryError, CheckpointError, ConfigError, ContractMismatchError
from eaglewire.export.exporting import export_draft
from eaglewire.output_marker import OutputKind, verify_files, write_marker
from eaglewire.relabel.data import check_data_request, relabel_data, requested_final
from eaglewire.relabel.draft import relabel_draft
from eaglewire.target.identity import build_contract
from tests.helpers.tiny import make_tiny_target
from tests.unit.doctor.pipeline import labelled, make_records, tiny

L = 12
LABELS = (2, 6, 9)
REAL = (3, 7, 10)


def sha(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def shards(directory: Path, contract: Contract, records) -> ShardDataset:
    writer = ShardWriter(directory, contract, plan={"test": "relabel"}, total_records=len(records))
    writer.write(0, 0, ShardContent.from_records(records))
    writer.finish()
    return ShardDataset(directory)


@pytest.fixture
def mislabelled(tmp_path) -> Path:
    """Shards labelled [2, 6, 9] (a contract built on the target, fingerprint and all) holding [3, 7, 10]."""
    t = tiny(L)
    shards(tmp_path / "data", build_contract(t, LABELS), make_records(t, REAL, n=3, length=20))
    return tmp_path / "data"


def test_relabel_to_the_real_boundaries_rewrites_only_the_labels_and_is_idempotent(mislabelled):
    t = tiny(L)
    before = sha(mislabelled)
    result = relabel_data(ShardDataset(mislabelled), t, REAL, target_arg="T")
    assert result.written == ("manifest.json", "contract.json")
    after = sha(mislabelled)
    assert {k for k in before if before[k] != after[k]} == {"manifest.json", "contract.json"}
    data = ShardDataset(mislabelled)  # loads: the aux list agrees with the new fingerprint's labels
    assert data.contract.aux_boundaries == REAL and Contract.load(mislabelled) == data.contract
    assert data.contract.final == FinalState(L, "pre") and data.contract.dtype == "float32"
    check = check_data_against_target([data[i] for i in range(len(data))], data.contract, t)
    assert check.result.findings == [], [f.lines() for f in check.result.findings]
    again = relabel_data(ShardDataset(mislabelled), t, REAL)
    assert again.written == () and sha(mislabelled) == after


def test_wrong_boundaries_are_refused_by_values_naming_what_they_are(mislabelled):
    before = sha(mislabelled)
    with pytest.raises(ContractMismatchError) as e:
        relabel_data(ShardDataset(mislabelled), tiny(L), (4, 8, 11), target_arg="T")
    msg = str(e.value)
    assert "aux[0]: relabel says boundary 4 (output of layer 3); the values are boundary 3" in msg
    assert "nothing written" in msg
    assert (
        f"fix: relabel them as what they are: eaglewire data relabel --data {mislabelled} --target T " in msg
    )
    assert msg.endswith("--aux-boundaries 3,7,10")
    assert sha(mislabelled) == before


def test_another_target_is_refused(mislabelled):
    """Same shape, other weights: the identity agrees, the values do not. Other shape: the identity says so."""
    before = sha(mislabelled)
    other_weights = make_tiny_target("llama", num_layers=L, seed=1)
    with pytest.raises(ContractMismatchError, match="the values are no boundary of this target"):
        relabel_data(ShardDataset(mislabelled), other_weights, REAL)
    deeper = tiny(14)
    with pytest.raises(ContractMismatchError, match="target.num_layers: contract=12 live=14"):
        relabel_data(ShardDataset(mislabelled), deeper, REAL, target_arg="T14")
    assert sha(mislabelled) == before


def test_a_list_of_another_length_or_out_of_range_is_refused_before_any_work(mislabelled):
    old = ShardDataset(mislabelled).contract
    with pytest.raises(ConfigError, match=r"2 boundaries, but .* stores 3 aux states \(its aux is 3 x Ht"):
        check_data_request(old, (3, 7), mislabelled)
    with pytest.raises(BoundaryError, match=r"--aux-boundaries \[3, 7, 13\]: \[13\] out of range 0..12"):
        check_data_request(old, (3, 7, 13), mislabelled)


def test_final_state_and_dtype_are_relabelled_too(tmp_path):
    """A post-norm final labelled pre-norm, captured in bfloat16 and labelled float32: one relabel fixes both,
    with the flags the doctor's fix names."""
    t32, t16 = tiny(L), tiny(L, "bfloat16")
    records = make_records(t16, LABELS, FinalState(L, "post"), n=2, length=16)
    data = shards(tmp_path / "d", build_contract(t32, LABELS), records)
    check = check_data_against_target([data[0], data[1]], data.contract, t32, data_path=tmp_path / "d")
    assert check.relabel is not None and check.relabel.endswith(
        "--aux-boundaries 2,6,9 --final-norm post --dtype bfloat16"
    )
    final = requested_final(data.contract.final, L, boundary=None, norm="post")
    relabel_data(data, t16, LABELS, final=final)
    new = ShardDataset(tmp_path / "d")
    assert new.contract.final == FinalState(L, "post") and new.contract.dtype == "bfloat16"
    assert check_data_against_target([new[0], new[1]], new.contract, t16).result.findings == []


def test_requested_final_names_the_flags():
    pre = FinalState(L, "pre")
    assert requested_final(pre, L, boundary=None, norm=None) == pre
    assert requested_final(FinalState(L - 1, "pre"), L, boundary=None, norm="post") == FinalState(L, "post")
    with pytest.raises(ConfigError, match="--final-boundary 7 with --final-norm post") as e:
        requested_final(pre, L, boundary=7, norm="post")
    assert "--final-norm pre with --final-boundary 7" in str(e.value)
    with pytest.raises(ConfigError, match="--final-boundary 7 with the final norm 'post'"):
        requested_final(FinalState(L, "post"), L, boundary=7, norm=None)
    with pytest.raises(BoundaryError, match="--final-boundary <= 12"):
        requested_final(pre, L, boundary=13, norm=None)


def test_a_marker_listing_the_contract_gets_its_checksums_refreshed(mislabelled):
    write_marker(mislabelled, OutputKind.SHARDS, ("contract.json", "manifest.json"))
    result = relabel_data(ShardDataset(mislabelled), tiny(L), REAL)
    assert result.written == ("manifest.json", "contract.json", "eaglewire.json")
    verify_files(mislabelled)  # the new files' sizes and sha256


@pytest.fixture
def draft(tmp_path) -> Path:
    t = tiny(L)
    contract = build_contract(t, LABELS)
    return save_draft(init_draft(t, contract), contract, tmp_path / "draft")


def test_draft_relabel_copies_config_and_weights_and_rebuilds_the_contract(draft, tmp_path):
    before = sha(draft)
    out = tmp_path / "draft-relabelled"
    result = relabel_draft(draft, tiny(L), REAL, out)
    assert sha(draft) == before  # the source is never written
    after = sha(out)
    assert after["model.safetensors"] == before["model.safetensors"]
    assert after["config.json"] == before["config.json"]
    model, contract = load_draft(out)  # checksums, contract vs config, fingerprint labels
    assert contract.aux_boundaries == REAL == result.new.aux_boundaries
    assert contract.final == result.old.final and contract.dtype == result.old.dtype
    original, _ = load_draft(draft)
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), original.state_dict().values(), strict=True)
    )
    with pytest.raises(ConfigError, match="holds an earlier eaglewire draft"):
        relabel_draft(draft, tiny(L), REAL, out)
    relabel_draft(draft, tiny(L), REAL, out, force=True)


def test_draft_relabel_refusals(draft, tmp_path):
    before = sha(draft)
    with pytest.raises(ConfigError, match="--out .*: is --draft"):
        relabel_draft(draft, tiny(L), REAL, draft)
    with pytest.raises(ConfigError, match="is inside --draft"):
        relabel_draft(draft, tiny(L), REAL, draft / "sub")
    with pytest.raises(
        ConfigError, match=r"2 boundaries, but the draft .* reads 3 aux states \(its fc.weight reads"
    ):
        relabel_draft(draft, tiny(L), (3, 7), tmp_path / "a")
    with pytest.raises(ContractMismatchError, match="not the target the draft"):
        relabel_draft(draft, tiny(14), REAL, tmp_path / "b")
    export_draft(draft, "sglang", tmp_path / "sglang")
    with pytest.raises(CheckpointError, match="a sglang export, not an eaglewire draft") as e:
        relabel_draft(tmp_path / "sglang", tiny(L), REAL, tmp_path / "c")
    assert "`eaglewire import --format sglang --src" in str(e.value)
    assert sha(draft) == before and not any((tmp_path / n).exists() for n in "abc")


def _parses(command: str) -> dict:
    """The command line as the real CLI parses it (no command runs)."""
    argv = shlex.split(command)
    assert argv[0] == "eaglewire"
    group = typer.main.get_command(app)
    ctx = group.make_context("eaglewire", argv[1:2], resilient_parsing=True)
    sub = group.get_command(ctx, argv[1])
    sub_ctx = sub.make_context(argv[1], argv[2:3], parent=ctx, resilient_parsing=True)
    leaf = sub.get_command(sub_ctx, argv[2])
    return leaf.make_context(argv[2], argv[3:], parent=sub_ctx).params


def test_the_doctors_fix_commands_parse_as_the_cli_reads_them(tmp_path):
    data = relabel_data_command(
        tmp_path / "my data", "smollm2", REAL, final=StateKey(L, "post"), declared_final=StateKey(L, "pre"),
        dtype="bfloat16",
    )  # fmt: skip
    assert _parses(data) == {
        "data": tmp_path / "my data", "target": "smollm2", "aux_boundaries": "3,7,10", "final_norm": "post",
        "final_boundary": None, "dtype": "bfloat16", "max_records": 4, "max_tokens": 128, "device": "auto",
    }  # fmt: skip
    draft = relabel_draft_command(tmp_path / "d", "/models/t", REAL)
    params = _parses(draft)
    assert params["draft"] == tmp_path / "d" and params["out"] == tmp_path / "d-relabelled"
    assert (params["target"], params["aux_boundaries"]) == ("/models/t", "3,7,10")


def test_labels_of_the_data_check_command_match_the_values():
    """The doctor's data check proposes exactly the relabel that then passes."""
    t = tiny(L)
    records = make_records(t, REAL, n=2, length=16)
    w = check_data_against_target(records, labelled(t, LABELS), t, data_path="D", target_arg="T")
    assert w.relabel == "eaglewire data relabel --data D --target T --aux-boundaries 3,7,10"
    ok = check_data_against_target(records, labelled(t, REAL), t)
    assert ok.result.findings == []


def test_a_draft_trained_on_mislabelled_data_is_clean_after_the_two_relabels(tmp_path):
    """The doctor's verdict "this draft was trained on mislabelled data", its two fix commands carried out
    (the draft rewired, the data relabelled), and the doctor again: nothing to report."""
    from eaglewire.doctor.draft_source import read_draft_source
    from eaglewire.doctor.run import diagnose
    from tests.unit.doctor.pipeline import mislabelled_world

    t = tiny(L)
    w = mislabelled_world(t, labels=LABELS, stored=REAL, learned=REAL)
    save_draft(w.draft, w.draft_contract, tmp_path / "draft")
    data = shards(tmp_path / "data", w.data_contract, w.records)

    def doctor(draft_dir: Path):
        model, _ = load_draft(draft_dir)
        return diagnose(
            target=t, records=ShardDataset(tmp_path / "data"), data_contract=ShardDataset(tmp_path / "data").contract,
            draft_source=read_draft_source(draft_dir), draft_model=model, accuracy_labels="tokens",
            data_path=tmp_path / "data", target_arg="T",
        )  # fmt: skip

    before = {f.check: f for f in doctor(tmp_path / "draft").findings}
    fix = before["draft.contract_vs_data_values"].fix
    assert relabel_draft_command(tmp_path / "draft", "T", REAL) in fix
    assert (
        f"relabel the data: eaglewire data relabel --data {tmp_path / 'data'} --target T --aux-boundaries 3,7,10"
        in fix
    )
    relabel_draft(tmp_path / "draft", t, REAL, tmp_path / "draft-relabelled")
    relabel_data(data, t, REAL)
    after = doctor(tmp_path / "draft-relabelled")
    assert after.findings == [], [f.lines() for f in after.findings]
