"""SGLang lint: server arguments read with SGLang's rewrite rules, layer ids with both generations' rules."""

from __future__ import annotations

import pytest

from eaglewire.doctor.sglang_lint import lint_sglang, parse_sglang_args
from eaglewire.errors import ConfigError
from tests.unit.doctor.pipeline import tiny, write_sglang_config

L61 = 61
TRAINED_61 = (3, 31, 59)  # what the field reports' draft was really trained on
GOOD = "--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"


def checks(lint):
    return [f.check for f in lint.result.findings]


def test_consistent_args_no_draft_no_finding():
    lint = lint_sglang(GOOD, draft=None, num_layers=None, trained=None)
    assert lint.result.findings == []
    rows = {r.item: r for r in lint.result.rows}
    assert (
        rows["--speculative-num-draft-tokens"].declared == "4"
        and rows["--speculative-num-draft-tokens"].actual == "4"
    )


def test_field_report_num_steps_1_rewrites_16_draft_tokens_to_2():
    args = (
        "python -m sglang.launch_server --model-path /m --tp 8 --speculative-algorithm EAGLE3 "
        "--speculative-num-steps 1 --speculative-num-draft-tokens 16 --speculative-eagle-topk 1 --mem-fraction-static 0.8"
    )
    lint = lint_sglang(args, draft=None, num_layers=None, trained=None)
    (f,) = lint.result.findings
    assert f.check == "serving.sglang.num_draft_tokens"
    assert f.what == "SGLang silently rewrites --speculative-num-draft-tokens 16 to 2"
    assert "--speculative-num-steps 15" in f.fix and "--speculative-num-draft-tokens 16" in f.fix
    row = next(r for r in lint.result.rows if r.item == "--speculative-num-draft-tokens")
    assert (row.declared, row.actual, row.ok) == ("16", "2", False)


def test_auto_chosen_values_are_shown_not_flagged():
    lint = lint_sglang(
        "--speculative-algorithm EAGLE3",
        draft=None,
        num_layers=None,
        trained=None,
        architecture="LlamaForCausalLM",
    )
    assert lint.result.findings == []
    rows = {r.item: r.actual for r in lint.result.rows}
    assert rows["--speculative-num-steps"] == "5" and rows["--speculative-eagle-topk"] == "4"


@pytest.mark.parametrize(
    ("args", "check"),
    [
        (
            "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
            "serving.sglang.algorithm",
        ),
        (
            "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
            "serving.sglang.algorithm",
        ),
        (
            "--speculative-algorithm EAGLE3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8",
            "serving.sglang.spec_args",
        ),
        (
            GOOD.replace("topk 1", "topk 4").replace("tokens 4", "tokens 8")
            + " --attention-backend trtllm_mha",
            "serving.sglang.attention_backend",
        ),
        (
            GOOD.replace("topk 1", "topk 4").replace("tokens 4", "tokens 8")
            + " --page-size 64 --attention-backend flashmla",
            "serving.sglang.page_size",
        ),
    ],
)
def test_refused_and_wrong_settings(args, check):
    lint = lint_sglang(args, draft=None, num_layers=None, trained=None)
    assert check in checks(lint), [f.lines() for f in lint.result.findings]


def test_topk_tree_on_paged_flashinfer_is_fine():
    args = (
        GOOD.replace("topk 1", "topk 4").replace("tokens 4", "tokens 8")
        + " --page-size 64 --attention-backend=flashinfer"
    )
    assert lint_sglang(args, draft=None, num_layers=None, trained=None).result.findings == []


def test_parse_abbreviations_and_errors():
    a = parse_sglang_args(
        "--speculative-algo EAGLE3 --speculative-draft /d --speculative-num-steps=2 --speculative-foo 1"
    )
    assert (a.algorithm, a.draft_model_path, a.num_steps, a.other_speculative) == (
        "EAGLE3",
        "/d",
        2,
        ("--speculative-foo",),
    )
    with pytest.raises(ConfigError, match="expects an integer"):
        parse_sglang_args("--speculative-num-steps two")
    with pytest.raises(ConfigError, match="cannot split"):
        parse_sglang_args('--speculative-algorithm "EAGLE3')


def _with_draft(tmp_path, ids):
    d = write_sglang_config(tmp_path / "sgl", ids, target=tiny(12))
    return f"{GOOD} --speculative-draft-model-path {d}"


