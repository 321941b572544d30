"""Range checks of command-line values (`eaglewire.cli.flags` and each command's checks): the flag is
named as typed and the allowed values are stated, before any work. In-process and fast; the fault
cases (tests/faults/cases_inputs.py) run the same refusals through the console script."""

from __future__ import annotations

import subprocess
import sys

import pytest

from eaglewire.cli.eval import _parse_tree, check_eval_flags
from eaglewire.cli.flags import at_least, in_range, one_of, rename_fields, spec_args_from_flags
from eaglewire.cli.train import config_with_flags
from eaglewire.errors import ConfigError
from eaglewire.train.config import TrainConfig


def test_helpers_name_the_flag_and_the_range() -> None:
    at_least("--limit", None, 1)  # not given: nothing to check
    with pytest.raises(ConfigError, match=r"^--limit: expected >= 1 \(first N\), got 0$"):
        at_least("--limit", 0, 1, "first N")
    with pytest.raises(ConfigError, match=r"--temperature: expected a finite number >= 0.0, got nan"):
        at_least("--temperature", float("nan"), 0.0)
    with pytest.raises(ConfigError, match=r"--top-p: expected 0.0 < --top-p <= 1.0, got 0.0"):
        in_range("--top-p", 0.0, 0.0, 1.0, low_open=True)
    in_range("--top-p", 1.0, 0.0, 1.0, low_open=True)
    with pytest.raises(ConfigError, match=r"--dtype: expected one of float32, bfloat16, got 'fp8'"):
        one_of("--dtype", "fp8", ("float32", "bfloat16"))


def test_field_names_become_flags_only_where_a_value_follows() -> None:
    names = {"num_steps": "--num-steps", "topk": "--topk"}
    text = "num_steps=1 with topk: 2 scores topk + (num_steps-1)*topk^2; use topk > 1"
    assert (
        rename_fields(text, names)
        == "--num-steps=1 with --topk: 2 scores topk + (num_steps-1)*topk^2; use --topk > 1"
    )


@pytest.mark.parametrize(
    "args, says",
    [
        ((0, 4, 8), "--num-steps: expected >= 1, got 0"),
        ((1, 1, 16), "--num-draft-tokens=16 with --num-steps=1, --topk=1"),
        ((1, 2, 16), "--num-draft-tokens=16 needs 15 drafted tokens but --num-steps=1 with --topk=2"),
        ((3, 2, 1), "--num-draft-tokens=1: the root alone drafts nothing"),
    ],
)
def test_spec_flags_are_named_as_typed(args: tuple[int, int, int], says: str) -> None:
    with pytest.raises(ConfigError) as e:
        spec_args_from_flags(*args)
    assert says in str(e.value) and "speculative" not in str(e.value).split("(")[0]


def test_train_flags_are_named_in_config_refusals() -> None:
    with pytest.raises(ConfigError, match=r"^--precision: expected one of auto, bf16, fp32, got 'fp8'$"):
        config_with_flags(TrainConfig(), {"precision": "fp8"})
    with pytest.raises(ConfigError, match=r"--max-length=5 is too short for --ttt-steps=4"):
        config_with_flags(TrainConfig(), {"max_length": 5, "ttt_steps": 4})
    # a field the flags did not set keeps its config name
    with pytest.raises(ConfigError, match=r"--max-length=5 is too short for ttt_steps=7"):
        config_with_flags(TrainConfig(), {"max_length": 5})
    assert config_with_flags(TrainConfig(), {"max_length": 6, "ttt_steps": 4}).max_length == 6


@pytest.mark.parametrize("field, value", [("precision", "fp8"), ("parallel", "mpi"), ("loss", "mse")])
def test_train_config_refuses_values_outside_its_literals(field: str, value: str) -> None:
    with pytest.raises(ConfigError, match=rf"{field}: expected one of"):
        TrainConfig(**{field: value})  # type: ignore[arg-type]


def test_train_config_refuses_non_finite_floats() -> None:
    with pytest.raises(ConfigError, match="learning_rate: expected a finite number, got nan"):
        TrainConfig(learning_rate=float("nan"))


@pytest.mark.parametrize(
    "kw, says",
    [
        ({"num_steps": 0}, "--num-steps: expected 1 <= --num-steps <= 32"),
        ({"num_steps": 500}, "--num-steps: expected 1 <= --num-steps <= 32"),
        ({"depth": 40}, "--tree: depth 40 is over 32"),
        ({"batch_size": 0}, "--batch-size: expected >= 1"),
        ({"max_length": 0}, "--max-length: expected >= 7 tokens per row"),
        ({"max_length": 9, "depth": 8}, "--max-length: expected >= 10 tokens per row (8 steps"),
        ({"max_records": -1}, "--max-records: expected >= 0"),
        ({"horizon": -1}, "--horizon: expected >= 0"),
        ({"target_dtype": "fp8"}, "--target-dtype: expected one of float32, bfloat16, float16"),
    ],
)
def test_eval_flags(kw: dict[str, object], says: str) -> None:
    flags: dict[str, object] = dict(
        num_steps=5, depth=0, batch_size=4, max_length=2048, max_records=0, horizon=0, target_dtype=None
    )
    with pytest.raises(ConfigError) as e:
        check_eval_flags(**{**flags, **kw})  # type: ignore[arg-type]
    assert says in str(e.value)


@pytest.mark.parametrize(
    "tree, says",
    [
        ("0x3", "--tree 0x3: expected TOPK >= 1 and DEPTH >= 1"),
        ("2,2,40", "--tree 2,2,40: NUM_DRAFT_TOKENS=40 needs 39 drafted tokens"),
        ("8,1,9", "--tree 8,1,9: topk=1 is a chain"),
        ("nonsense", "--tree: expected NUM_STEPS,TOPK,NUM_DRAFT_TOKENS"),
    ],
)
def test_eval_tree_is_checked_before_any_work(tree: str, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        _parse_tree(tree)
    assert says in str(e.value)
    assert _parse_tree("2x2") == [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]


def test_refusals_import_no_torch() -> None:
    """What keeps a refused command at a fraction of a second: the checks run before torch loads."""
    code = (
        "import sys\n"
        "from eaglewire.cli.generate import generate\n"
        "from eaglewire.cli.flags import spec_args_from_flags\n"
        "from eaglewire.cli.eval import _parse_tree, check_eval_flags\n"
        "from eaglewire.train.config import TrainConfig\n"
        "spec_args_from_flags(5, 4, 8); _parse_tree('8,4,16')\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
