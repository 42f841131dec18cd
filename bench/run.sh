#!/usr/bin/env bash
# All benchmarks; each writes bench/results/<name>.json.
set -euo pipefail
cd "$(dirname "$0")/.."
for b in bench/*.sh; do
  case "$b" in bench/run.sh|bench/env.sh) continue ;; esac
  echo "== $b"; bash "$b"
done
