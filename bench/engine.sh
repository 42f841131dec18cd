#!/usr/bin/env bash
# No-op pipeline run: rredcot vs DVC vs Snakemake in one run -> bench/results/engine.json
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH_VENV=${BENCH_VENV:-$PWD/.venv-bench}
if [ ! -f "$BENCH_VENV/.stamp-1" ]; then
  python3 -m venv "$BENCH_VENV"
  "$BENCH_VENV/bin/pip" install --quiet dvc==3.67.1 snakemake==9.27.1
  touch "$BENCH_VENV/.stamp-1"
fi
BIN=${RREDCOT_BIN:-$PWD/target/release/rredcot}
python3 bench/engine.py "$BIN" "$BENCH_VENV/bin" bench/results/engine.json
