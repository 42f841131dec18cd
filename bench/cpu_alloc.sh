#!/usr/bin/env bash
# The caching CPU allocator of rredcot-worker (ml/src/cpu_cache.rs) against libtorch's own
# (RREDCOT_CPU_CACHE_MB=0), on the CPU: one RREDCoT step of pipelines/paper-table2.toml through
# bench/table2_step.sh (rollout of PROMPTS GSM8K prompts x 6 samples x NEW new tokens, T = 0.7,
# segmentation, σ scoring, update in bf16 with gradient checkpointing), with a Qwen2 model of
# Qwen's 151,936-token vocabulary and the Qwen3 tokenizer but 2 layers of width 64 (random
# weights), so that the [rows, vocabulary] tensors weigh as with a real Qwen model and the layers
# cost little. The two allocators alternate, REPS times; per stage its seconds and peak RSS (the
# instance's run record, without process start) and whether both wrote the same output hashes.
# Writes bench/results/cpu_alloc.json.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
REPS=${REPS:-2}
PROMPTS=${PROMPTS:-16}
NEW=${NEW:-128}
table2_cpu_setup
table2_cpu_compare cpu_alloc cached "-u RREDCOT_CPU_CACHE_MB" libtorch "RREDCOT_CPU_CACHE_MB=0"
