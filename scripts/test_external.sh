#!/usr/bin/env bash
# The cross-check against the `speculators` package (vLLM's draft format), kept out of CI: its import
# chain needs ~300 MB of packages unrelated to eaglewire. They go into .venv-external/ (not the main
# venv), with --no-deps so torch and transformers stay as pinned.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
source "$root/scripts/setup_env.sh"
site="$root/.venv-external"
if [ ! -f "$site/.done" ]; then
  python -m pip install -q --no-deps --target "$site" speculators==0.9.0 openai httpx2 sniffio datasets \
    multiprocess pandas python-dateutil pyarrow dill xxhash hs-connectors==0.9.0 loguru
  touch "$site/.done"
fi
cd "$root"
PYTHONPATH="$site" python -m pytest -q -m external tests/unit/export/test_external_speculators.py "$@"
