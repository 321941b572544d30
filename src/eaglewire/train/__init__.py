"""EAGLE-3 training: training-time-test loss, online/offline data, the loop, checkpoints, distributed, eval.

Entry points: `eaglewire.train.loop.train` (library), `eaglewire.train.run.run_training` (what the
CLI calls), `eaglewire.train.ttt.ttt_unroll` (the TTT forward, wired as served),
`eaglewire.train.evaluate` (per-step accuracy and per-position draft ranks on held-out rows; the
acceptance length predicted from them is `eaglewire.predict`'s).
"""

# The names below load on first use (PEP 562), not with the package: importing
# `eaglewire.train.config` alone (the quickstart presets, benchmarks/h200/gates.py) then costs no
# torch import, ~0.1 s instead of ~4 s on a 2-core CPU.
import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eaglewire.train.config import TrainConfig
    from eaglewire.train.loop import TrainResult, train
    from eaglewire.train.target_side import OfflineTarget, OnlineTarget, TargetHead
    from eaglewire.train.ttt import ttt_attention_mask, ttt_unroll

_HOME = {
    "OfflineTarget": "target_side",
    "OnlineTarget": "target_side",
    "TargetHead": "target_side",
    "TrainConfig": "config",
    "TrainResult": "loop",
    "train": "loop",
    "ttt_attention_mask": "ttt",
    "ttt_unroll": "ttt",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


__all__ = [
    "OfflineTarget",
    "OnlineTarget",
    "TargetHead",
    "TrainConfig",
    "TrainResult",
    "train",
    "ttt_attention_mask",
    "ttt_unroll",
]
