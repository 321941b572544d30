# Sourced by the H200 scripts: where things live on the device machine (nothing is installed there;
# wheels are unpacked into ~/smol/site, the reference target is converted into ~/smol/home).
export SMOL="$HOME/smol"
export EAGLEWIRE_HOME="$SMOL/home"
export PYTHONPATH="$SMOL/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TOKENIZERS_PARALLELISM=false
eaglewire() { python3 -m eaglewire "$@"; }
