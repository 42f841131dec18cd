#!/usr/bin/env bash
# Model-layer benchmark (issue 4): our tch decode and KV-shared scoring vs transformers, side by
# side in one run on the same machine and threads. Writes bench/results/model.json.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
# One intra-op thread by default: on a shared 2-core machine OpenMP barriers of 2 threads
# dominate small-batch decode (measured: 2.8 tok/s with 2 threads vs 17.7 with 1). Both sides
# always use the same count.
THREADS=${THREADS:-1}
GGUF=$(smollm2_gguf)
cargo build --release -p rredcot-ml --example bench_model
# The prompt ids come from our tokenizer (chat template); transformers gets the same ids.
$PY - "$GGUF" "$TMP/prompt.json" <<'PYEOF'
import json, os, sys
from transformers import AutoTokenizer
d, f = os.path.split(sys.argv[1])
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
text = tok.apply_chat_template([{"role": "user", "content": "Explain step by step how to compute 17 * 23."}],
                               tokenize=False, add_generation_prompt=True)
json.dump(tok(text, add_special_tokens=False)["input_ids"], open(sys.argv[2], "w"))
PYEOF
$PY bench/model_transformers.py "$GGUF" "$TMP/prompt.json" "$TMP" "$THREADS"
mkdir -p bench/results
./target/release/examples/bench_model "$GGUF" "$TMP" bench/results/model.json "$THREADS"
