"""SGLang lint: server arguments read with SGLang's rewrite rules, layer ids with the engine table's rows for
the target's architecture (the field reports' target is DeepSeek-V3-shaped: Kimi-K2.5, 61 layers)."""

from __future__ import annotations

import pytest

from eaglewire.doctor.sglang_lint import lint_sglang, parse_sglang_args
from eaglewire.errors import ConfigError
from tests.unit.doctor.pipeline import tiny, write_sglang_config

L61 = 61
TRAINED_61 = (3, 31, 59)  # what the field reports' draft was really trained on
DEEPSEEK = (
    "DeepseekV3ForCausalLM"  # SGLang 0.5.10-0.5.12 add 1 to every id, 0.5.13+ only when the first id is 1
)
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


def test_field_report_ids_read_right_by_sglang_before_0_5_13(tmp_path):
    lint = lint_sglang(
        _with_draft(tmp_path, [2, 30, 58]),
        draft=None,
        num_layers=L61,
        trained=TRAINED_61,
        version="0.5.12",
        architecture=DEEPSEEK,
    )
    assert lint.result.findings == []
    assert lint.readings[0].boundaries == TRAINED_61
    assert lint.readings[0].label == "SGLang 0.5.12 (0.5.10-0.5.12 read)"


def test_same_config_served_by_sglang_0_5_23_reads_2_30_58(tmp_path):
    lint = lint_sglang(
        _with_draft(tmp_path, [2, 30, 58]),
        draft=None,
        num_layers=L61,
        trained=TRAINED_61,
        version="0.5.23",
        architecture=DEEPSEEK,
    )
    (f,) = lint.result.findings
    assert f.check == "serving.sglang.layer_ids"
    assert "SGLang 0.5.23 (0.5.14-0.5.23 read) feeds the draft other states" in f.what
    assert "1 boundary shallower" in f.what
    assert "boundaries 2 (output of layer 1)" in f.actual
    assert '"eagle_aux_hidden_state_layer_ids": [3, 31, 59]' in f.fix
    assert lint.readings[0].boundaries == (2, 30, 58)


def test_release_not_stated_and_readings_differ_is_a_finding(tmp_path):
    lint = lint_sglang(
        _with_draft(tmp_path, [2, 30, 58]),
        draft=None,
        num_layers=L61,
        trained=TRAINED_61,
        architecture=DEEPSEEK,
    )
    assert {r.label: r.boundaries for r in lint.readings} == {
        "SGLang 0.5.10-0.5.12": (3, 31, 59),
        "SGLang 0.5.13-0.5.23": (2, 30, 58),  # 0.5.13 and 0.5.14+ read these ids alike: one reading
    }
    assert "serving.sglang.layer_ids" in checks(lint)
    lint = lint_sglang(
        _with_draft(tmp_path, [2, 30, 58]), draft=None, num_layers=L61, trained=None, architecture=DEEPSEEK
    )
    (f,) = lint.result.findings
    assert f.what == f"SGLang releases read these ids as different boundaries on this {DEEPSEEK} target"
    assert f.fix.startswith("pass --sglang-version")


def test_the_same_ids_on_a_llama_target_read_alike(tmp_path):
    """The rule is per architecture: Llama targets add 1 to every id in every release read."""
    lint = lint_sglang(
        _with_draft(tmp_path, [2, 30, 58]),
        draft=None,
        num_layers=L61,
        trained=TRAINED_61,
        architecture="LlamaForCausalLM",
    )
    assert lint.result.findings == []
    (r,) = lint.readings
    assert r.label == "SGLang 0.5.10-0.5.23 (every release read)" and r.boundaries == TRAINED_61


def test_the_minus_one_embedding_fix(tmp_path):
    """[-1, 2, 30] on DeepSeek: SGLang before 0.5.13 reads boundary 0 (its forward crashes on it) and 3/31,
    not what the draft was trained on; 0.5.13+ reads -1 as a capture point that does not exist."""
    lint = lint_sglang(
        _with_draft(tmp_path, [-1, 2, 30]),
        draft=None,
        num_layers=L61,
        trained=TRAINED_61,
        architecture=DEEPSEEK,
    )
    by_label = {r.label: r for r in lint.readings}
    old = by_label["SGLang 0.5.10-0.5.12"]
    assert old.boundaries is None and "TypeError" in (old.problem or "")
    newer = by_label["SGLang 0.5.13-0.5.23"]
    assert newer.boundaries is None and "[-1] name no boundary" in (newer.problem or "")
    assert all(f.check == "serving.sglang.layer_ids" for f in lint.result.findings)
    old_fix = next(f.fix for f in lint.result.findings if "0.5.10-0.5.12" in f.what)
    assert "[2, 30, 58]" in old_fix


def test_no_ids_means_sglang_defaults(tmp_path):
    lint = lint_sglang(
        _with_draft(tmp_path, None), draft=None, num_layers=L61, trained=(2, 30, 58), architecture=DEEPSEEK
    )
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


def test_every_release_agrees_gives_one_finding(tmp_path):
    d = write_sglang_config(tmp_path / "sgl", [1, 5, 8], target=tiny(12))
    args = f"{GOOD} --speculative-draft-model-path {d}"
    lint = lint_sglang(args, draft=None, num_layers=12, trained=(3, 7, 10), architecture=DEEPSEEK)
    (r,) = lint.readings
    assert r.label == "SGLang 0.5.10-0.5.23 (every release read)" and r.boundaries == (2, 6, 9)
    (f,) = lint.result.findings
    assert "every column is 1 boundary shallower than in training" in f.what
    # no id list means (3, 7, 10) to every DeepSeek release: the fix names the releases
    assert "--sglang-version 0.5.12" in f.fix and "--sglang-version 0.5.23" in f.fix
    # on a Llama target (or for boundaries every release reads alike) one id list fixes it
    for arch, trained, ids in (
        ("LlamaForCausalLM", (3, 7, 10), "[2, 6, 9]"),
        (DEEPSEEK, (2, 7, 10), "[1, 6, 9]"),
    ):
        lint = lint_sglang(args, draft=None, num_layers=12, trained=trained, architecture=arch)
        (f,) = lint.result.findings
        assert (
            f.fix
            == f'set "eagle_config": {{"eagle_aux_hidden_state_layer_ids": {ids}}} in the draft\'s config.json'
        )


def test_last_layer_ids_are_a_finding(tmp_path):
    """Id 11 on a 12-layer target is capture point 12 = L: SGLang's layer loop never reaches it."""
    d = write_sglang_config(tmp_path / "sgl", [1, 5, 11], target=tiny(12))
    lint = lint_sglang(
        f"{GOOD} --speculative-draft-model-path {d}",
        draft=None,
        num_layers=12,
        trained=(2, 6, 12),
        architecture="LlamaForCausalLM",
    )
    (r,) = lint.readings
    assert r.boundaries is None and "the draft gets 2 of its 3 aux states" in (r.problem or "")
    (f,) = lint.result.findings
    assert "no SGLang ids serve it" in f.fix and "--aux-boundaries 2,6,11" in f.fix
