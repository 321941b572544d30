"""Read a draft directory of any format the doctor accepts, the way each engine reads it.

- eaglewire: config.json (`format: eaglewire-eagle3`) + model.safetensors + contract.json.
- SGLang export (`LlamaForCausalLMEagle3`): ids at `eagle_config.eagle_aux_hidden_state_layer_ids`
  (newer SGLang also accepts them top-level when there is no `eagle_config`), `draft_vocab_size`,
  `target_hidden_size`; tensors `fc.weight`, `d2t` (offsets: target = draft + d2t[draft]), `t2d`.
- vLLM / speculators export: top-level `eagle_aux_hidden_state_layer_ids` (boundary numbering),
  `transformer_layer_config`, `draft_vocab_size`, `target_hidden_size`; same tensors.

This is the one module that knows the foreign key names the doctor reads (the export helper
writes them; `eaglewire.export` owns the full format). Tensors are found by name suffix so a
`model.` prefix does not matter. Nothing here unpickles.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from eaglewire.contract.contract import CONTRACT_FILE, Contract
from eaglewire.draft.config import DraftConfig
from eaglewire.draft.io import NONFINITE_FIX, verify_draft_files
from eaglewire.draft.model import Eagle3Draft
from eaglewire.errors import CheckpointError, ConfigError
from eaglewire.safetensors_io import open_tensors
from eaglewire.target.loading import LoadedTarget
from eaglewire.tensor_checks import check_finite
from eaglewire.typed_config import read_json_file

DraftKind = Literal["eaglewire", "sglang", "vllm"]
EAGLEWIRE_FORMAT = "eaglewire-eagle3"
IDS_KEY = "eagle_aux_hidden_state_layer_ids"
SGLANG_NESTED = "eagle_config"
VLLM_MARKERS = ("speculators_model_type", "speculators_config", "transformer_layer_config")
TENSOR_SUFFIXES = ("fc.weight", "d2t", "t2d", "draft_to_target", "lm_head.weight", "embed_tokens.weight")


@dataclass
class DraftSource:
    """What a draft directory declares, read without building the model."""

    path: Path
    kind: DraftKind
    config: dict[str, Any]
    contract: Contract | None  # contract.json when present (every eaglewire artifact has one)
    top_ids: tuple[int, ...] | None  # top-level eagle_aux_hidden_state_layer_ids
    nested_ids: tuple[int, ...] | None  # eagle_config.eagle_aux_hidden_state_layer_ids
    target_hidden_size: int | None
    draft_vocab_size: int | None
    vocab_size: int | None
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # by suffix: "fc.weight", "d2t", ...

    @property
    def layer_ids(self) -> tuple[int, ...] | None:
        """The ids this format's engine is meant to read (nested for SGLang, top-level for vLLM)."""
        if self.kind == "sglang":
            return self.nested_ids if self.nested_ids is not None else self.top_ids
        return self.top_ids

    @property
    def num_aux(self) -> int | None:
        if self.kind == "eaglewire":
            return int(self.config["num_aux"])
        ids = self.layer_ids
        if ids is not None:
            return len(ids)
        return self.contract.num_aux if self.contract else None

    @property
    def fc_in_features(self) -> int | None:
        fc = self.tensors.get("fc.weight")
        return int(fc.shape[1]) if fc is not None else None


