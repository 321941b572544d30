"""The base workspace every fault case copies: a real tiny pipeline, built once per session.

    target/        a saved tiny Llama (8 layers, hidden 64, the tiny BPE tokenizer with ChatML)
    target5/       the same with 5 decoder layers (too shallow for the default aux boundaries)
    qs/            the tiny quickstart run on target/: data/ (JSONL, built datasets, vocab,
                   shards), train/ (run dir, checkpoint, draft/), export/{sglang,vllm}/
    prompts.txt    two prompts, one per line

Cases modules (cases_*.py) may add what only they need with a `build(base)` function.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

import torch

import tests.faults as faults_pkg
from tests.faults.harness import Case


def cases_modules() -> list[ModuleType]:
    names = sorted(m.name for m in pkgutil.iter_modules(faults_pkg.__path__) if m.name.startswith("cases_"))
    return [importlib.import_module(f"tests.faults.{n}") for n in names]


def all_cases() -> list[Case]:
    cases = [c for m in cases_modules() for c in m.CASES]
    names = [c.name for c in cases]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    assert not duplicated, f"fault case names must be unique: {duplicated}"
    return cases


def build_base(base: Path) -> Path:
    """Build the base workspace in `base` (in this process: the commands under test run later, as
    subprocesses, on copies)."""
    from eaglewire.recipes.presets import get_preset
    from eaglewire.recipes.quickstart import QuickstartRun, run_quickstart
    from tests.helpers.tiny import make_tiny_target, save_tiny_target

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target = save_tiny_target(make_tiny_target("llama"), base / "target")
        save_tiny_target(make_tiny_target("llama", num_layers=5), base / "target5")
        run_quickstart(QuickstartRun(preset=get_preset("tiny"), out_dir=base / "qs", target=str(target)))
        (base / "prompts.txt").write_text("Hello! How are you today?\ndef add(a, b):\n", encoding="utf-8")
        for module in cases_modules():
            build = getattr(module, "build", None)
            if build is not None:
                build(base)
    finally:
        torch.set_num_threads(threads)
    return base
