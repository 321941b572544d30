import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglewire.draft import GrowingKV
from eaglewire.draft.init import init_draft
from eaglewire.draft.io import DRAFT_FILES, load_draft, save_draft
from eaglewire.errors import CheckpointError, ConfigError
from eaglewire.output_marker import OutputKind, write_marker
from eaglewire.target.capture import capture
from eaglewire.target.identity import build_contract
from tests.helpers.tiny import ARCHITECTURES, make_tiny_target


@pytest.fixture(scope="module", params=ARCHITECTURES)
def setup(request):
    target = make_tiny_target(request.param)
    contract = build_contract(target)
    return target, contract, init_draft(target, contract)


def test_shapes_and_names(setup):
    target, contract, draft = setup
    names = set(draft.state_dict())
    assert {
        "fc.weight",
        "layer.hidden_norm.weight",
        "layer.self_attn.q_proj.weight",
        "lm_head.weight",
        "draft_to_target",
        "embed_tokens.weight",
        "norm.weight",
    } <= names
    assert draft.fc.weight.shape == (draft.config.hidden_size, contract.num_aux * target.hidden_size)
    assert draft.layer.self_attn.q_proj.in_features == 2 * draft.config.hidden_size
    torch.testing.assert_close(draft.embed_tokens.weight, target.model.model.embed_tokens.weight)


def test_forward_runs_on_captured_states(setup):
    target, contract, draft = setup
    ids = torch.randint(0, target.vocab_size, (2, 6))
    states = capture(target.model, ids, aux_boundaries=contract.aux_boundaries, final=contract.final)
    out = draft(ids, draft.project(states.aux), torch.arange(6).expand(2, -1))
    assert out.hidden.shape == (2, 6, draft.config.hidden_size)
    assert out.logits.shape == (2, 6, draft.config.draft_vocab_size)


def test_incremental_kv_equals_full_causal(setup):
    target, contract, draft = setup
    ids = torch.randint(0, target.vocab_size, (1, 7))
    hidden = torch.randn(1, 7, draft.config.hidden_size)
    pos = torch.arange(7)[None]
    full = draft(ids, hidden, pos).logits
    kv = GrowingKV()
    first = draft(ids[:, :4], hidden[:, :4], pos[:, :4], kv=kv).logits
    rest = [
        draft(ids[:, t : t + 1], hidden[:, t : t + 1], pos[:, t : t + 1], kv=kv).logits for t in range(4, 7)
    ]
    torch.testing.assert_close(torch.cat([first, *rest], dim=1), full, atol=1e-5, rtol=1e-5)


def test_save_load_same_logits(setup, tmp_path):
    target, contract, draft = setup
    save_draft(draft, contract, tmp_path)
    loaded, loaded_contract = load_draft(tmp_path)
    assert loaded_contract == contract
    ids = torch.randint(0, target.vocab_size, (1, 5))
    hidden = torch.randn(1, 5, draft.config.hidden_size)
    pos = torch.arange(5)[None]
    torch.testing.assert_close(loaded(ids, hidden, pos).logits, draft(ids, hidden, pos).logits)


