"""Relabelling: a dataset's or a draft's contract rewritten to name the boundaries its tensors really hold.

data.py   `eaglewire data relabel`: shards whose columns are right but labelled in another numbering
draft.py  `eaglewire draft relabel`: a copy of a draft trained on such data, with the labels it learned

Both prove the new labels by values with the doctor's checks first, so this package sits above
`doctor`, `data` and `draft` (which never import it).
"""
