#!/usr/bin/env bash
# All benchmarks; each writes bench/results/<name>.json.
set -euo pipefail
cd "$(dirname "$0")/.."
for b in bench/*.sh; do
  # Not benchmarks: this runner, the shared environment, the GPU-host tools (bundle, tests,
  # a session's prepared calls) and the Table 2 step that gpu.sh, cpu_alloc.sh and
  # head_pieces.sh run with their arguments.
  case "$b" in bench/run.sh|bench/env.sh|bench/gpu_bundle.sh|bench/gpu_tests.sh|bench/gpu_session.sh|bench/table2_step.sh) continue ;; esac
  echo "== $b"; bash "$b"
done
