#!/usr/bin/env bash
# Issue 17's open GPU checks as prepared device calls: a session is lent about 15 minutes of
# device time (the machine's start included) and 10 minutes per call, so nothing is typed there.
# Built here first: `bash bench/gpu_bundle.sh gpu decode` (packs the CUDA-graph build).
#
# usage, on the GPU host from the project root with .gpu-bundle/ carried:
#   bash bench/gpu_session.sh OUT_DIR PART...
# Each PART runs in the order given, under its own time limit (LIMIT_<PART> seconds):
#   tests       bench/gpu_tests.sh on the gpu and decode test binaries with CUDA graphs on: the
#               graphs' first run on a GPU (280 s, half per binary)
#   decode      bench/gpu.sh's decode part: static and continuous batching, eager and replayed as
#               CUDA graphs, then f32 with TF32 products, beside transformers, where a step's
#               time goes, piece by piece, and the sampler's and top_p's filter's milliseconds
#               (DECODE_FIGURES; 300 s)
#   quickstart  bench/gpu.sh's shortened quickstart on the CPU and the GPU, graphs on (240 s)
#   table2      bench/gpu.sh's Table 2 step at TABLE2_PROMPTS (default 64) prompts (570 s)
# `tests decode` fits one call (580 s), `quickstart` another. After each part OUT_DIR holds its
# log, bench/results/gpu.json as it then stands and one line in OUT_DIR/summary.txt, so a call cut
# short keeps what finished. Exit status: parts failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu_session.sh OUT_DIR PART...}; shift
[ $# -gt 0 ] || { echo "gpu_session.sh: name the parts to run (tests decode quickstart table2)" >&2; exit 2; }
mkdir -p "$out"
for part in "$@"; do
  case "$part" in tests|decode|quickstart|table2) ;; *) echo "gpu_session.sh: no part named $part" >&2; exit 2 ;; esac
done
# The decode steps replayed as CUDA graphs wherever the build has them (opt-in until this run).
export RREDCOT_DECODE_GRAPHS=1
failed=0
for part in "$@"; do
  default=$(case "$part" in tests) echo 280 ;; decode) echo 300 ;; quickstart) echo 240 ;; table2) echo 570 ;; esac)
  var=LIMIT_$part; limit=${!var:-$default}
  t0=$EPOCHREALTIME
  case "$part" in
    # gpu_tests.sh bounds each binary itself: half the part's limit each.
    tests) bash bench/gpu_tests.sh "$out/tests" $((limit / 2)) gpu decode ;;
    # bench_gpu stops 120 s before the part's limit, leaving transformers' side its time.
    decode) DECODE_FIGURES=${DECODE_FIGURES:-sampler step_breakdown decode decode_continuous decode_unfused decode_graph decode_continuous_graph decode_tf32} \
              DECODE_TIMEOUT=$((limit - 120)) GPU_PARTS=decode timeout "$limit" bash bench/gpu.sh ;;
    # Four runs (CPU, GPU; warm and fresh stage processes), each bounded, inside the part's limit.
    quickstart) GPU_PARTS=quickstart QS_TIMEOUT=$((limit / 4 - 5)) timeout "$limit" bash bench/gpu.sh ;;
    table2) GPU_PARTS=table2 timeout "$limit" bash bench/gpu.sh ;;
  esac >"$out/$part.log" 2>&1
  rc=$?
  [ "$rc" = 0 ] || failed=$((failed + 1))
  [ -f bench/results/gpu.json ] && cp bench/results/gpu.json "$out/gpu.json"
  line=$(printf '%s: exit %s after %.0f s (limit %s s)' "$part" "$rc" "$(python3 -c "print($EPOCHREALTIME - $t0)")" "$limit")
  echo "$line" | tee -a "$out/summary.txt"
  tail -5 "$out/$part.log"
done
exit "$failed"
