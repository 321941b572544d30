import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from eaglewire.cli import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args))


def test_vllm_ids_explained():
    r = run("ids", "--num-layers", "61", "--from", "vllm", "3,31,59", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["boundaries"] == [3, 31, 59]
    assert out["meaning"][0] == "output of layer 2"
    assert out["engine_ids"]["sglang (llama, mistral, qwen2, qwen3, qwen3-moe)"] == [2, 30, 58]
    assert out["engine_ids"]["specforge"] == [2, 30, 58]


def test_sglang_shows_each_release_on_deepseek():
    r = run(
        "ids",
        "--num-layers",
        "61",
        "--from",
        "sglang",
        "--arch",
        "DeepseekV3ForCausalLM",
        "2,30,58",
        "--json",
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["readings"]["SGLang 0.5.10-0.5.12"]["boundaries"] == [3, 31, 59]
    assert out["readings"]["SGLang 0.5.14-0.5.23"]["boundaries"] == [2, 30, 58]
    assert out["readings"]["SGLang 0.5.14-0.5.23"]["rule"] == "pr25454"
    assert "deepseek_v2.py" in out["readings"]["SGLang 0.5.14-0.5.23"]["source"]


def test_sglang_version_on_qwen3_reads_layer_outputs():
    r = run(
        "ids", "-L", "8", "--from", "sglang", "--arch", "Qwen3ForCausalLM", "--sglang-version", "0.5.23", "3,4,5",
        "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["boundaries"] == [4, 5, 6]
    assert out["engine_ids"]["sglang 0.5.10-0.5.23"] == [3, 4, 5]


def test_sglang_last_layer_cannot_be_captured_exits_2():
    r = run("ids", "-L", "7", "--from", "sglang", "--arch", "LlamaForCausalLM", "1,3,6")
    assert r.exit_code == 2
    assert "the draft gets 2 of its 3 aux states" in r.output


def test_defaults_without_ids():
    r = run("ids", "-L", "30", "--json")
    assert json.loads(r.output)["boundaries"] == [2, 15, 27]


@pytest.mark.parametrize(
    "args",
    [
        ["-L", "30", "--from", "vllm", "3,3"],
        ["-L", "30", "--from", "vllm", "31"],
        ["-L", "30", "--from", "nope", "1"],
        ["-L", "30", "x,y"],
        ["-L", "30", "--from", "sglang", "1"],
        ["-L", "30", "--from", "sglang", "--arch", "GPT2LMHeadModel", "1"],
        ["-L", "30", "--from", "sglang", "--arch", "LlamaForCausalLM", "--sglang-version", "0.4.0", "1"],
    ],
)
def test_invalid_input_exits_2_with_reason(args):
    proc = subprocess.run([sys.executable, "-m", "eaglewire", "ids", *args], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip()
