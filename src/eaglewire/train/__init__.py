"""EAGLE-3 training: training-time-test loss, online/offline data, the loop, checkpoints, distributed, eval.

Entry points: `eaglewire.train.loop.train` (library), `eaglewire.train.run.run_training` /
`run_eval` (what the CLI calls), `eaglewire.train.ttt.ttt_unroll` (the TTT forward, wired as served),
`eaglewire.train.evaluate` (per-step accuracy and predicted acceptance length).
"""

from eaglewire.train.config import TrainConfig
from eaglewire.train.evaluate import EvalResult, evaluate_draft
from eaglewire.train.loop import TrainResult, train
from eaglewire.train.replay import full_tree, predicted_tau_chain, predicted_tau_tree
from eaglewire.train.target_side import OfflineTarget, OnlineTarget, TargetHead
from eaglewire.train.ttt import ttt_attention_mask, ttt_unroll

__all__ = [
    "EvalResult",
    "OfflineTarget",
    "OnlineTarget",
    "TargetHead",
    "TrainConfig",
    "TrainResult",
    "evaluate_draft",
    "full_tree",
    "predicted_tau_chain",
    "predicted_tau_tree",
    "train",
    "ttt_attention_mask",
    "ttt_unroll",
]
