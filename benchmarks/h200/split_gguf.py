"""Split the reference GGUF into parts .gguf_a/part00, .gguf_b/part01, ... so that every device call fits.

Each device call carries the working tree (tracked + untracked-not-ignored files) plus its carried
folders, at most 64 MiB. Call 1 carries .gguf_a and .whl (gguf_part1.sh), each middle call one more
folder (gguf_part.sh), and the last call the last folder while it launches full_run.sh, which joins
the parts (gguf_part2.sh). The tree grows with every recorded run (benchmarks/results): two calls
fitted until 2026-12-02, when the tree reached 13.4 MiB, so this takes as few calls as fit (at least
two), sizes the parts so that every call keeps the same headroom, writes them, checks that they join
to the GGUF's sha256, and prints each call's carry.

    PYTHONPATH=src .venv/bin/python benchmarks/h200/split_gguf.py
"""

from __future__ import annotations

import hashlib
import shutil
import string
import subprocess
import sys
from pathlib import Path

from eaglewire.target.reference import SMOLLM2, locate_reference_gguf, verify_gguf

LIMIT = 64 * 2**20  # what one device call may carry, working tree included
MARGIN = 2**20  # room for files a session adds between splitting and calling


def tree_bytes(repo: Path) -> int:
    """Bytes of the files a call sends besides `carry`: tracked and untracked-not-ignored."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        check=True,
        capture_output=True,
    ).stdout
    paths = {repo / p for p in out.decode().split("\0") if p}
    return sum(p.stat().st_size for p in paths if p.is_file())


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def folder(k: int) -> str:
    return f".gguf_{string.ascii_lowercase[k]}"


def plan(gguf_bytes: int, tree: int, wheels: int) -> list[int]:
    """Part sizes for the fewest calls (>= 2) that fit: call 1 also carries the wheels, and every
    call is left the same headroom under LIMIT - MARGIN."""
    room = LIMIT - MARGIN - tree  # what one call can carry besides the tree
    if room <= 0:
        sys.exit(
            f"the working tree alone ({tree / 2**20:.1f} MiB) leaves no room in a {LIMIT / 2**20:.0f} MiB call"
        )
    calls = max(2, -(-(gguf_bytes + wheels) // room))
    if calls > len(string.ascii_lowercase):
        sys.exit(f"{calls} calls: move large recorded results out of the tree")
    each = -(-(gguf_bytes + wheels) // calls)  # carried bytes per call, wheels counted in call 1
    sizes = [each - wheels] + [each] * (calls - 1)
    sizes[-1] = gguf_bytes - sum(sizes[:-1])
    return sizes


def main() -> int:
    repo = Path(__file__).resolve().parents[2]
    gguf = locate_reference_gguf()
    verify_gguf(gguf)  # size and sha256 (eaglewire.target.reference.SMOLLM2)
    data = gguf.read_bytes()
    tree, wheels = tree_bytes(repo), folder_bytes(repo / ".whl")
    sizes = plan(len(data), tree, wheels)
    for old in repo.glob(".gguf_?"):  # an earlier split's parts would be carried and joined too
        shutil.rmtree(old)
    offset = 0
    for k, size in enumerate(sizes):
        (repo / folder(k)).mkdir()
        (repo / folder(k) / f"part{k:02d}").write_bytes(data[offset : offset + size])
        offset += size
    joined = b"".join((repo / folder(k) / f"part{k:02d}").read_bytes() for k in range(len(sizes)))
    if hashlib.sha256(joined).hexdigest() != SMOLLM2.sha256:
        sys.exit("the written parts do not join to the GGUF: rerun")
    for k, size in enumerate(sizes):
        carry = [folder(k), ".whl"] if k == 0 else [folder(k)]
        run = (
            "bash benchmarks/h200/gguf_part1.sh"
            if k == 0
            else "launch full_run.sh (or diag.sh)"
            if k == len(sizes) - 1
            else "bash benchmarks/h200/gguf_part.sh"
        )
        total = tree + size + (wheels if k == 0 else 0)
        print(f"call {k + 1}: carry {carry}, {total / 2**20:.1f} MiB of {LIMIT / 2**20:.0f} MiB: {run}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
