"""Draft vs target (and vs the data's contract): identity, fingerprint, vocab map, fc width.

- identity: the draft's contract names a target (layers, hidden size, vocab, config, tokenizer and
  chat-template hashes); the live target must be that one.
- fingerprint: the contract's stored values on the probe input are recomputed on the live target;
  each tensor must match its declared boundary by values.
- vocab map: absolute draft->target ids in range and unique; for engine exports the offset form
  `d2t` (target = draft + d2t[draft]) and the boolean `t2d` must agree with each other and with Vd.
- fc width: the draft's fc reads A*Ht columns.
- embedding: SGLang's EAGLE-3 worker replaces a draft's embed_tokens with the target's whenever their
  hidden sizes match (`set_embed`), so a draft trained with its own embedding (`train_embeddings`) is
  served with other token vectors than it learned, silently; vLLM loads the draft's own.
"""

from __future__ import annotations

import torch

from eaglewire.contract.contract import IDENTITY_KEYS, Contract, contract_diff
from eaglewire.contract.fingerprint import TOLERANCE, match_fingerprint
from eaglewire.doctor.diagnosis import key_text
from eaglewire.doctor.draft_source import DraftSource
from eaglewire.doctor.findings import CheckResult, Finding, Row
from eaglewire.target.architectures import target_parts
from eaglewire.target.identity import states_on_probe, target_identity
from eaglewire.target.loading import LoadedTarget, dtype_name
from eaglewire.typed_config import to_dict

CHECK = "draft vs target"
IDENTITY_FIXES = {
    "num_layers": "serve/check with the target the draft was trained for",
    "hidden_size": "serve/check with the target the draft was trained for",
    "vocab_size": "serve/check with the target the draft was trained for",
    "architecture": "serve/check with the target the draft was trained for",
    "config_hash": "use the exact target checkpoint the draft was trained on (its config differs), or retrain",
    "tokenizer_hash": "use the tokenizer the draft was trained with, or retrain the draft on this tokenizer",
    "chat_template_hash": "use the chat template the draft was trained with (--chat-template), or retrain",
}


def check_identity(
    contract: Contract, target: LoadedTarget, result: CheckResult, *, who: str = "draft"
) -> bool:
    """Compare the contract's target identity with the live target; True when the shapes agree."""
    declared, live = to_dict(contract.target), to_dict(target_identity(target))
    shapes_ok = True
    for key in IDENTITY_KEYS:
        ok = declared[key] == live[key]
        shown_d = str(declared[key])[:16] if key.endswith("hash") else str(declared[key])
        shown_l = str(live[key])[:16] if key.endswith("hash") else str(live[key])
        result.rows.append(Row(item=f"target.{key}", declared=shown_d, actual=shown_l, ok=ok))
        if not ok:
            if key in ("num_layers", "hidden_size", "vocab_size"):
                shapes_ok = False
            result.findings.append(
                Finding(
                    check=f"{who}.target.{key}",
                    severity="error",
                    what=f"the {who} was built for another target ({key} differs)",
                    declared=f"{key}={shown_d} ({contract.target.name or 'contract.json'})",
                    actual=f"{key}={shown_l} ({target.path})",
                    fix=IDENTITY_FIXES[key] + (f": {contract.target.name}" if contract.target.name else ""),
                )
            )
    return shapes_ok


def check_fingerprint_values(
    contract: Contract, target: LoadedTarget, result: CheckResult, *, who: str = "draft"
) -> None:
    """The contract's fingerprint recomputed on the live target: each tensor must be its declared state.

    Matched per token and medianed (see `eaglewire.contract.fingerprint.distance`), which separates
    adjacent mid-stack boundaries of real models across dtypes where a plain L2 over all tokens does not.
    """
    fp = contract.fingerprint
    if fp is None:
        result.notes.append(f"{who} contract has no fingerprint: boundaries not proven by values")
        return
    L = target.num_layers
    loosest = max(TOLERANCE.values())
    for m in match_fingerprint(
        fp, states_on_probe(target, fp.probe_ids), live_dtype=dtype_name(target.dtype)
    ):
        ok = m.ok
        actual = m.best if m.best_distance <= loosest else None
        result.rows.append(
            Row(
                item=f"fingerprint {m.name}",
                declared=key_text(m.declared, L),
                actual=key_text(actual, L),
                ok=ok,
                note=f"distance {m.best_distance:.1e}",
            )
        )
        if not ok:
            result.findings.append(
                Finding(
                    check=f"{who}.fingerprint",
                    severity="error",
                    what=f"{m.name}: the contract's recorded values are not its declared boundary on this target",
                    declared=key_text(m.declared, L),
                    actual=key_text(actual, L),
                    fix="use the target the contract was built on; if it is that target, the contract was built "
                    "from mislabelled states: `eaglewire draft relabel` (a draft) or `eaglewire data relabel` "
                    "(shards) at the actual boundaries (see data vs target)",
                    details=(
                        f"distance to declared {m.declared_distance:.1e}, to best {m.best_distance:.1e}, tolerance {m.tolerance:.0e}",
                    ),
                )
            )


