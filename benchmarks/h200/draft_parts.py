"""Bring a trained draft back from the H200 in a few small files, and rebuild it here.

A draft directory (config.json + model.safetensors + contract.json, float32 weights) is ~170 MB
for SmolLM2 with Vd 16,384, and two thirds of that is `embed_tokens.weight` [V, H]: frozen during
training (unless train_embeddings) and an exact float32 copy of the target's embedding, which we
have here anyway. So:

    python benchmarks/h200/draft_parts.py pack --draft DRAFT_DIR --out OUTDIR [--max-mib 15]
    python benchmarks/h200/draft_parts.py unpack --parts OUTDIR --target smollm2 --out DRAFT_DIR

`pack` writes every tensor except embed_tokens.weight into draft_part0.safetensors,
draft_part1.safetensors, ... each at most --max-mib (a tensor larger than that is split along
dim 0). LOSSY: floating tensors are stored as bfloat16 (round to nearest even); integer tensors
(draft_to_target) keep their dtype. Every part's safetensors metadata (key `eaglewire_draft_parts`)
holds the whole manifest as JSON: the list of parts, where each tensor (or row range) lives, its
original dtype and shape, which tensors were cast, the sha256 of the original float32
embed_tokens bytes and of the original model.safetensors, and the draft directory's JSON files
(config.json, contract.json, best_setting.json when there) as text. So the parts are the only files.

`unpack` reads the parts, takes embed_tokens.weight from the target's safetensors (only that
tensor is read; `smollm2` means the converted reference target), checks it against the recorded
sha256 (a mismatch means the draft was trained with train_embeddings, or for another target),
casts the parts back to their original dtypes, writes the draft directory (config first, weights,
contract last; each write atomic) and checks that eaglewire.draft.io.load_draft loads it. The
rebuilt weights equal the original ones rounded to bf16; the embedding equals exactly.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eaglewire.errors import CheckpointError, EaglewireError, TargetFilesError
from eaglewire.io_utils import atomic_path, atomic_write_text, sha256_file
from eaglewire.output_marker import MARKER_FILE, OutputKind, write_marker

log = logging.getLogger("draft_parts")

FORMAT = "eaglewire-draft-parts"
VERSION = 1
METADATA_KEY = "eaglewire_draft_parts"
WEIGHTS_FILE = "model.safetensors"  # eaglewire.draft.io.WEIGHTS_FILE
EMBED = "embed_tokens.weight"  # the draft's copy of the target's embedding
TARGET_EMBED = "model.embed_tokens.weight"  # its name in a Hugging Face target's safetensors
PART_PREFIX = "draft_part"
STORED_FLOAT = torch.bfloat16
MAX_JSON_FILE_BYTES = 1 << 20  # JSON files of the draft directory carried as text in the manifest
MIB = 1 << 20


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"manifest: unknown dtype {name!r}")
    return dtype


def tensor_sha256(t: torch.Tensor) -> str:
    """sha256 of a tensor's raw bytes (C order, the machine's byte order: little-endian on x86/ARM)."""
    return hashlib.sha256(
        t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data
    ).hexdigest()


def part_name(i: int) -> str:
    return f"{PART_PREFIX}{i}.safetensors"


@dataclass(frozen=True)
class Piece:
    """Rows [start, stop) along dim 0 of tensor `name` (the whole tensor when `whole`), in part `part`."""

    name: str
    part: int
    start: int
    stop: int
    whole: bool
    nbytes: int

    @property
    def key(self) -> str:
        return self.name if self.whole else f"{self.name}#rows={self.start}:{self.stop}"


def plan_parts(tensors: dict[str, torch.Tensor], budget: int) -> list[Piece]:
    """Assign tensors to parts of at most `budget` data bytes, in order. A tensor that fits in a part
    stays whole (starting a new part when the current one is too full); a larger one is split along
    dim 0, its first rows filling the current part."""
    pieces: list[Piece] = []
    part, used = 0, 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        if size <= budget:
            if used + size > budget:
                part, used = part + 1, 0
            pieces.append(Piece(name, part, 0, t.shape[0] if t.dim() else 0, True, size))
            used += size
            continue
        rows = t.shape[0]
        row_bytes = size // rows
        if row_bytes > budget:
            raise CheckpointError(
                f"{name} {tuple(t.shape)}: one row along dim 0 is {row_bytes} bytes, more than a part's "
                f"{budget} bytes for data",
                fix="raise --max-mib",
            )
        start = 0
        while start < rows:
            fit = (budget - used) // row_bytes
            if fit == 0:
                part, used = part + 1, 0
                continue
            stop = min(rows, start + fit)
            pieces.append(Piece(name, part, start, stop, False, (stop - start) * row_bytes))
            used += (stop - start) * row_bytes
            start = stop
    return pieces


def header_estimate(metadata: dict[str, str], pieces: list[Piece], tensors: dict[str, torch.Tensor]) -> int:
    """An upper bound on a part's safetensors header (JSON with spaces; the real one has none)."""
    entries: dict[str, Any] = {"__metadata__": metadata}
    for p in pieces:
        shape = list(tensors[p.name].shape)
        if not p.whole:
            shape[0] = p.stop - p.start
        entries[p.key] = {"dtype": "BF16", "shape": shape, "data_offsets": [10**15, 10**15]}
    return 8 + len(json.dumps(entries).encode()) + 8


