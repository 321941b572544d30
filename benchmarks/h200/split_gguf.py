"""Split the reference GGUF into .gguf_a/part00 and .gguf_b/part01 so both device calls fit.

Each device call carries the working tree (tracked + untracked-not-ignored files) plus its carried
folders, at most 64 MiB: call 1 carries .gguf_a and .whl, call 2 carries .gguf_b. The tree grows
with every recorded run (benchmarks/results), so a fixed split point stops fitting one day (on
2026-12-01 a 50 MB first half no longer did). This picks the point that leaves both calls the same
headroom, writes the halves, checks that they join to the GGUF's sha256, and prints the sizes.

    PYTHONPATH=src .venv/bin/python benchmarks/h200/split_gguf.py
"""

from __future__ import annotations

import hashlib
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


def main() -> int:
    repo = Path(__file__).resolve().parents[2]
    gguf = locate_reference_gguf()
    verify_gguf(gguf)  # size and sha256 (DESIGN.md)
    data = gguf.read_bytes()
    tree, wheels = tree_bytes(repo), folder_bytes(repo / ".whl")
    first = (len(data) - wheels) // 2  # call 1: tree + wheels + first; call 2: tree + the rest
    calls = {"call 1 (.gguf_a .whl)": tree + wheels + first, "call 2 (.gguf_b)": tree + len(data) - first}
    for name, size in calls.items():
        print(f"{name}: {size / 2**20:.1f} MiB of {LIMIT / 2**20:.0f} MiB")
    if max(calls.values()) > LIMIT - MARGIN:
        sys.exit(
            f"the working tree ({tree / 2**20:.1f} MiB) + .whl ({wheels / 2**20:.1f} MiB) + the GGUF "
            f"({len(data) / 2**20:.1f} MiB) do not fit two calls of {LIMIT / 2**20:.0f} MiB with "
            f"{MARGIN / 2**20:.0f} MiB to spare: move a large recorded result out of the tree, or carry "
            "the chitchat wheel in a third call"
        )
    for folder, name, part in ((".gguf_a", "part00", data[:first]), (".gguf_b", "part01", data[first:])):
        (repo / folder).mkdir(exist_ok=True)
        (repo / folder / name).write_bytes(part)
    joined = (repo / ".gguf_a/part00").read_bytes() + (repo / ".gguf_b/part01").read_bytes()
    if hashlib.sha256(joined).hexdigest() != SMOLLM2.sha256:
        sys.exit("the written halves do not join to the GGUF: rerun")
    print(f"wrote .gguf_a/part00 ({first:,} bytes) and .gguf_b/part01 ({len(data) - first:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