def check_vocab_map(source: DraftSource, vocab_size: int, result: CheckResult) -> None:
    """Absolute map (eaglewire) or d2t offsets + t2d (engine exports) against V and Vd."""
    vd = source.draft_vocab_size
    if source.kind == "eaglewire":
        absolute = source.tensors.get("draft_to_target")
        if absolute is None:
            result.findings.append(
                _vocab_finding("draft_to_target buffer missing from the weights", "present", "absent")
            )
            return
        _check_absolute(absolute.long(), vocab_size, vd, result, name="draft_to_target")
        return
    d2t, t2d = source.tensors.get("d2t"), source.tensors.get("t2d")
    if d2t is None:
        if vd is not None and vd < vocab_size:
            result.findings.append(
                _vocab_finding(
                    f"d2t missing while draft_vocab_size={vd} < vocab_size={vocab_size}", "d2t [Vd]", "absent"
                )
            )
        else:
            result.notes.append("no d2t: full target vocabulary")
        return
    d2t = d2t.long()
    offsets = torch.arange(d2t.numel(), dtype=torch.long)
    absolute = offsets + d2t
    # d2t's length against draft_vocab_size: the export check (export.<engine>.draft_vocab_size)
    if vd is not None and vd < vocab_size and bool((d2t == 0).all()):
        result.findings.append(
            _vocab_finding(
                "d2t is all zeros: draft token i becomes target token i (the vocabulary map was lost)",
                "offsets target - draft for the chosen Vd tokens",
                "all-zero d2t",
            )
        )
        return
    absolute_ok = (
        int(absolute.min()) >= 0
        and int(absolute.max()) < vocab_size
        and len(torch.unique(absolute)) == len(absolute)
    )
    if not absolute_ok:
        looks_absolute = (
            int(d2t.min()) >= 0 and int(d2t.max()) < vocab_size and len(torch.unique(d2t)) == len(d2t)
        )
        if looks_absolute:
            result.findings.append(
                _vocab_finding(
                    "d2t holds absolute target ids; engines read offsets (target = draft + d2t[draft])",
                    "offsets",
                    "absolute ids",
                    fix="re-export with `eaglewire export` (it writes d2t = absolute - arange(Vd))",
                )
            )
        else:
            result.findings.append(
                _vocab_finding(
                    "draft + d2t gives target ids out of range or duplicated",
                    f"unique ids in 0..{vocab_size - 1}",
                    f"range {int(absolute.min())}..{int(absolute.max())}, {len(torch.unique(absolute))} unique of {len(absolute)}",
                )
            )
        return
    result.rows.append(Row(item="d2t", declared=f"Vd={vd}", actual=f"{d2t.numel()} valid offsets", ok=True))
    if t2d is not None:
        t2d = t2d.bool()
        count = int(t2d.sum())
        ok = t2d.numel() == vocab_size and count == len(absolute) and bool(t2d[absolute].all())
        result.rows.append(
            Row(
                item="t2d",
                declared=f"{len(absolute)} true of V={vocab_size}",
                actual=f"{count} true of {t2d.numel()}",
                ok=ok,
            )
        )
        if not ok:
            result.findings.append(
                _vocab_finding(
                    "t2d disagrees with d2t (count of true entries must be Vd, and true exactly at the mapped ids)",
                    f"{len(absolute)} true of {vocab_size}",
                    f"{count} true of {t2d.numel()}",
                )
            )


def _check_absolute(
    absolute: torch.Tensor, vocab_size: int, vd: int | None, result: CheckResult, *, name: str
) -> None:
    problems = []
    if vd is not None and absolute.numel() != vd:
        problems.append(f"{absolute.numel()} entries, Vd={vd}")
    if int(absolute.min()) < 0 or int(absolute.max()) >= vocab_size:
        problems.append(f"ids {int(absolute.min())}..{int(absolute.max())} outside 0..{vocab_size - 1}")
    if len(torch.unique(absolute)) != absolute.numel():
        problems.append(f"{absolute.numel() - len(torch.unique(absolute))} duplicated target ids")
    result.rows.append(
        Row(
            item=name,
            declared=f"Vd={vd} unique ids < {vocab_size}",
            actual="; ".join(problems) or "valid",
            ok=not problems,
        )
    )
    if problems:
        result.findings.append(
            _vocab_finding(
                f"{name} is not a valid absolute vocabulary map", "unique ids in range", "; ".join(problems)
            )
        )


def _vocab_finding(what: str, declared: str, actual: str, *, fix: str | None = None) -> Finding:
    return Finding(
        check="draft.vocab_map",
        severity="error",
        what=what,
        declared=declared,
        actual=actual,
        fix=fix or "rebuild the vocabulary map (eaglewire data vocab) and re-export the draft",
    )


