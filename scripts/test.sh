#!/usr/bin/env bash
# Set up ./.venv and run lint, type checks and the whole test suite (what CI runs).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
source "$root/scripts/setup_env.sh"
cd "$root"
ruff check src tests benchmarks
ruff format --check src tests benchmarks
mypy
python -m pytest -q --durations=15 "$@"
