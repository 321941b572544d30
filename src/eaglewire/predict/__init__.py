"""Predicted acceptance length (tau): what a draft will accept when served, computed offline.

ranks -> replay -> predictors, each module one stage:

  eaglewire.train.evaluate   the training-time-test forward over held-out rows: per-step accuracy and
                             each position's draft rank (training's own evaluation; predict starts here)
  replay.py                  the pure math: static trees as rank paths, the drafts each round accepts,
                             decoding replayed over held-out responses (no model, no data loading)
  evaluation.py              EvalResult: an evaluation's ranks replayed for chains and static trees;
                             evaluate_draft / run_eval (what `eaglewire eval` runs)
  predictor.py               the TauPredictor protocol, a JSON summary as a predictor, the static tree
                             approximating an engine setting, predicted-vs-measured rows
  text_replay.py             TextRunner: the engine's own drafter decoding a known greedy text (the
                             dynamic tree, exactly, with no target forward per round)
  heldout_trees.py           dynamic trees predicted over the held-out answers
  served.py                  the prediction over the very text a bench served

`eaglewire eval`, `eaglewire bench` (its prediction check) and `eaglewire doctor` (the served check's
replay) call this package; it imports train, engine, target, draft and data, and none of them imports it.
"""
