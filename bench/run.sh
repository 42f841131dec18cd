#!/usr/bin/env bash
# All benchmarks; each writes bench/results/<name>.json.
set -euo pipefail
cd "$(dirname "$0")/.."
for b in bench/*.sh; do
  # Not benchmarks: this runner, the shared environment, and the GPU-host tools (bundle, tests,
  # a session's prepared calls).
  case "$b" in bench/run.sh|bench/env.sh|bench/gpu_bundle.sh|bench/gpu_tests.sh|bench/gpu_session.sh) continue ;; esac
  echo "== $b"; bash "$b"
done
