"""`eaglewire doctor` on real files: target directory, shard dataset, eaglewire draft, SGLang export.

Exit 0 when everything matches, 1 with a finding (each printed with its fix), 2 on invalid input.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from eaglewire.cli import app
from eaglewire.contract.contract import FinalState
from eaglewire.data.shards import ShardWriter
from eaglewire.data.types import ShardContent
from eaglewire.doctor.run import DoctorOptions, run_doctor
from eaglewire.draft.init import init_draft
from eaglewire.draft.io import save_draft
from eaglewire.errors import ConfigError
from eaglewire.export.exporting import export_draft
from tests.helpers.tiny import save_tiny_target
from tests.unit.doctor.pipeline import labelled, make_records, tiny

DEFAULT = (2, 6, 9)
ARGS = "--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
runner = CliRunner()


def write_shards(directory, contract, records):
    writer = ShardWriter(directory, contract, plan={"test": "doctor"}, total_records=len(records))
    writer.write(0, 0, ShardContent.from_records(records))
    writer.finish()
    return directory


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    t = tiny(12)
    root = tmp_path_factory.mktemp("cli")
    save_tiny_target(t, root / "target")
    good = labelled(t, DEFAULT, fingerprint=True)
    records = make_records(t, DEFAULT, n=3, length=24)
    write_shards(root / "data", good, records)
    # a dataset whose labels are off by one boundary (states really at 3/7/10)
    write_shards(root / "shifted", good, make_records(t, (3, 7, 10), FinalState(12, "pre"), n=3, length=24))
    save_draft(init_draft(t, good), good, root / "draft")
    export_draft(root / "draft", "sglang", root / "sglang")
    return root


def invoke(*args):
    return runner.invoke(app, ["doctor", *map(str, args)])


def test_everything_matches_exit_0(files):
    r = invoke(
        "--draft", files / "draft", "--target", files / "target", "--data", files / "data",
        "--sglang-args", f"{ARGS} --speculative-draft-model-path {files / 'sglang'}", "--json",
    )  # fmt: skip
    out = json.loads(r.stdout)
    assert r.exit_code == 0, json.dumps(out["findings"], indent=1)
    assert out["ok"] is True
    assert [c["name"] for c in out["checks"]] == [
        "data vs target",
        "draft vs target",
        "serving: sglang",
        "draft vs data",
    ]
    assert all(c["status"] == "ok" for c in out["checks"])


def test_finding_exit_1_with_fix_and_verdict_table(files):
    r = invoke("--target", files / "target", "--data", files / "shifted")
    assert r.exit_code == 1, r.output
    assert "[error] data.aux: every column is 1 boundary deeper than in its label" in r.output
    # the final state's label was right: no flag for it
    assert (
        "fix: the tensors are right, the labels are wrong: relabel them (proven by values first; the tensors are "
        f"not touched): eaglewire data relabel --data {files / 'shifted'} --target {files / 'target'} "
        "--aux-boundaries 3,7,10 (a draft trained" in r.output
    )
    assert "doctor verdict" in r.output and "FINDING" in r.output


def test_serving_lint_alone(files):
    r = invoke(
        "--sglang-args", ARGS.replace("num-steps 3", "num-steps 1").replace("tokens 4", "tokens 16"), "--json"
    )
    assert r.exit_code == 1
    (f,) = json.loads(r.stdout)["findings"]
    assert f["check"] == "serving.sglang.num_draft_tokens" and f["actual"].startswith("2:")


def test_trace_prints_text_and_json_lines(files):
    """The trace runs what SGLang would run for --sglang-args: the field reports' 16 draft tokens are 2."""
    report_args = ARGS.replace("num-steps 3", "num-steps 1").replace("tokens 4", "tokens 16")
    r = invoke(
        "--trace", "--prompt", "Hello!", "--draft", files / "draft", "--target", files / "target",
        "--sglang-args", report_args,
    )  # fmt: skip
    assert r.exit_code == 1, r.output  # the rewrite is a finding
    assert "[target.prefill] aux[0] shape=[1, " in r.output and "[draft.extend0] fc(aux)" in r.output
    json_lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith('{"stage"')]
    assert {s["stage"] for s in json_lines} >= {
        "target.prefill",
        "draft.extend0",
        "target.verify1",
        "summary",
    }
    assert json_lines[-1]["spec"] == [1, 1, 2]


@pytest.mark.parametrize(
    "opts",
    [
        DoctorOptions(),
        DoctorOptions(sglang_args=ARGS, sglang_version="v2"),
        DoctorOptions(sglang_args=ARGS, trace=True),
        DoctorOptions(sglang_args=ARGS, accuracy_labels="target"),
    ],
)
def test_invalid_input_is_a_config_error(opts):
    with pytest.raises(ConfigError):
        run_doctor(opts)


def test_invalid_input_exit_2():
    exe = [sys.executable, "-c", "from eaglewire.cli import main; main()"]
    r = subprocess.run([*exe, "doctor"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "nothing to check" in r.stderr and "fix: pass at least one of" in r.stderr


def test_sglang_export_as_draft_runs_every_check(files):
    r = invoke("--draft", files / "sglang", "--target", files / "target", "--data", files / "data", "--json")
    out = json.loads(r.stdout)
    assert r.exit_code == 0, json.dumps(out["findings"], indent=1)
    assert {c["name"]: c["status"] for c in out["checks"]} == {
        "data vs target": "ok",
        "draft vs target": "ok",
        "export: sglang": "ok",
        "draft vs data": "ok",
    }