def test_missing_and_misshapen_tensors_are_named(setup, tmp_path):
    target, contract, draft = setup
    save_draft(draft, contract, tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["layer.hidden_norm.weight"]
    state["fc.weight"] = state["fc.weight"][:, :-1].contiguous()
    save_file(state, str(tmp_path / "model.safetensors"))
    # saved that way: the marker agrees, the tensors do not fit
    write_marker(tmp_path, OutputKind.DRAFT, DRAFT_FILES)
    with pytest.raises(CheckpointError) as e:
        load_draft(tmp_path)
    assert "layer.hidden_norm.weight" in str(e.value)
    assert "fc.weight: expected" in str(e.value)


def test_unknown_config_key_is_an_error(setup, tmp_path):
    target, contract, draft = setup
    save_draft(draft, contract, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["num_layers"] = 2
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    write_marker(tmp_path, OutputKind.DRAFT, DRAFT_FILES)  # written that way: the marker agrees
    with pytest.raises(ConfigError, match="num_layers: unknown key"):
        load_draft(tmp_path)


def test_vocab_map_validation(setup):
    target, contract, _ = setup
    with pytest.raises(ConfigError, match="duplicated"):
        init_draft(target, contract, draft_to_target=[1, 1, 2])
    with pytest.raises(ConfigError, match="ids must be in"):
        init_draft(target, contract, draft_to_target=[0, target.vocab_size])
    small = init_draft(target, contract, draft_to_target=[5, 7, 9, 11])
    assert small.config.draft_vocab_size == 4
    torch.testing.assert_close(small.lm_head.weight, target.model.lm_head.weight[[5, 7, 9, 11]])


def test_a_wider_mlp_is_built_saved_and_exported_with_its_width(setup, tmp_path):
    """init_draft(intermediate_size=...) sizes the draft layer's MLP; the width survives save/load
    and reaches the engine config an export writes (SGLang and vLLM build the MLP from it)."""
    from eaglewire.draft.config import draft_config_for_target
    from eaglewire.export.engine_config import llama_layer_dict

    target, contract, default = setup
    wide = 3 * default.config.intermediate_size
    draft = init_draft(target, contract, intermediate_size=wide)
    assert draft.config.intermediate_size == wide
    assert draft.layer.mlp.gate_proj.weight.shape == (wide, draft.config.hidden_size)
    assert draft.layer.mlp.down_proj.weight.shape == (draft.config.hidden_size, wide)
    save_draft(draft, contract, tmp_path)
    loaded, _ = load_draft(tmp_path)
    assert loaded.config.intermediate_size == wide
    assert (
        llama_layer_dict(loaded.config, vocab_size=target.vocab_size, dtype="bfloat16")["intermediate_size"]
        == wide
    )
    with pytest.raises(
        ConfigError, match=r"config \(intermediate_size=\d+\) and intermediate_size=8 both given"
    ):
        init_draft(target, contract, config=default.config, intermediate_size=8)
    with pytest.raises(ConfigError, match="intermediate_size: expected >= 1, got 0"):
        draft_config_for_target(target.config, num_aux=contract.num_aux, intermediate_size=0)


def test_more_attention_heads_keep_the_targets_grouping_and_reach_the_export(setup, tmp_path):
    """init_draft(num_attention_heads=...) sets the draft layer's query heads; its key/value heads keep
    the target's grouping and each head the target's size; the shape survives save/load and reaches
    the engine config an export writes. A head count the grouping cannot split names both fields."""
    from eaglewire.draft.config import draft_config_for_target
    from eaglewire.export.engine_config import llama_layer_dict

    target, contract, default = setup
    cfg = default.config
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    heads = 2 * cfg.num_attention_heads
    draft = init_draft(target, contract, num_attention_heads=heads)
    assert (draft.config.num_attention_heads, draft.config.num_key_value_heads) == (heads, heads // group)
    assert draft.config.head_dim == cfg.head_dim
    assert draft.layer.self_attn.q_proj.weight.shape == (heads * cfg.head_dim, 2 * cfg.hidden_size)
    assert draft.layer.self_attn.o_proj.weight.shape == (cfg.hidden_size, heads * cfg.head_dim)
    save_draft(draft, contract, tmp_path)
    loaded, _ = load_draft(tmp_path)
    layer = llama_layer_dict(loaded.config, vocab_size=target.vocab_size, dtype="bfloat16")
    assert (layer["num_attention_heads"], layer["num_key_value_heads"], layer["head_dim"]) == (
        heads,
        heads // group,
        cfg.head_dim,
    )
    with pytest.raises(
        ConfigError, match=r"config \(num_attention_heads=\d+\) and num_attention_heads=8 both given"
    ):
        init_draft(target, contract, config=cfg, num_attention_heads=8)
    if group > 1:
        with pytest.raises(ConfigError, match=rf"expected a positive multiple of {group} .*got {group + 1}"):
            draft_config_for_target(target.config, num_aux=contract.num_aux, num_attention_heads=group + 1)
    with pytest.raises(ConfigError, match="expected a positive multiple .*got 0"):
        draft_config_for_target(target.config, num_aux=contract.num_aux, num_attention_heads=0)


def test_fused_weights_are_the_parameters_themselves(tmp_path):
    """fuse_weights (the engine's load step) changes storage only: the same outputs, state dict and
    parameter objects; in-place loads and `.to()` reach the fused tensors; gradients still reach
    the parameters; a fused draft saves and loads."""
    target = make_tiny_target(ARCHITECTURES[0])
    contract = build_contract(target)
    draft = init_draft(target, contract).eval()
    ids = torch.randint(0, target.vocab_size, (1, 5))
    hidden = torch.randn(1, 5, draft.config.hidden_size)
    pos = torch.arange(5)[None]
    with torch.no_grad():
        before = draft(ids, hidden, pos).logits
    params = dict(draft.named_parameters())
    keys = list(draft.state_dict())
    draft.fuse_weights()
    attn, mlp = draft.layer.self_attn, draft.layer.mlp
    fused = (attn.stacked, mlp.stacked)
    draft.fuse_weights()  # a second Drafter of the same draft: captured graphs keep their tensors
    assert (attn.stacked, mlp.stacked) == fused
    assert dict(draft.named_parameters()) == params and list(draft.state_dict()) == keys
    assert attn.k_proj.weight.data_ptr() != attn.q_proj.weight.data_ptr()
    assert attn.stacked is not None and attn.stacked.data_ptr() == attn.q_proj.weight.data_ptr()
    with torch.no_grad():
        torch.testing.assert_close(draft(ids, hidden, pos).logits, before, rtol=0, atol=0)
        mlp.up_proj.weight.mul_(2)  # an in-place change of a parameter is a change of the fused tensor
    assert mlp.stacked is not None
    torch.testing.assert_close(mlp.stacked[mlp.gate_proj.out_features :], mlp.up_proj.weight)
    draft.to(torch.float64)  # converted tensor by tensor, then fused again
    assert attn.stacked.dtype == torch.float64
    assert attn.stacked.data_ptr() == attn.q_proj.weight.data_ptr()
    # a load that replaces the parameters (assign=True) stacks them again: no stale buffer
    replaced = {k: v * 3 if v.is_floating_point() else v for k, v in draft.state_dict().items()}
    draft.load_state_dict(replaced, assign=True)
    assert attn.stacked.data_ptr() == attn.q_proj.weight.data_ptr()
    torch.testing.assert_close(
        attn.stacked[: attn.q_proj.out_features], replaced["layer.self_attn.q_proj.weight"]
    )
    draft.float()
    draft.zero_grad()
    draft(ids, hidden, pos).logits.sum().backward()  # gradients enabled: the concatenated path
    assert attn.v_proj.weight.grad is not None and attn.v_proj.weight.grad.abs().sum() > 0
    save_draft(draft, contract, tmp_path / "fused")  # shared storage is copied apart for safetensors
    loaded = load_draft(tmp_path / "fused")[0]
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, hidden, pos).logits, draft(ids, hidden, pos).logits)


def test_a_fused_draft_pickles_and_copies():
    """torch.save of a whole module and deepcopy (what multiprocessing and checkpoints may do) keep
    working after fuse_weights, and the copy stays fused."""
    import copy
    import io

    target = make_tiny_target(ARCHITECTURES[0])
    draft = init_draft(target, build_contract(target)).eval()
    draft.fuse_weights()
    buffer = io.BytesIO()
    torch.save(draft, buffer)
    buffer.seek(0)
    for other in (torch.load(buffer, weights_only=False), copy.deepcopy(draft)):
        attn = other.layer.self_attn
        assert attn.stacked is not None
        torch.testing.assert_close(attn.stacked[: attn.q_proj.out_features], attn.q_proj.weight)