def build_manifest(
    draft: Path,
    weights_meta: dict[str, str],
    original: dict[str, tuple[str, list[int]]],
    stored: dict[str, torch.Tensor],
    pieces: list[Piece],
    hashes: dict[str, str],
    embed: torch.Tensor,
    max_bytes: int,
) -> dict[str, Any]:
    files: dict[str, str] = {}
    skipped: list[str] = []
    for f in sorted(draft.iterdir()):
        if f.name in (WEIGHTS_FILE, MARKER_FILE) or not f.is_file():  # the rebuilt draft gets its own marker
            continue
        if f.suffix == ".json" and f.stat().st_size <= MAX_JSON_FILE_BYTES:
            files[f.name] = f.read_text(encoding="utf-8")
        else:
            skipped.append(f.name)
    for required in ("config.json", "contract.json"):
        if required not in files:
            raise CheckpointError(f"draft {draft}: {required} missing")
    n_parts = max(p.part for p in pieces) + 1 if pieces else 0
    cast = sorted(n for n, t in stored.items() if t.dtype != dtype_from_name(original[n][0]))
    return {
        "format": FORMAT,
        "version": VERSION,
        "lossy": (
            f"floating tensors other than {EMBED} are stored as {dtype_name(STORED_FLOAT)} (round to nearest "
            "even) and cast back to their original dtype by unpack: the rebuilt draft equals the trained "
            f"one rounded to {dtype_name(STORED_FLOAT)}; {EMBED} is taken from the target, exactly"
        ),
        "source": str(draft),
        "weights_file": WEIGHTS_FILE,
        "weights_sha256": hashes["weights"],
        "weights_bytes": (draft / WEIGHTS_FILE).stat().st_size,
        "weights_metadata": weights_meta,
        "embed": {
            "name": EMBED,
            "target_name": TARGET_EMBED,
            "dtype": dtype_name(embed.dtype),
            "shape": list(embed.shape),
            "sha256": hashes["embed"],
        },
        "cast_to_bf16": cast,
        "kept_dtype": sorted(n for n in stored if n not in cast),
        "split_dim0": sorted({p.name for p in pieces if not p.whole}),
        "max_part_bytes": max_bytes,
        "parts": [part_name(i) for i in range(n_parts)],
        "tensors": {
            name: {
                "dtype": original[name][0],
                "shape": original[name][1],
                "stored_dtype": dtype_name(stored[name].dtype),
                "pieces": [
                    {"part": part_name(p.part), "key": p.key, "rows": [p.start, p.stop]}
                    for p in pieces
                    if p.name == name
                ],
            }
            for name in stored
        },
        "files": files,
        "files_left_out": skipped,
    }