def test_field_report_ids_legacy_reading_is_right(tmp_path):
    lint = lint_sglang(
        _with_draft(tmp_path, [2, 30, 58]),
        draft=None,
        num_layers=L61,
        trained=TRAINED_61,
        generation="legacy",
    )
    assert lint.result.findings == []
    assert lint.readings[0].boundaries == TRAINED_61


def test_same_config_served_by_sglang_with_pr25454_reads_2_30_58(tmp_path):
    lint = lint_sglang(
        _with_draft(tmp_path, [2, 30, 58]),
        draft=None,
        num_layers=L61,
        trained=TRAINED_61,
        generation="pr25454",
    )
    (f,) = lint.result.findings
    assert f.check == "serving.sglang.layer_ids"
    assert "SGLang with PR #25454 feeds the draft other states" in f.what and "1 boundary shallower" in f.what
    assert "boundaries 2 (output of layer 1)" in f.actual
    assert '"eagle_aux_hidden_state_layer_ids": [3, 31, 59]' in f.fix
    assert lint.readings[0].boundaries == (2, 30, 58)


def test_generation_not_stated_and_readings_differ_is_a_finding(tmp_path):
    lint = lint_sglang(_with_draft(tmp_path, [2, 30, 58]), draft=None, num_layers=L61, trained=TRAINED_61)
    assert {r.boundaries for r in lint.readings} == {(3, 31, 59), (2, 30, 58)}
    assert "serving.sglang.layer_ids" in checks(lint)
    lint = lint_sglang(_with_draft(tmp_path, [2, 30, 58]), draft=None, num_layers=L61, trained=None)
    (f,) = lint.result.findings
    assert f.what == "SGLang generations read these ids as different boundaries"


def test_the_minus_one_embedding_fix(tmp_path):
    """[-1, 2, 30]: legacy SGLang reads boundary 0 (which stock SGLang cannot capture) and 3/31,
    not what the draft was trained on; PR #25454 cannot read -1 at all."""
    lint = lint_sglang(_with_draft(tmp_path, [-1, 2, 30]), draft=None, num_layers=L61, trained=TRAINED_61)
    by_label = {r.label: r for r in lint.readings}
    legacy = by_label["SGLang before PR #25454"]
    assert legacy.boundaries == (0, 3, 31) and "not captured by stock SGLang" in (legacy.problem or "")
    assert by_label["SGLang with PR #25454"].boundaries is None
    whats = [f.what for f in lint.result.findings]
    assert any(
        "before PR #25454 feeds the draft other states" in w and "not captured by stock SGLang" in w
        for w in whats
    )
    legacy_fix = next(f.fix for f in lint.result.findings if "before PR #25454" in f.what)
    assert "[2, 30, 58]" in legacy_fix


def test_no_ids_means_sglang_defaults(tmp_path):
    lint = lint_sglang(_with_draft(tmp_path, None), draft=None, num_layers=L61, trained=(2, 30, 58))
    assert lint.result.findings == []
    assert all(r.boundaries == (2, 30, 58) for r in lint.readings)


def test_eaglewire_draft_dir_is_not_servable(tmp_path):
    d = tmp_path / "ew"
    d.mkdir()
    (d / "config.json").write_text('{"format": "eaglewire-eagle3"}')
    lint = lint_sglang(
        f"{GOOD} --speculative-draft-model-path {d}", draft=None, num_layers=12, trained=(2, 6, 9)
    )
    (f,) = lint.result.findings
    assert f.check == "serving.sglang.draft_format" and "eaglewire export" in f.fix


def test_both_generations_agree_gives_one_finding(tmp_path):
    d = write_sglang_config(tmp_path / "sgl", [1, 5, 8], target=tiny(12))
    lint = lint_sglang(
        f"{GOOD} --speculative-draft-model-path {d}", draft=None, num_layers=12, trained=(3, 7, 10)
    )
    (r,) = lint.readings
    assert r.label == "SGLang (both generations)" and r.boundaries == (2, 6, 9)
    (f,) = lint.result.findings
    assert "every column is 1 boundary shallower than in training" in f.what
    # no id list means (3, 7, 10) to both generations: the fix names each one
    assert "SGLang before PR #25454: set" in f.fix and "[2, 6, 9]" in f.fix and "[3, 7, 10]" in f.fix
    # for boundaries both read alike, one id list fixes it
    lint = lint_sglang(
        f"{GOOD} --speculative-draft-model-path {d}", draft=None, num_layers=12, trained=(2, 7, 10)
    )
    (f,) = lint.result.findings
    assert (
        f.fix
        == 'set "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 6, 9]} in the draft\'s config.json'
    )
