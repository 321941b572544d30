#!/usr/bin/env bash
# Set up ./.venv and run the quickstart pipeline on the reference target (SmolLM2-135M-Instruct).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
source "$root/scripts/setup_env.sh"
exec eaglewire quickstart "$@"