def pack(draft: Path, out: Path, max_mib: float = 15.0) -> list[Path]:
    """Write the draft's tensors except embed_tokens.weight (floats as bf16) into parts of at most
    `max_mib` MiB in `out`; return the parts' paths. Older draft_part*.safetensors in `out` are removed."""
    draft, out = Path(draft), Path(out)
    weights = draft / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"draft {draft}: {WEIGHTS_FILE} missing")
    max_bytes = int(max_mib * MIB)
    original: dict[str, tuple[str, list[int]]] = {}
    stored: dict[str, torch.Tensor] = {}
    embed: torch.Tensor | None = None
    with safe_open(str(weights), framework="pt") as f:
        weights_meta = dict(f.metadata() or {})
        for name in sorted(f.keys()):
            t = f.get_tensor(name)
            if name == EMBED:
                embed = t
                continue
            original[name] = (dtype_name(t.dtype), list(t.shape))
            stored[name] = t.to(STORED_FLOAT) if t.is_floating_point() else t
    if embed is None:
        raise CheckpointError(f"{weights}: no {EMBED} tensor (found {sorted(original)})")

    hashes = {"weights": sha256_file(weights), "embed": tensor_sha256(embed)}
    # Every part carries the whole manifest: plan with room for its header, replan if that was short.
    reserve = 4096
    for _ in range(4):
        pieces = plan_parts(stored, max_bytes - reserve)
        manifest = build_manifest(draft, weights_meta, original, stored, pieces, hashes, embed, max_bytes)
        metadata = {"format": "pt", METADATA_KEY: json.dumps(manifest, separators=(",", ":"))}
        n_parts = len(manifest["parts"])
        need = max(
            (header_estimate(metadata, [p for p in pieces if p.part == i], stored) for i in range(n_parts)),
            default=0,
        )
        if need <= reserve:
            break
        reserve = need + 1024
    else:
        raise CheckpointError(f"could not fit the manifest's {need} bytes into parts of {max_bytes} bytes")

    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{PART_PREFIX}*.safetensors"):
        log.info("removing an older part %s", old)
        old.unlink()
    paths = []
    for i, name in enumerate(manifest["parts"]):
        state = {}
        for p in pieces:
            if p.part == i:
                t = stored[p.name]
                state[p.key] = t if p.whole else t[p.start : p.stop].clone()
        path = out / name
        with atomic_path(path) as tmp:
            save_file(state, str(tmp), metadata=metadata)
        size = path.stat().st_size
        if size > max_bytes:
            raise CheckpointError(f"{path}: {size} bytes, more than --max-mib {max_mib} ({max_bytes} bytes)")
        log.info("%s: %d tensors, %.2f MiB", name, len(state), size / MIB)
        paths.append(path)
    total = sum(p.stat().st_size for p in paths)
    log.info(
        "packed %s (%.1f MiB) into %d parts, %.2f MiB in all (LOSSY: %d floating tensors as bf16; %s left out, "
        "sha256 %s; split along dim 0: %s)",
        draft,
        manifest["weights_bytes"] / MIB,
        len(paths),
        total / MIB,
        len(manifest["cast_to_bf16"]),
        EMBED,
        manifest["embed"]["sha256"][:16],
        ", ".join(manifest["split_dim0"]) or "none",
    )
    return paths


def read_manifest(parts: Path) -> dict[str, Any]:
    """The manifest the parts in `parts` agree on; names any part that is missing or from another pack."""
    found = sorted(Path(parts).glob(f"{PART_PREFIX}*.safetensors"))
    if not found:
        raise CheckpointError(f"{parts}: no {PART_PREFIX}*.safetensors files")
    manifests: dict[str, dict[str, Any]] = {}
    for path in found:
        with safe_open(str(path), framework="pt") as f:
            text = (f.metadata() or {}).get(METADATA_KEY)
        if text is None:
            raise CheckpointError(
                f"{path}: no {METADATA_KEY!r} in its safetensors metadata (not a draft part?)"
            )
        manifests[path.name] = json.loads(text)
    manifest = manifests[found[0].name]
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise CheckpointError(
            f"{found[0]}: format {manifest.get('format')!r} version {manifest.get('version')!r}, "
            f"expected {FORMAT!r} version {VERSION}"
        )
    missing = [n for n in manifest["parts"] if n not in manifests]
    if missing:
        raise CheckpointError(f"{parts}: parts {missing} missing (the pack has {manifest['parts']})")
    other = sorted(n for n, m in manifests.items() if m["weights_sha256"] != manifest["weights_sha256"])
    if other:
        raise CheckpointError(
            f"{parts}: {other} come from another draft than {found[0].name} "
            f"(weights sha256 {manifest['weights_sha256'][:16]}...)",
            fix="keep one pack per folder",
        )
    extra = sorted(set(manifests) - set(manifest["parts"]))
    if extra:
        raise CheckpointError(f"{parts}: {extra} are not in the pack's list {manifest['parts']}")
    return manifest


def target_embedding(target: str | Path) -> torch.Tensor:
    """The target's input embedding [V, Ht], read alone from its safetensors (`smollm2`: the reference)."""
    from eaglewire.target.loading import resolve_target_path

    path = resolve_target_path(target)
    if not path.is_dir():
        raise TargetFilesError(
            f"target {path}: expected a Hugging Face model directory with safetensors weights",
            fix="point --target at the converted directory (or `smollm2`)",
        )
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise TargetFilesError(f"target {path}: no *.safetensors files")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            names = f.keys()
            if TARGET_EMBED in names:
                return f.get_tensor(TARGET_EMBED)
    raise TargetFilesError(f"target {path}: no {TARGET_EMBED} in {[f.name for f in files]}")


