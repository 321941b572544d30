"""The engine table: which id rule each SGLang / vLLM release applies per target architecture, and which
boundaries its capture reaches. Every architecture family eaglewire supports (from its real transformers
config's `architectures[0]`) and a GLM-4-MoE-Lite config, against every row, both directions.

The expectations below are written out by hand from the engines' code (the rows' citations), not derived
from the table, so a changed row fails here.
"""

from __future__ import annotations

import pytest
import transformers

from eaglewire.contract.numbering import (
    ENGINE_RULES,
    Engine,
    engine_ids,
    engine_ids_rows,
    engine_readings,
    engine_rules,
    family_of,
    read_engine_ids,
    sglang_numbering,
)
from eaglewire.errors import BoundaryError
from tests.helpers.tiny import tiny_config

L = 8
SHIFTED = (3, 4, 5)  # not the defaults: the two SGLang rules write different ids for these


def _architecture(name: str) -> str:
    if name == "glm4_moe_lite":
        return str(transformers.Glm4MoeLiteConfig(architectures=["Glm4MoeLiteForCausalLM"]).architectures[0])
    return str(tiny_config(name, vocab_size=64, num_layers=L).architectures[0])


LAYER, PR, BOUND = "layer-output", "pr25454", "vllm"
# (engine, config, a release in the row) -> (rule, captures boundary 0, captures boundary L)
EXPECTED: dict[tuple[str, str, str], tuple[str | None, bool, bool]] = {
    ("sglang", "llama", "0.5.12"): (LAYER, False, False),
    ("sglang", "llama", "0.5.23"): (LAYER, True, False),
    ("sglang", "mistral", "0.5.10"): (LAYER, False, False),
    ("sglang", "mistral", "0.5.22"): (LAYER, True, False),
    ("sglang", "qwen2", "0.5.12"): (LAYER, True, False),
    ("sglang", "qwen3", "0.5.23"): (LAYER, True, False),
    ("sglang", "qwen3_moe", "0.5.12"): (LAYER, True, False),
    ("sglang", "deepseek_v3", "0.5.12"): (LAYER, False, False),
    ("sglang", "deepseek_v3", "0.5.13"): (PR, False, False),
    ("sglang", "deepseek_v3", "0.5.23"): (PR, True, False),
    ("sglang", "glm4_moe_lite", "0.5.12"): (LAYER, False, False),
    ("sglang", "glm4_moe_lite", "0.5.20"): (PR, False, False),
    ("sglang", "glm4_moe_lite", "0.5.23"): (PR, True, False),
    ("vllm", "llama", "0.33.0"): (BOUND, True, True),
    ("vllm", "mistral", "0.33.0"): (BOUND, True, True),
    ("vllm", "qwen2", "0.33.0"): (BOUND, True, True),
    ("vllm", "qwen3", "0.33.0"): (BOUND, True, True),
    ("vllm", "qwen3_moe", "0.33.0"): (BOUND, True, True),
    ("vllm", "deepseek_v3", "0.33.0"): (BOUND, False, True),
    ("vllm", "glm4_moe_lite", "0.33.0"): (None, False, False),
}
WRITE = {LAYER: lambda bs: tuple(b - 1 for b in bs), BOUND: lambda bs: tuple(bs)}


def _expected_ids(rule: str, bs: tuple[int, ...]) -> tuple[int, ...]:
    if rule == PR:  # +1 only when the first id is 1: ids start at 1 exactly when the boundaries start at 2
        return tuple(b - 1 for b in bs) if bs[0] == 2 else tuple(bs)
    return WRITE[rule](bs)


def test_every_row_is_covered_by_an_expectation() -> None:
    covered = {
        rule
        for (engine, config, version) in EXPECTED
        for rule in engine_rules(engine, _architecture(config), version)
    }
    assert covered == set(ENGINE_RULES)


@pytest.mark.parametrize(("engine", "config", "version"), list(EXPECTED))
def test_row_both_directions(engine: str, config: str, version: str) -> None:
    arch = _architecture(config)
    rule_name, embedding, last = EXPECTED[(engine, config, version)]
    (row,) = engine_rules(engine, arch, version)
    assert row.covers(row.first) and row.covers(row.last)
    if rule_name is None:  # the engine serves no EAGLE-3 draft for this target
        assert row.numbering is None
        with pytest.raises(BoundaryError, match="SupportsEagle3"):
            engine_ids(engine, arch, (2, 4, 5), L, version)
        return
    assert row.numbering == rule_name
    for bs in ((2, 4, 5), SHIFTED, (1, 3, 6)):
        if rule_name == PR and bs[0] == 1:
            with pytest.raises(BoundaryError, match="start at 1"):
                engine_ids(engine, arch, bs, L, version)
            continue
        ids = engine_ids(engine, arch, bs, L, version).ids  # write
        assert ids == _expected_ids(rule_name, bs)
        back = read_engine_ids(row, ids, L)  # read
        assert back.boundaries == bs and back.problem is None
    # boundary 0 and boundary L: written only where the release captures them
    for bs, captured in (((0, 3, 5), embedding), ((2, 4, L), last)):
        if captured:
            ids = engine_ids(engine, arch, bs, L, version).ids
            assert read_engine_ids(row, ids, L).boundaries == bs
        else:
            with pytest.raises(BoundaryError, match=r"(?s)boundary (0|8) .*the draft gets 2 of its 3"):
                engine_ids(engine, arch, bs, L, version)