def _ids(value: Any, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ConfigError(
            f"{where}: expected a list of integers, got {value!r}",
            fix="write the ids as a JSON list of integers, e.g. [2, 15, 27] (see `eaglewire ids`)",
        )
    return tuple(value)


def detect_kind(config: dict[str, Any], where: str) -> DraftKind:
    if config.get("format") == EAGLEWIRE_FORMAT:
        return "eaglewire"
    if any(k in config for k in VLLM_MARKERS):
        return "vllm"
    archs = config.get("architectures") or []
    if SGLANG_NESTED in config or any("Eagle3" in str(a) for a in archs):
        return "sglang"
    raise ConfigError(
        f"{where}: not an EAGLE-3 draft config (no 'format: {EAGLEWIRE_FORMAT}', no speculators keys, "
        f"no '{SGLANG_NESTED}', architectures={archs})",
        fix="point --draft at an eaglewire draft, an SGLang export or a vLLM/speculators export",
    )


def read_tensors(directory: Path, suffixes: tuple[str, ...] = TENSOR_SUFFIXES) -> dict[str, torch.Tensor]:
    """The tensors whose names end with one of `suffixes` (first match per suffix), from *.safetensors."""
    out: dict[str, torch.Tensor] = {}
    for path in sorted(Path(directory).glob("*.safetensors")):
        with open_tensors(path, error=CheckpointError) as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                for suffix in suffixes:
                    if suffix not in out and (name == suffix or name.endswith("." + suffix)):
                        out[suffix] = f.get_tensor(name)
    check_finite(out, where=str(directory), fix=NONFINITE_FIX)
    return out


def _int(config: dict[str, Any], key: str) -> int | None:
    v = config.get(key)
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def read_draft_source(directory: Path, *, with_tensors: bool = True) -> DraftSource:
    """Read config.json (+ contract.json, + the few tensors the doctor checks) of a draft directory."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"draft {directory}: not a directory")
    cfg_path = directory / "config.json"
    if not cfg_path.exists():
        raise CheckpointError(f"draft {directory}: config.json missing")
    config = read_json_file(cfg_path)
    if not isinstance(config, dict):
        raise ConfigError(f"{cfg_path}: expected a JSON object")
    kind = detect_kind(config, str(cfg_path))
    if kind == "eaglewire":
        verify_draft_files(directory)  # headers, then the marker's sha256: a cut or changed file is named
    contract = Contract.load(directory) if (directory / CONTRACT_FILE).exists() else None
    nested = config.get(SGLANG_NESTED)
    nested_ids = (
        _ids(nested.get(IDS_KEY), f"{cfg_path}: {SGLANG_NESTED}.{IDS_KEY}")
        if isinstance(nested, dict)
        else None
    )
    layer_cfg = config.get("transformer_layer_config")
    vocab = _int(config, "vocab_size")
    if vocab is None and isinstance(layer_cfg, dict):
        vocab = _int(layer_cfg, "vocab_size")
    return DraftSource(
        path=directory,
        kind=kind,
        config=config,
        contract=contract,
        top_ids=_ids(config.get(IDS_KEY), f"{cfg_path}: {IDS_KEY}"),
        nested_ids=nested_ids,
        target_hidden_size=_int(config, "target_hidden_size"),
        draft_vocab_size=_int(config, "draft_vocab_size"),
        vocab_size=vocab,
        tensors=read_tensors(directory) if with_tensors else {},
    )


def load_engine_draft(source: DraftSource, target: LoadedTarget) -> Eagle3Draft:
    """An SGLang/vLLM export's weights as an Eagle3Draft, read by `eaglewire.export`'s importer.

    Raises CheckpointError/ConfigError naming the tensor or key when the export does not fit.
    """
    from eaglewire.export.importing import READERS, engine_state_dict
    from eaglewire.export.keys import ENGINE_NUM_AUX
    from eaglewire.export.layout import read_weights

    if source.kind == "eaglewire":
        raise ConfigError(f"{source.path}: an eaglewire draft; load it with eaglewire.draft.io.load_draft")
    foreign = READERS[source.kind](source.config, str(source.path / "config.json"))
    cfg = DraftConfig(**foreign.layer, num_aux=source.num_aux or ENGINE_NUM_AUX)
    model = Eagle3Draft(cfg)
    state, _notes = engine_state_dict(read_weights(source.path), source.kind, model, target, str(source.path))
    model.load_state_dict(state)
    return model.eval().requires_grad_(False)