def check_fc_width(source: DraftSource, num_aux: int | None, target_hidden: int, result: CheckResult) -> None:
    fc_in = source.fc_in_features
    if fc_in is None:
        result.notes.append("no fc.weight found: fc width not checked")
        return
    if num_aux is None:
        result.notes.append(f"fc reads {fc_in} columns; number of aux states unknown")
        return
    want = num_aux * target_hidden
    result.rows.append(
        Row(
            item="fc.weight in_features",
            declared=f"A*Ht = {num_aux}*{target_hidden} = {want}",
            actual=str(fc_in),
            ok=fc_in == want,
        )
    )
    if fc_in != want:
        result.findings.append(
            Finding(
                check="draft.fc_width",
                severity="error",
                what="the draft's fc does not read A*Ht columns",
                declared=f"A*Ht = {num_aux}*{target_hidden} = {want}",
                actual=f"fc.weight in_features = {fc_in}",
                fix="the draft was trained for another number of aux states or another target; retrain or use its target",
            )
        )
    if source.target_hidden_size is not None and source.target_hidden_size != target_hidden:
        result.findings.append(
            Finding(
                check="draft.target_hidden_size",
                severity="error",
                what="config target_hidden_size differs from the target's hidden size",
                declared=str(source.target_hidden_size),
                actual=str(target_hidden),
                fix=f"set target_hidden_size: {target_hidden} in {source.path / 'config.json'} (or use the right target)",
            )
        )


# Relative L2 distance above which a draft's embedding is not the target's: copies in another dtype
# differ by bf16 rounding (~4e-3 relative), a trained embedding by far more.
EMBED_TOLERANCE = 2e-2


def check_embedding(source: DraftSource, target: LoadedTarget, result: CheckResult) -> None:
    """The draft's embed_tokens against the live target's embedding (see the module docstring)."""
    embed = source.tensors.get("embed_tokens.weight")
    mine = target_parts(target.model).embed_tokens.weight.detach()
    if embed is None or tuple(embed.shape) != tuple(mine.shape):
        return  # absent: every engine shares the target's; another shape: hidden sizes differ, no replacement
    distance = float((embed.float() - mine.float().cpu()).norm() / mine.float().norm().clamp_min(1e-12))
    served_as_trained = distance <= EMBED_TOLERANCE or source.kind == "vllm"  # vLLM loads the draft's own
    result.rows.append(
        Row(
            item="embed_tokens vs target embedding",
            declared="the target's (what SGLang serves)",
            actual=f"relative L2 distance {distance:.3g}",
            ok=served_as_trained,
        )  # fmt: skip
    )
    if served_as_trained:
        return
    served = "this export" if source.kind == "sglang" else "an SGLang export of this draft"
    result.findings.append(
        Finding(
            check="draft.embedding",
            severity="error" if source.kind == "sglang" else "warning",
            what=f"the draft's embed_tokens is not the target's embedding: SGLang replaces it with the "
            f"target's when it loads {served}, so the draft is served with token vectors it was not trained with",
            declared="embed_tokens.weight: the target's embedding (SGLang's set_embed)",
            actual=f"{source.path}: embed_tokens.weight at relative L2 distance {distance:.3g} from it",
            fix="serve it with vLLM (which loads the draft's embed_tokens), or retrain with train_embeddings=false",
        )
    )


def check_draft(
    source: DraftSource,
    *,
    target: LoadedTarget | None = None,
    data_contract: Contract | None = None,
    fingerprint: bool = True,
) -> CheckResult:
    """Every static check of a draft directory against a live target and/or the data's contract."""
    result = CheckResult(name=CHECK)
    contract = source.contract
    if contract is None:
        result.notes.append(
            f"{source.path}: no contract.json ({source.kind} export): identity and fingerprint unchecked"
        )
    shapes_ok = True
    if target is not None and contract is not None:
        shapes_ok = check_identity(contract, target, result)
        if shapes_ok and fingerprint:
            check_fingerprint_values(contract, target, result)
    if target is not None and shapes_ok and not any(f.severity == "error" for f in result.findings):
        check_embedding(source, target, result)  # (another target's embedding differs too: said above)
    if contract is not None and data_contract is not None:
        for line in contract_diff(contract, data_contract, names=("draft", "data")):
            field, _, values = line.partition(": ")
            draft_side, _, data_side = values.partition(" data=")
            result.findings.append(
                Finding(
                    check="draft.vs_data_contract",
                    severity="error",
                    what=f"the draft's contract and the data's contract disagree on {field}",
                    declared=f"draft {draft_side.removeprefix('draft=')}",
                    actual=f"data {data_side}",
                    fix="check the draft against the data it was trained on; to use this data, train a draft on it "
                    "(eaglewire train)",
                )
            )
    vocab = (
        target.vocab_size
        if target is not None
        else (contract.target.vocab_size if contract else source.vocab_size)
    )
    if vocab is not None:
        check_vocab_map(source, vocab, result)
    ht = (
        target.hidden_size
        if target is not None
        else (contract.target.hidden_size if contract else source.target_hidden_size)
    )
    if ht is not None and shapes_ok and source.kind == "eaglewire":
        check_fc_width(source, contract.num_aux if contract is not None else source.num_aux, ht, result)
    # engine exports: fc width, target_hidden_size and every other key the engine reads are
    # `export_check.check_export`'s, read with the engine's rules
    return result
