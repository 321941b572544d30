"""eaglewire doctor: will the draft see, when served, the hidden states it was trained on?

Checks (each returns a `CheckResult` of declared-vs-actual rows and `Finding`s, every finding
with its one fix):

- `data_check.check_data_against_target`: which boundary each stored column really is, by values.
- `draft_check.check_draft`: the draft's contract vs the live target (identity, fingerprint),
  its vocabulary map, its fc width, and its contract vs the data's.
- `export_check.check_export`: an SGLang or vLLM export read the way its engine reads it (layer
  ids by the engine's rules and, with a target, by values; sizes; norm flags), no serving
  arguments needed.
- `standalone.check_standalone`: step-0 accuracy with the trained wiring and with each wiring
  a serving engine would feed (the field reports' `test_drafter_standalone`);
  `standalone.learned_wiring`: which wiring a draft learned, when data and draft disagree.
- `sglang_lint.lint_sglang`, `vllm_lint.lint_vllm`: serving settings read the way the engines
  read them (effective next to requested).
- `trace.run_trace`: one prompt through the engine, every target -> draft tensor recorded.

`run.diagnose` runs every check its inputs allow; `run.run_doctor` loads them from paths (CLI).
"""

from eaglewire.doctor.findings import CheckResult, DoctorReport, Finding, Row
from eaglewire.doctor.run import DoctorOptions, diagnose, run_doctor

__all__ = ["CheckResult", "DoctorOptions", "DoctorReport", "Finding", "Row", "diagnose", "run_doctor"]
