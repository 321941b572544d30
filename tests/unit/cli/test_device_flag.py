"""--device is spelled one way by every command: cpu | cuda | cuda:N | auto (the default)."""

from __future__ import annotations

import pytest
import torch

from eaglewire.cli.common import resolve_device
from eaglewire.errors import ConfigError


def test_auto_picks_cuda_only_when_present() -> None:
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert [resolve_device(d) for d in ("cpu", "cuda", "cuda:1")] == ["cpu", "cuda", "cuda:1"]


@pytest.mark.parametrize("bad", ["gpu", "CUDA", "cuda:", "cuda:x", ""])
def test_anything_else_names_the_flag(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"--device: expected cpu \| cuda \| cuda:N \| auto"):
        resolve_device(bad)


@pytest.mark.parametrize(
    "module, function",
    [
        ("data", "capture_cmd"),
        ("data", "regenerate_cmd"),
        ("train", "train_command"),
        ("eval", "eval_command"),
        ("bench", "bench"),
        ("generate", "generate"),
    ],
)
def test_every_command_defaults_to_auto(module: str, function: str) -> None:
    import importlib
    import inspect

    fn = getattr(importlib.import_module(f"eaglewire.cli.{module}"), function)
    option = inspect.signature(fn).parameters["device"].default  # typer's OptionInfo
    assert option.default == "auto" and "auto" in option.help, (module, function)
