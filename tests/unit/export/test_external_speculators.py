"""Cross-check our vLLM export with the `speculators` package's own Eagle3 model class (issue 7, item 4;
issue 44: loaded from another working directory, the verifier reached by the recorded path).

speculators (PyPI, pure Python) is not installed by default: its declared dependencies (datasets,
pyarrow, pandas, openai, torchvision, torchaudio, hs-connectors, ...) are far heavier than this
check. `scripts/test_external.sh` installs speculators==0.9.0 with --no-deps, plus the modules its
import chain needs, into a side folder, and runs this with it importable.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from eaglewire.draft.io import load_draft
from eaglewire.export import export_draft
from eaglewire.target.loading import LoadedTarget
from tests.helpers.tiny import save_tiny_target
from tests.unit.export.conftest import MakeDraft

pytestmark = pytest.mark.external


@pytest.fixture
def speculators_eagle3() -> ModuleType:
    """The speculators Eagle3 module, or a skip with the reason (checked before any other fixture runs)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip(
            "speculators.models.eagle3",
            reason="speculators is not importable (pip install speculators to run this check)",
        )


def test_speculators_loads_vllm_export_with_same_logits(
    speculators_eagle3: ModuleType,
    make_draft: MakeDraft,
    tiny_target: LoadedTarget,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The verifier must be a local HF directory: speculators reads its config (and, for training, its
    # embedding/lm_head/norm) from it. It is typed relative to one directory and loaded from another.
    work = tmp_path / "work"
    save_tiny_target(tiny_target, work / "target")
    monkeypatch.chdir(work)
    src = make_draft(boundaries=[2, 4, 8])  # boundary L = 8: vLLM captures it, speculators accepts ids 0..L
    exported = export_draft(src, "vllm", tmp_path / "export", target_path="target")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)

    config = speculators_eagle3.Eagle3SpeculatorConfig.from_pretrained(str(exported.out))
    assert config.speculators_config.verifier.name_or_path == str((work / "target").resolve())
    config.transformer_layer_config._attn_implementation = "eager"  # flex attention is for GPUs
    # from_pretrained resolves the ids against the verifier's layer count (speculators models/utils.py)
    theirs = speculators_eagle3.Eagle3DraftModel.from_pretrained(str(exported.out), config=config).eval()
    assert theirs.config.eagle_aux_hidden_state_layer_ids == [2, 4, 8]

    # every tensor we wrote is what their model holds (nothing dropped, nothing renamed)
    loaded = theirs.state_dict()
    for name, tensor in load_file(str(exported.out / "model.safetensors")).items():
        assert name in loaded, name
        assert torch.equal(loaded[name], tensor), name

    ours, _ = load_draft(src)
    gen = torch.Generator().manual_seed(3)
    T = 7
    ids = torch.randint(0, ours.config.vocab_size, (1, T), generator=gen)
    aux = torch.randn(1, T, ours.config.aux_width, generator=gen)  # [1, T, A*Ht]
    positions = torch.arange(T)[None]
    with torch.no_grad():
        expected = ours(ids, ours.project(aux), positions).logits  # [1, T, Vd]
    got = _their_logits(theirs, aux, ids, positions)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    # and the vocabulary map reads the same: target id = draft id + d2t[draft id]
    assert torch.equal(torch.arange(ours.config.draft_vocab_size) + theirs.d2t, ours.draft_to_target)

    # negative control: the variant our export says it is not (norm_before_residual) moves the logits
    config.norm_before_residual = True
    other = speculators_eagle3.Eagle3DraftModel.from_pretrained(str(exported.out), config=config).eval()
    assert (_their_logits(other, aux, ids, positions) - expected).abs().max() > 1e-2


def _their_logits(theirs: Any, aux: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """speculators' lm_head output for one training-time step (its forward returns losses, not logits)."""
    captured: list[torch.Tensor] = []
    hook = theirs.lm_head.register_forward_hook(lambda _m, _i, out: captured.append(out))
    with torch.no_grad():
        theirs(
            hidden_states=aux,
            input_ids=ids,
            document_ids=torch.zeros_like(ids),
            position_ids=positions,
            ttt_steps=1,
        )
    hook.remove()
    return captured[0]
