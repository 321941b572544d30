"""The candidate miswirings the served check replays, and the fixes they carry (pure: no model)."""

from __future__ import annotations

from pathlib import Path

from eaglewire.doctor.miswirings import (
    AuxSource,
    ServedSetup,
    Wiring,
    all_candidates,
    aux_candidates,
    declared_spec,
    spec_candidates,
)
from eaglewire.engine.spec_args import SpecArgs, sglang_effective_spec_args

L = 8


def by_fault(setup: ServedSetup) -> dict[str, list[Wiring | None]]:
    out: dict[str, list[Wiring | None]] = {}
    for c in all_candidates(setup, identity_map=True):
        out.setdefault(c.fault, []).append(c.wiring)
    return out


def test_aux_candidates_of_a_vllm_export() -> None:
    setup = ServedSetup((2, 4, 5), L, "vllm", config_path=Path("/x/export/config.json"), config_ids=(2, 4, 5))
    found = by_fault(setup)
    assert found["aux.shifted"] == [Wiring.of((3, 5, 6)), Wiring.of((1, 3, 4))]
    assert len(found["aux.order"]) == 5 and Wiring.of((5, 4, 2)) in found["aux.order"]
    assert found["aux.embedding_first"] == [Wiring.of((0, 4, 5))]
    assert found["aux.embedding_missing"] == [None]  # a 3-state fc cannot be fed 2 states: not replayed
    assert "aux.post_norm" not in found  # the draft reads no boundary-L state
    assert "aux.config_reading" not in found  # vLLM reads the ids as trained
    assert [w.vocab_map for w in found["vocab.d2t_as_absolute"] + found["vocab.absolute_as_d2t"] if w] == [
        "d2t_as_absolute",
        "absolute_as_d2t",
    ]
    shifted = next(c for c in aux_candidates(setup) if c.fault == "aux.shifted")
    assert (
        shifted.fix
        == "set eagle_aux_hidden_state_layer_ids in /x/export/config.json to [2, 4, 5] (vLLM: id = boundary)"
    )
    missing = next(c for c in aux_candidates(setup) if c.fault == "aux.embedding_missing")
    assert "fc reads 3 x target hidden" in missing.impossible


def test_post_norm_candidate_for_a_draft_that_reads_the_last_layer() -> None:
    found = by_fault(ServedSetup((2, 4, L), L, "vllm"))
    assert found["aux.post_norm"] == [Wiring((AuxSource(2), AuxSource(4), AuxSource(L, "post")))]
    assert Wiring.of((3, 5, L + 1)) not in found["aux.shifted"]  # past the last boundary: not a candidate


def test_the_other_sglang_reading() -> None:
    """A DeepSeek-V3 draft trained on [3, 5, 6]; its SGLang export says [2, 4, 5] (layer outputs, as SGLang before
    PR #25454 reads them). SGLang 0.5.13 and later (PR #25454) read a first id other than 1 as boundaries: the
    candidate, and the fix names each release range's ids (no list reads alike in all of them)."""
    setup = ServedSetup((3, 5, 6), L, "sglang", "DeepseekV3ForCausalLM", Path("e/config.json"), (2, 4, 5))
    readings = [c for c in aux_candidates(setup) if c.fault == "aux.config_reading"]
    assert {c.wiring for c in readings} == {Wiring.of((2, 4, 5))}
    assert all("reads [2, 4, 5] as boundaries [2, 4, 5]" in c.what for c in readings)
    assert any("SGLang 0.5.13" in c.what for c in readings)
    assert "eagle_config.eagle_aux_hidden_state_layer_ids in e/config.json" in readings[0].fix
    assert (
        "[2, 4, 5] for SGLang 0.5.10-0.5.12" in readings[0].fix
        and "[3, 5, 6] for SGLang 0.5.13" in readings[0].fix
    )


def test_sglang_ids_every_release_reads_alike() -> None:
    setup = ServedSetup((2, 4, 5), L, "sglang", "LlamaForCausalLM", config_ids=(1, 3, 5))
    readings = [c for c in aux_candidates(setup) if c.fault == "aux.config_reading"]
    assert {c.wiring for c in readings} == {Wiring.of((2, 4, 6))}  # every release: the edited last id
    assert "to [1, 3, 4] (every SGLang release read" in readings[0].fix


def test_a_silently_rewritten_draft_length() -> None:
    requested = (1, 1, 16)  # the field report's flags
    effective, _ = sglang_effective_spec_args(*requested)
    assert effective == SpecArgs.chain(1)
    (c,) = spec_candidates(
        ServedSetup((2, 4, 5), L, "sglang", requested_spec=requested, effective_spec=effective)
    )
    assert c.wiring is not None and c.wiring.spec == SpecArgs.chain(1)
    assert "--speculative-num-steps 15 --speculative-eagle-topk 1 --speculative-num-draft-tokens 16" in c.fix
    assert declared_spec(requested, effective) == SpecArgs.chain(15)  # what the flags asked for
    assert declared_spec(None, SpecArgs(3, 2, 5)) == SpecArgs(3, 2, 5)  # nothing asked: what runs
    assert spec_candidates(ServedSetup((2, 4, 5), L, "sglang", requested_spec=(3, 1, 4),
                                       effective_spec=SpecArgs.chain(3))) == []  # fmt: skip


def test_the_default_prompts_mix_chat_and_code() -> None:
    from eaglewire.doctor.served import default_prompts

    mix = default_prompts()
    ids = [p.prompt_id for p in mix.prompts]
    assert len(ids) == 10 and len(set(ids)) == 10
    assert (
        sum(i.startswith("mt-bench:") for i in ids) == 6 and sum(i.startswith("humaneval:") for i in ids) == 4
    )
    assert {p.category for p in mix.prompts if p.category} >= {"writing", "roleplay", "reasoning", "math"}
    assert [p.prompt_id for p in default_prompts(3).prompts] == ids[:3] and ids[2].startswith("humaneval:")
