import json

import pytest

from eaglewire.contract.contract import (
    Contract,
    FinalState,
    TargetIdentity,
    contract_diff,
    require_same_wiring,
)
from eaglewire.errors import ConfigError, ContractMismatchError


def identity(**kw):
    base = dict(
        architecture="LlamaForCausalLM",
        num_layers=30,
        hidden_size=576,
        vocab_size=49152,
        config_hash="c",
        tokenizer_hash="t",
        chat_template_hash="h",
    )
    base.update(kw)
    return TargetIdentity(**base)


def make(**kw):
    base = dict(target=identity(), aux_boundaries=(2, 15, 27), final=FinalState(30, "pre"), dtype="bfloat16")
    base.update(kw)
    return Contract(**base)


def test_json_round_trip(tmp_path):
    c = make()
    c.save(tmp_path)
    assert Contract.load(tmp_path) == c
    assert c.aux_width == 3 * 576


def test_unknown_key_names_the_field(tmp_path):
    data = make().to_json()
    data["aux_layers"] = [1, 2]
    (tmp_path / "contract.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="aux_layers: unknown key"):
        Contract.load(tmp_path)


def test_missing_key_names_the_field(tmp_path):
    data = make().to_json()
    del data["target"]["hidden_size"]
    (tmp_path / "contract.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"target\.hidden_size: required key missing"):
        Contract.load(tmp_path)


def test_wrong_type_names_the_field(tmp_path):
    data = make().to_json()
    data["aux_boundaries"] = [2, "15", 27]
    (tmp_path / "contract.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"aux_boundaries\[1\]: expected an integer"):
        Contract.load(tmp_path)


def test_invalid_json_names_line(tmp_path):
    (tmp_path / "contract.json").write_text('{\n  "target": ,\n}')
    with pytest.raises(ConfigError, match=r"contract.json:2:\d+: invalid JSON"):
        Contract.load(tmp_path)


def test_cross_field_checks():
    with pytest.raises(ConfigError, match="out of range"):
        make(aux_boundaries=(2, 31))
    with pytest.raises(ConfigError, match="duplicated"):
        make(aux_boundaries=(2, 2, 27))
    with pytest.raises(ConfigError, match=r"final.norm='post' needs final.boundary"):
        make(final=FinalState(29, "post"))
    with pytest.raises(ConfigError, match="dtype"):
        make(dtype="int8")


def test_diff_names_each_field():
    a, b = make(), make(aux_boundaries=(3, 15, 27), target=identity(tokenizer_hash="other"))
    diffs = contract_diff(a, b, names=("draft", "data"))
    assert any(d.startswith("aux_boundaries: draft=[2, 15, 27] data=[3, 15, 27]") for d in diffs)
    assert any(d.startswith("target.tokenizer_hash") for d in diffs)
    with pytest.raises(ContractMismatchError, match="disagree"):
        require_same_wiring(a, b)
    require_same_wiring(a, make(target=identity(name="elsewhere")))


def _fingerprinted(aux_labels, final=("final", 30, "pre")):
    """`make()` with a fingerprint whose entries carry these labels (values are irrelevant here)."""
    from eaglewire.contract.fingerprint import Fingerprint, TensorFingerprint

    def entry(name, boundary, norm="pre"):
        return TensorFingerprint(
            name=name, boundary=boundary, norm=norm, token_norms=(1.0,), leading=(0.0,) * 8
        )

    tensors = [entry(f"aux[{i}]", b) for i, b in enumerate(aux_labels)] + [entry(*final)]
    return make(fingerprint=Fingerprint(probe_ids=(1,), dtype="bfloat16", tensors=tuple(tensors)))


def test_a_contract_agreeing_with_its_fingerprint_labels_loads(tmp_path):
    c = _fingerprinted((2, 15, 27))
    c.save(tmp_path)
    assert Contract.load(tmp_path) == c


@pytest.mark.parametrize(
    "labels, final, shown",
    [
        ((3, 15, 27), ("final", 30, "pre"), "are labelled [3, 15, 27]"),  # the aux list was edited
        ((2, 15), ("final", 30, "pre"), "are labelled [2, 15]"),  # one aux state fewer
        ((2, 15, 27), ("final", 30, "post"), "'final' is labelled boundary 30 post-norm"),
    ],
)
def test_a_contract_contradicting_its_fingerprint_labels_is_refused_with_both(tmp_path, labels, final, shown):
    """Checked where contracts are loaded (`from_json`): every command that reads a contract.json."""
    _fingerprinted(labels, final).save(tmp_path)
    with pytest.raises(ContractMismatchError, match="disagrees with its own fingerprint") as e:
        Contract.load(tmp_path)
    assert str(tmp_path / "contract.json") in str(e.value) and shown in str(e.value)
    assert "aux_boundaries [2, 15, 27]" in str(e.value) or "final = boundary 30 pre-norm" in str(e.value)
