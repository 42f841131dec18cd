#!/usr/bin/env bash
# `make test-gpu` on a GPU host without a Rust toolchain: runs the integration-test binaries that
# bench/gpu_bundle.sh packed (gpu first: CUDA/CPU agreement and the step-2 restore; then the ML
# stage tests, whose stages default to device = auto, so CUDA there), each with its log in
# LOG_DIR, and prints one PASS/FAIL line per binary. Exit status: the number of binaries failed.
#
# usage, from the project root with .gpu-bundle/ carried:
#   JOBS=N bash bench/gpu_tests.sh LOG_DIR [SECONDS [NAME...]]
#   SECONDS: the time limit of each binary (default 300); NAME: run only these tests, in this
#   order; JOBS: binaries run at once (default 1).
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${1:?usage: gpu_tests.sh LOG_DIR [SECONDS [NAME...]]}; limit=${2:-300}; shift $(($# < 2 ? $# : 2))
mkdir -p "$logs"
# Unpack once and take run.sh's library paths here (run.sh itself unpacks on every call, which
# would rewrite binaries that are running).
tar xJf .gpu-bundle/bin.tar.xz
eval "$(grep -v -e '^tar ' -e '^exec ' -e '^set ' .gpu-bundle/run.sh | sed 's/^export /bundle_/')"
# The test binaries name the worker by the path they were built at: make that path this tree.
built=$(cat .gpu-bundle/root 2>/dev/null || pwd)
if [ "$built" != "$(pwd -P)" ] && [ ! -e "$built" ]; then
  mkdir -p "$(dirname "$built")" && ln -s "$(pwd -P)" "$built" && echo "linked $built -> $(pwd -P)"
fi
mapfile -t bins < <(tar tJf .gpu-bundle/bin.tar.xz | grep '/deps/[^/]\+$' | sort)
if [ $# -gt 0 ]; then
  mapfile -t bins < <(for n in "$@"; do printf '%s\n' "${bins[@]}" | grep "/deps/$n-" || echo "missing/deps/$n-"; done)
else  # gpu's binary first: its checks are the point of the run.
  mapfile -t bins < <(printf '%s\n' "${bins[@]}" | grep '/deps/gpu-'; printf '%s\n' "${bins[@]}" | grep -v '/deps/gpu-')
fi
one() {
  local b=$1 name r t0=$EPOCHREALTIME
  name=$(basename "$b"); name=${name%-*}
  if LD_LIBRARY_PATH=$bundle_LD_LIBRARY_PATH LD_PRELOAD=$bundle_LD_PRELOAD timeout "$limit" "$b" --test-threads=2 --nocapture >"$logs/$name.log" 2>&1; then r=PASS; else r="FAIL (exit $?)"; fi
  printf '%s %s %.0f s: %s\n' "$r" "$name" "$(python3 -c "print($EPOCHREALTIME - $t0)")" \
    "$(grep -E '^test result|SKIP|panicked' "$logs/$name.log" | head -5 | tr '\n' ' ')"
  [ "$r" = PASS ]
}
failed=0 running=0
for b in "${bins[@]}"; do
  if [ "$running" -ge "${JOBS:-1}" ]; then wait -n || failed=$((failed + 1)); running=$((running - 1)); fi
  one "$b" & running=$((running + 1))
done
while [ "$running" -gt 0 ]; do wait -n || failed=$((failed + 1)); running=$((running - 1)); done
exit "$failed"
