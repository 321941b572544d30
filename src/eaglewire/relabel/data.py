"""`eaglewire data relabel`: correct the labels of hidden-state shards whose tensors are right.

The doctor tells by values which boundary each stored column is (`doctor/data_check.py`). When the
labels are what is wrong (a capture whose layer ids were read in another numbering, an import given
the wrong ids), the fix is to relabel, not to recapture. Since issue 43 a contract's aux list must
agree with its fingerprint's labels, so editing one field by hand is refused on the next load: this
module writes the whole contract again.

Order: the new labels are first proven by values on the live target (the doctor's data check, run
against a contract that declares them: every column must be the state it is about to be called, to
the dtype's tolerance); only then is a contract built on that target at those boundaries (identity,
fingerprint) and written into `manifest.json` (the one readers use) and `contract.json`, each
atomically, and the marker's checksums refreshed where it lists either file. The shards are never
touched. A rerun with the same labels writes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from eaglewire.contract.contract import CONTRACT_FILE, IDENTITY_KEYS, Contract, FinalState
from eaglewire.contract.fingerprint import NormSide, StateKey
from eaglewire.contract.numbering import validate_boundaries
from eaglewire.data.shards import MANIFEST_FILE, ShardDataset
from eaglewire.data.types import CapturedRecord
from eaglewire.doctor.data_check import DataWiring, check_data_against_target
from eaglewire.doctor.diagnosis import key_text
from eaglewire.errors import BoundaryError, ConfigError, ContractMismatchError, DataFormatError
from eaglewire.io_utils import atomic_write_json
from eaglewire.output_marker import MARKER_FILE, OutputKind, read_marker, update_marker
from eaglewire.target.identity import build_contract, target_identity
from eaglewire.target.loading import LoadedTarget
from eaglewire.typed_config import read_json_file, to_dict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataRelabel:
    """What `relabel_data` did: the labels before and after, the evidence, and the files it rewrote."""

    directory: Path
    old: Contract
    new: Contract
    wiring: DataWiring  # the by-values check of the new labels (rows: declared vs actual per column)
    written: tuple[str, ...]  # files rewritten; empty when the data already said this


def requested_final(
    current: FinalState, num_layers: int, *, boundary: int | None, norm: NormSide | None
) -> FinalState:
    """The final state `--final-boundary` / `--final-norm` ask for; what is not given stays `current`.
    `--final-norm post` alone means boundary L (the only post-norm state)."""
    if norm == "post" and boundary is None:
        boundary = num_layers
    b = current.boundary if boundary is None else boundary
    n = current.norm if norm is None else norm
    if not 0 <= b <= num_layers:
        raise BoundaryError(
            f"--final-boundary: expected 0 <= --final-boundary <= {num_layers} (L = {num_layers} decoder "
            f"layers), got {b}"
        )
    if n == "post" and b != num_layers:
        given = "--final-norm post" if norm is not None else "the final norm 'post' (the current label's)"
        raise ConfigError(
            f"--final-boundary {b} with {given}: the post-norm state exists only at boundary L = {num_layers}",
            fix=f"pass --final-norm pre with --final-boundary {b}, or --final-boundary {num_layers}",
        )
    return FinalState(boundary=b, norm=n)


def contract_on_target(
    target: LoadedTarget, aux: Sequence[int], final: FinalState, *, fingerprint: bool = True
) -> Contract:
    """The contract for `aux` and `final` built on the live target (so its fingerprint's labels are
    the states' real boundaries on that target)."""
    return build_contract(target, aux, final=final, fingerprint=fingerprint, what="--aux-boundaries")


def identity_differences(declared: Contract, target: LoadedTarget) -> list[str]:
    """`key: contract=.. live=..` for each target identity field that differs from the live target."""
    have, live = to_dict(declared.target), to_dict(target_identity(target))
    return [
        f"target.{k}: contract={str(have[k])[:16]} live={str(live[k])[:16]}"
        for k in IDENTITY_KEYS
        if have[k] != live[k]
    ]


def check_aux_count(aux: Sequence[int], have: int, *, what: str, width: str) -> None:
    """A relabel names every aux column, no more and no fewer: `have` columns are stored/read."""
    if len(aux) != have:
        raise ConfigError(
            f"--aux-boundaries {','.join(str(b) for b in aux)}: {len(aux)} boundaries, but {what} "
            f"{have} aux states ({width}); a relabel names each of them, in order",
            fix=f"pass {have} boundaries to --aux-boundaries (`eaglewire doctor` says which states they are)",
        )


def check_data_request(old: Contract, aux: Sequence[int], directory: Path) -> tuple[int, ...]:
    """`aux` are valid boundaries of the data's target, one per stored aux column (before any work)."""
    checked = validate_boundaries(aux, old.target.num_layers, what="--aux-boundaries")
    check_aux_count(
        checked,
        old.num_aux,
        what=f"{directory} stores",
        width=f"its aux is {old.num_aux} x Ht {old.target.hidden_size} = {old.aux_width} wide",
    )
    return checked


def open_shards(directory: Path) -> ShardDataset:
    """The shard directory (complete capture, manifest and contract read and checked)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataFormatError(
            f"--data {directory}: no such directory",
            fix="pass the shard directory `eaglewire data capture` wrote",
        )
    return ShardDataset(directory)


def relabel_data(
    dataset: ShardDataset,
    target: LoadedTarget,
    aux_boundaries: Sequence[int],
    *,
    final: FinalState | None = None,
    target_arg: str | None = None,
    max_records: int = 4,
    max_tokens: int = 128,
) -> DataRelabel:
    """Prove by values that the stored columns of `dataset` are `aux_boundaries` (and `final`,
    default the current label) of `target`, then write a contract built on `target` at them.

    Refuses (ContractMismatchError, nothing written) when any column is another state, when the
    target is not the one the data was captured from, or when the states match only to a coarser
    dtype than the target ran in. The target's dtype is the new contract's."""
    directory, old = dataset.directory, dataset.contract
    target_arg = target_arg if target_arg is not None else str(target.path)
    aux = check_data_request(old, aux_boundaries, directory)
    final = final if final is not None else old.final
    diffs = identity_differences(old, target)
    if diffs:
        raise ContractMismatchError(
            f"--target {target_arg}: not the target {directory} was captured from:\n  " + "\n  ".join(diffs),
            fix=f"pass the target the data was captured from (--target {old.target.name or '<its path>'}); "
            "a relabel changes labels, never the target",
        )
    declared = contract_on_target(target, aux, final, fingerprint=False)  # what is to be proven
    records = _sample(dataset, max_records)
    wiring = check_data_against_target(
        records, declared, target, max_records=max_records, max_tokens=max_tokens, data_path=directory,
        target_arg=target_arg,
    )  # fmt: skip
    if wiring.result.skipped:
        raise DataFormatError(
            f"--data {directory}: no records to check the labels on", fix="recapture the data"
        )
    if wiring.result.findings:
        raise ContractMismatchError(
            _refusal(directory, declared, wiring, target, len(records)), fix=_refusal_fix(wiring)
        )
    new = contract_on_target(target, aux, final)
    written = _write_contract(directory, old, new)
    log.info(
        "%s: %s (by values on %s, %d records)",
        directory,
        f"relabelled, wrote {', '.join(written)}" if written else "already labelled so, nothing written",
        target_arg,
        len(records),
    )
    return DataRelabel(directory=directory, old=old, new=new, wiring=wiring, written=written)


def _sample(dataset: ShardDataset, n: int) -> list[CapturedRecord]:
    """Up to `n` records spread over the dataset (the doctor's choice, so both look at the same ones)."""
    if len(dataset) <= n:
        return [dataset[i] for i in range(len(dataset))]
    return [dataset[int(i * len(dataset) / n)] for i in range(n)]


def _refusal(directory: Path, declared: Contract, wiring: DataWiring, target: LoadedTarget, n: int) -> str:
    L = target.num_layers
    asked = f"--aux-boundaries {','.join(str(b) for b in declared.aux_boundaries)}, final = " + key_text(
        StateKey(declared.final.boundary, declared.final.norm), L
    )
    lines = [
        f"{row.item}: relabel says {row.declared}; the values are {row.actual} ({row.note})"
        for row in wiring.result.rows
        if not row.ok
    ]
    others = [
        f"{f.check}: {f.what} (declared {f.declared}; actual {f.actual})"
        for f in wiring.result.findings
        if f.check not in ("data.aux", "data.final")
    ]
    return (
        f"--data {directory}: the stored states are not what {asked} says (by values on the live target: "
        f"{wiring.result.notes[-1] if wiring.result.notes else f'{n} record(s)'}); nothing written:\n  "
        + "\n  ".join(lines + others)
    )


def _refusal_fix(wiring: DataWiring) -> str:
    if wiring.relabel is not None:
        return f"relabel them as what they are: {wiring.relabel}"
    return (
        "the states are not all states of this target (or do not cover the tokens): recapture the data with "
        "`eaglewire data capture` (see `eaglewire doctor --data` for each column)"
    )


def _write_contract(directory: Path, old: Contract, new: Contract) -> tuple[str, ...]:
    """Write `new` into manifest.json (first: readers use it) and contract.json, each atomically and only
    where it differs; then the marker's checksums of whichever it lists. When the wiring is unchanged the
    old contract is kept as it is (a recomputed fingerprint may differ in the last bits on another device)."""
    manifest_path, contract_path = directory / MANIFEST_FILE, directory / CONTRACT_FILE
    manifest = read_json_file(manifest_path)
    same = (
        old.fingerprint is not None
        and old.dtype == new.dtype
        and old.aux_boundaries == new.aux_boundaries
        and old.final == new.final
        and to_dict(old.target) | {"name": ""} == to_dict(new.target) | {"name": ""}
    )
    content = manifest["contract"] if same else new.to_json()
    written = []
    if manifest["contract"] != content:
        atomic_write_json(manifest_path, {**manifest, "contract": content})
        written.append(MANIFEST_FILE)
    try:
        current = read_json_file(contract_path) if contract_path.is_file() else None
    except ConfigError:  # unreadable: it is rewritten
        current = None
    if current != content:
        atomic_write_json(contract_path, content)
        written.append(CONTRACT_FILE)
    marker = read_marker(directory)
    listed = [n for n in written if marker is not None and n in marker.files]
    if listed:
        update_marker(directory, OutputKind.SHARDS, listed)
        written.append(MARKER_FILE)
    if written:
        Contract.from_json(read_json_file(manifest_path)["contract"], where=str(manifest_path))  # reads back
    return tuple(written)


def describe(result: DataRelabel) -> list[list[str]]:
    """Rows for the CLI's table: each column's label before and after, and its distance."""
    L = result.new.target.num_layers
    rows = [
        [f"aux[{i}]", key_text(StateKey(a), L), key_text(StateKey(b), L)]
        for i, (a, b) in enumerate(zip(result.old.aux_boundaries, result.new.aux_boundaries, strict=True))
    ]
    rows.append(
        [
            "final",
            key_text(StateKey(result.old.final.boundary, result.old.final.norm), L),
            key_text(StateKey(result.new.final.boundary, result.new.final.norm), L),
        ]
    )
    rows.append(["dtype", result.old.dtype, result.new.dtype])
    return rows
