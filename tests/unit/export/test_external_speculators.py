"""Cross-check our vLLM export with the `speculators` package's own Eagle3 model class (issue 7, item 4).

speculators (PyPI, pure Python) is not installed by default: its declared dependencies (datasets,
pyarrow, pandas, openai, torchvision, torchaudio, hs-connectors, ...) are far heavier than this
check. Run it with speculators importable, e.g. `pip install --no-deps speculators` plus the
modules its import chain needs (see the export README notes), or skip.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import ModuleType

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
    speculators_eagle3: ModuleType, make_draft: MakeDraft, tiny_target: LoadedTarget, tmp_path: Path
) -> None:
    # The verifier must be a local HF directory: speculators reads its embedding/lm_head/norm from it.
    target_dir = save_tiny_target(tiny_target, tmp_path / "target")
    src = make_draft()
    exported = export_draft(src, "vllm", tmp_path / "export", target_path=str(target_dir))

    config = speculators_eagle3.Eagle3SpeculatorConfig.from_pretrained(str(exported.out))
    config.transformer_layer_config._attn_implementation = "eager"  # flex attention is for GPUs
    theirs = speculators_eagle3.Eagle3DraftModel.from_pretrained(str(exported.out), config=config).eval()

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
    captured: list[torch.Tensor] = []
    hook = theirs.lm_head.register_forward_hook(lambda _m, _i, out: captured.append(out))
    with torch.no_grad():
        theirs(
            hidden_states=aux,
            input_ids=ids,
            document_ids=torch.zeros(1, T, dtype=torch.long),
            position_ids=positions,
            ttt_steps=1,
        )
        expected = ours(ids, ours.project(aux), positions).logits  # [1, T, Vd]
    hook.remove()
    assert captured[0].shape == expected.shape
    torch.testing.assert_close(captured[0], expected, rtol=1e-4, atol=1e-4)
    # and the vocabulary map reads the same: target id = draft id + d2t[draft id]
    assert torch.equal(torch.arange(ours.config.draft_vocab_size) + theirs.d2t, ours.draft_to_target)