def unpack(parts: Path, target: str | Path, out: Path, *, force: bool = False) -> Path:
    """Rebuild the draft directory `out` from the parts in `parts` and the target's embedding; check that
    load_draft loads it. Raises CheckpointError when the target's embedding is not the one packed."""
    from eaglewire.draft.io import load_draft

    parts, out = Path(parts), Path(out)
    manifest = read_manifest(parts)
    if (out / WEIGHTS_FILE).exists() and not force:
        raise CheckpointError(f"{out}: already holds a draft", fix="pass --force, or another --out")

    tensors: dict[str, torch.Tensor] = {}
    with ExitStack() as stack:
        handles = {
            name: stack.enter_context(safe_open(str(parts / name), framework="pt"))
            for name in manifest["parts"]
        }
        for name, info in manifest["tensors"].items():
            chunks = [handles[p["part"]].get_tensor(p["key"]) for p in info["pieces"]]
            t = chunks[0] if len(chunks) == 1 else torch.cat(chunks, dim=0)
            if list(t.shape) != info["shape"]:
                raise CheckpointError(
                    f"{parts}: {name} rebuilt as {tuple(t.shape)}, expected {tuple(info['shape'])}"
                )
            tensors[name] = t.to(dtype_from_name(info["dtype"]))

    emb = manifest["embed"]
    embed = target_embedding(target).to(dtype_from_name(emb["dtype"])).contiguous()
    if list(embed.shape) != emb["shape"]:
        raise CheckpointError(
            f"target {target}: {TARGET_EMBED} is {tuple(embed.shape)}, the draft's {EMBED} was "
            f"{tuple(emb['shape'])}: the draft was trained for another target"
        )
    digest = tensor_sha256(embed)
    if digest != emb["sha256"]:
        raise CheckpointError(
            f"target {target}: {TARGET_EMBED} as {emb['dtype']} has sha256 {digest}, the packed draft's "
            f"{EMBED} had sha256 {emb['sha256']}: the draft was trained with train_embeddings or for another "
            "target, so its embedding cannot be rebuilt from this one",
            fix="unpack against the target the draft was trained for; a draft with trained embeddings "
            f"needs its {WEIGHTS_FILE} brought back whole",
        )
    tensors[EMBED] = embed

    out.mkdir(parents=True, exist_ok=True)
    files = manifest["files"]
    for name, text in files.items():  # config.json and the rest first, the contract last (as save_draft)
        if name != "contract.json":
            atomic_write_text(out / name, text)
    meta = dict(manifest["weights_metadata"])
    meta["rebuilt_by"] = (
        f"benchmarks/h200/draft_parts.py from bf16 parts of weights sha256 {manifest['weights_sha256']}"
    )
    with atomic_path(out / WEIGHTS_FILE) as tmp:
        save_file(tensors, str(tmp), metadata=meta)
    atomic_write_text(out / "contract.json", files["contract.json"])
    # the rebuilt weights are the bf16 round trip, not the original bytes: record them as they are now
    write_marker(out, OutputKind.DRAFT, ("config.json", WEIGHTS_FILE, "contract.json"))
    load_draft(out)  # raises if the rebuilt directory does not load
    log.info(
        "rebuilt %s: %d tensors (%d cast back from bf16), %s from %s (sha256 matches); load_draft loads it",
        out,
        len(tensors),
        len(manifest["cast_to_bf16"]),
        EMBED,
        target,
    )
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    pk = sub.add_parser("pack", help="draft directory -> draft_part*.safetensors (LOSSY: bf16)")
    pk.add_argument("--draft", type=Path, required=True, help="the draft directory (save_draft's)")
    pk.add_argument("--out", type=Path, required=True, help="folder for the parts (older parts removed)")
    pk.add_argument("--max-mib", type=float, default=15.0, help="largest part in MiB (2**20 bytes)")
    up = sub.add_parser("unpack", help="draft_part*.safetensors + the target's embedding -> draft directory")
    up.add_argument("--parts", type=Path, required=True, help="folder holding the draft_part*.safetensors")
    up.add_argument("--target", required=True, help="the target's model directory, or 'smollm2'")
    up.add_argument("--out", type=Path, required=True, help="the draft directory to write")
    up.add_argument("--force", action="store_true", help="overwrite a draft already in --out")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    try:
        if args.command == "pack":
            for path in pack(args.draft, args.out, args.max_mib):
                print(f"{path}\t{path.stat().st_size}")
        else:
            print(unpack(args.parts, args.target, args.out, force=args.force))
    except EaglewireError as e:
        log.error("%s", e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
