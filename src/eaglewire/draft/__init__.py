"""The EAGLE-3 draft model, its config, initialisation and (de)serialisation."""

from eaglewire.draft.config import DraftConfig, draft_config_for_target
from eaglewire.draft.model import DraftOutput, Eagle3Draft, GrowingKV

__all__ = ["DraftConfig", "DraftOutput", "Eagle3Draft", "GrowingKV", "draft_config_for_target"]
