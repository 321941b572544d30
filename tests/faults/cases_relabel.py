"""Fixes that are one command: `eaglewire data relabel` and `eaglewire draft relabel`, both ways.

They run on the mislabelled data and drafts `cases_doctor.build` puts in the base workspace (labels
[2, 4, 5], columns really [3, 5, 6]; `draft_learned` learned [3, 5, 6] with a contract saying [2, 4, 5]):

- the data relabelled to what its values are: exit 0, only contract.json and manifest.json change (the
  shards are byte-identical), and then `eaglewire doctor --data --target` finds nothing;
- relabelled to boundaries its values are not: exit 2, each column named with what it really is, and the
  command that would be right; nothing written;
- the draft that learned the data's real boundaries rewired to them: a new directory with the same config
  and weights (byte for byte), which the doctor then finds consistent with the live target; the source
  draft is untouched;
- a boundary list of another length than the draft's fc reads: exit 2 before the target loads.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from tests.faults.cases_doctor import MISLABEL, STORED
from tests.faults.harness import Case, console_script

DATA = f"{{ws}}/{MISLABEL}/data_learned"
DRAFT = f"{{ws}}/{MISLABEL}/draft_learned"
REAL = ",".join(map(str, STORED))  # "3,5,6"


def _doctor(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [console_script(), "doctor", *argv], env=env, capture_output=True, text=True, timeout=180, check=False
    )


def _data_is_clean(ws: Path) -> None:
    """The relabelled data passes the doctor's data check on the live target."""
    r = _doctor("--data", f"{ws}/{MISLABEL}/data_learned", "--target", f"{ws}/target")
    assert r.returncode == 0 and "everything matches" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


def _draft_copied_and_clean(ws: Path) -> None:
    """Same config and weights, byte for byte; the doctor finds the new contract right on the live target."""
    src, out = ws / MISLABEL / "draft_learned", ws / "relabelled"
    for name in ("config.json", "model.safetensors"):
        assert (
            hashlib.sha256((src / name).read_bytes()).digest()
            == hashlib.sha256((out / name).read_bytes()).digest()
        )
    assert '"aux_boundaries": [\n    3,\n    5,\n    6\n  ]' in (out / "contract.json").read_text(
        encoding="utf-8"
    )
    r = _doctor("--draft", str(out), "--target", f"{ws}/target")
    assert r.returncode == 0 and "everything matches" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


CASES = [
    Case(
        "relabel:data-to-its-values",
        f"data relabel --data {DATA} --target {{ws}}/target --aux-boundaries {REAL} --device cpu",
        0,
        says=("relabelled: manifest.json, contract.json rewritten (the shards are untouched)",),
        changes=(f"{MISLABEL}/data_learned/contract.json", f"{MISLABEL}/data_learned/manifest.json"),
        then=_data_is_clean,
    ),
    Case(
        "relabel:data-to-other-boundaries",
        f"data relabel --data {DATA} --target {{ws}}/target --aux-boundaries 4,6,7 --device cpu",
        2,
        says=(
            f"--data {DATA}: the stored states are not what --aux-boundaries 4,6,7",
            "aux[0]: relabel says boundary 4 (output of layer 3); the values are boundary 3 (output of layer 2)",
            "nothing written",
            f"fix: relabel them as what they are: eaglewire data relabel --data {DATA} --target {{ws}}/target "
            f"--aux-boundaries {REAL}",
        ),
    ),
    Case(
        "relabel:draft-to-what-it-learned",
        f"draft relabel --draft {DRAFT} --target {{ws}}/target --aux-boundaries {REAL} --out {{ws}}/relabelled",
        0,
        says=("relabelled draft written to", "[3, 5, 6]"),
        then=_draft_copied_and_clean,
    ),
    Case(
        "relabel:draft-fc-reads-another-count",
        f"draft relabel --draft {DRAFT} --target {{ws}}/target --aux-boundaries 3,5 --out {{ws}}/relabelled",
        2,
        says=(
            "--aux-boundaries 3,5: 2 boundaries, but the draft",
            "reads 3 aux states (its fc.weight reads num_aux x target_hidden_size = 3 x 64 = 192 inputs",
            "fix: pass 3 boundaries to --aux-boundaries",
        ),
    ),
]
