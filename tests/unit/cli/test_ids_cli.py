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
    assert out["engine_ids"]["sglang-legacy"] == [2, 30, 58]
    assert out["engine_ids"]["specforge"] == [2, 30, 58]


def test_sglang_shows_both_readings():
    r = run("ids", "--num-layers", "61", "--from", "sglang", "2,30,58", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["ambiguous"] is True
    assert out["readings"]["legacy"]["boundaries"] == [3, 31, 59]
    assert out["readings"]["pr25454"]["boundaries"] == [2, 30, 58]


def test_sglang_version_picks_one():
    r = run("ids", "-L", "61", "--from", "sglang", "--sglang-version", "pr25454", "2,30,58", "--json")
    assert json.loads(r.output)["boundaries"] == [2, 30, 58]


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
    ],
)
def test_invalid_input_exits_2_with_reason(args):
    proc = subprocess.run([sys.executable, "-m", "eaglewire", "ids", *args], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip()