def test_qwen3_ids_read_as_layer_outputs_by_every_sglang_release() -> None:
    """The issue's case: boundaries [3, 4, 5] on a Qwen3 target are SGLang ids [2, 3, 4] in every release;
    ids [3, 4, 5] (what a release-generation reading wrote) would be read as [4, 5, 6]."""
    arch = _architecture("qwen3")
    assert engine_ids("sglang", arch, SHIFTED, L).ids == (2, 3, 4)
    assert {r.boundaries for r in engine_readings("sglang", arch, SHIFTED, L)} == {(4, 5, 6)}
    assert sglang_numbering(arch, "0.5.23") == LAYER


def test_deepseek_without_a_release_refuses_showing_each_reading() -> None:
    arch = _architecture("deepseek_v3")
    with pytest.raises(BoundaryError) as e:
        engine_ids("sglang", arch, SHIFTED, L)
    text = str(e.value)
    assert "0.5.10-0.5.12 captures them from ids [2, 3, 4]" in text
    assert "0.5.14-0.5.23 captures them from ids [3, 4, 5]" in text
    assert "--sglang-version 0.5.12" in text and "--sglang-version 0.5.23" in text
    # the default boundaries start at 2: ids [1, 3, 4] read alike by every release
    assert engine_ids("sglang", arch, (2, 4, 5), L).ids == (1, 3, 4)


def test_sglang_cannot_capture_the_last_layer_and_names_the_alternatives() -> None:
    with pytest.raises(BoundaryError) as e:
        engine_ids("sglang", "LlamaForCausalLM", (2, 4, 7), 7, "0.5.23")
    text = str(e.value)
    assert "range(self.start_layer, self.end_layer)" in text and "models/llama.py:486" in text
    assert "--aux-boundaries 2,4,6" in text and "eaglewire export --format vllm" in text
    assert engine_ids("vllm", "LlamaForCausalLM", (2, 4, 7), 7).ids == (2, 4, 7)


def test_ids_out_of_layer_order_are_reordered_by_both_engines() -> None:
    for engine in Engine:
        (row,) = engine_rules(engine, "LlamaForCausalLM", "0.5.23" if engine is Engine.SGLANG else "0.33.0")
        ids = (4, 1, 2) if engine is Engine.SGLANG else (5, 2, 3)
        got = read_engine_ids(row, ids, L)
        assert got.boundaries == (2, 3, 5) and "layer order" in (got.problem or "")
        with pytest.raises(BoundaryError, match="increasing boundaries"):
            engine_ids(engine, "LlamaForCausalLM", (5, 2, 3), L)


def test_unread_release_and_unknown_architecture_are_refused() -> None:
    with pytest.raises(BoundaryError, match=r"0\.5\.9 is not in eaglewire's table .*0\.5\.10-0\.5\.23"):
        engine_ids("sglang", "LlamaForCausalLM", (2, 4, 5), L, "0.5.9")
    with pytest.raises(BoundaryError, match="not in eaglewire's engine table"):
        family_of("GPT2LMHeadModel")
    assert family_of("qwen3_moe") == family_of("Qwen3MoeForCausalLM") == "qwen3-moe"


def test_ids_rows_per_release_with_an_architecture() -> None:
    rows = {r.label: r for r in engine_ids_rows(SHIFTED, L, "DeepseekV3ForCausalLM")}
    assert rows["sglang 0.5.10-0.5.12"].ids == (2, 3, 4)
    assert rows["sglang 0.5.14-0.5.23"].ids == (3, 4, 5)
    assert rows["sglang (any release read)"].ids is None
    assert rows["vllm 0.33.0"].ids == SHIFTED
    grouped = {r.label: r.ids for r in engine_ids_rows(SHIFTED, L)}
    assert grouped["sglang (llama, mistral, qwen2, qwen3, qwen3-moe)"] == (2, 3, 4)


def test_the_docs_table_has_every_row() -> None:
    """docs/numbering.md is the table for people: every row's releases appear there (README links it)."""
    from pathlib import Path

    text = (Path(__file__).parents[3] / "docs" / "numbering.md").read_text()
    for row in ENGINE_RULES:
        assert f"| {row.versions} |" in text, row.label
