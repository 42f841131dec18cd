#!/usr/bin/env bash
# All benchmarks; each writes bench/results/<name>.json.
set -euo pipefail
cd "$(dirname "$0")/.."
for b in bench/*.sh; do
  [ "$b" = bench/run.sh ] && continue
  echo "== $b"; bash "$b"
done
