"""Export drafts to SGLang / vLLM (speculators) and import theirs (and EAGLE's official checkpoints).

Foreign tensor names and config keys (`midlayer.*`, `layers.0.*`, `d2t`, `t2d`, ...) live only in
this package; `keys` records which engine file and version each was read from.
"""

from eaglewire.export.exporting import ExportResult, export_draft
from eaglewire.export.importing import ImportResult, import_draft

__all__ = ["ExportResult", "ImportResult", "export_draft", "import_draft"]
