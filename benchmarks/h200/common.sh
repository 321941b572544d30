# Sourced by full_run.sh, snapshot.sh and collect.sh (needs $PY).
# draft_dir_of RUN: the trained draft's directory, from the quickstart run RUN's train stage marker
# (fails, printing nothing, before that stage has finished).
draft_dir_of() {
  [ -f "$1/train.json" ] && "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["result"]["draft_dir"])' "$1/train.json"
}
