#!/usr/bin/env bash
# The cross-check of our exports against the engines' own released code (issue 44, item 4), kept out
# of CI: it installs sglang, vllm and speculators by version into side folders under
# $EAGLEWIRE_HOME/external/ (default ~/.cache/eaglewire/external; never the repository), with
# --no-deps so torch and transformers stay as pinned, and runs the tests marked `external` with each
# on the path in turn:
#
#   sglang 0.5.12 and 0.5.23 (before / with PR #25454): do not import on a CPU machine (triton,
#     apache-tvm-ffi, sgl kernels, a torchvision built for the installed torch); their
#     set_eagle3_layers_to_capture and LlamaForCausalLMEagle3.load_weights are compiled alone from the
#     installed files and run on our ids and our export (tests/unit/export/test_external_sglang.py);
#   vllm 0.33.0: its speculators config parsing, aux-layer selection and the target models' capture
#     loops run on our exports (test_external_vllm.py); its model classes need a GPU runtime to build;
#   speculators 0.9.0: Eagle3DraftModel loads our vLLM export from another working directory, logits
#     compared with ours (test_external_speculators.py).
#
# EAGLEWIRE_WHEELS=DIR: take the engine wheels from DIR when they are there (the vllm wheel is 336 MB).
# Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
source "$root/scripts/setup_env.sh"
home="${EAGLEWIRE_HOME:-$HOME/.cache/eaglewire}/external"
mkdir -p "$home"

# install NAME VERSION [extra packages...]: NAME==VERSION (or its wheel from $EAGLEWIRE_WHEELS) into $home/NAME-VERSION
install() {
  local name="$1" version="$2" site="$home/$1-$2"
  shift 2
  if [ ! -f "$site/.done" ]; then
    local spec="$name==$version"
    if [ -n "${EAGLEWIRE_WHEELS:-}" ]; then
      local wheel
      wheel="$(ls "$EAGLEWIRE_WHEELS"/"$name"-"$version"-*.whl 2>/dev/null | head -n 1 || true)"
      [ -n "$wheel" ] && spec="$wheel"
    fi
    python -m pip install -q --no-deps --target "$site" "$spec" "$@"
    touch "$site/.done"
  fi
  echo "$site"
}

sglang_sites=""
for version in 0.5.12 0.5.23; do
  sglang_sites="$sglang_sites,$version=$(install sglang "$version")"
done
vllm_site="$(install vllm 0.33.0 pyzmq cbor2 openai-harmony pybase64 cachetools msgspec cloudpickle uvloop \
  py-cpuinfo prometheus_client xgrammar apache-tvm-ffi fastapi starlette opentelemetry-api partial_json_parser \
  llguidance einops)"
speculators_site="$(install speculators 0.9.0 openai httpx2 sniffio datasets multiprocess pandas python-dateutil \
  pyarrow dill xxhash hs-connectors==0.9.0 loguru)"

cd "$root"
status=0
EAGLEWIRE_EXTERNAL_SGLANG="${sglang_sites#,}" python -m pytest -q -m external \
  tests/unit/export/test_external_sglang.py "$@" || status=1
PYTHONPATH="$vllm_site" python -m pytest -q -m external tests/unit/export/test_external_vllm.py "$@" || status=1
PYTHONPATH="$speculators_site" python -m pytest -q -m external tests/unit/export/test_external_speculators.py "$@" \
  || status=1
exit $status
