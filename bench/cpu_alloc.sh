#!/usr/bin/env bash
# The caching CPU allocator of rredcot-worker (ml/src/cpu_cache.rs) against libtorch's own
# (RREDCOT_CPU_CACHE_MB=0), on the CPU: one RREDCoT step of pipelines/paper-table2.toml as
# bench/table2_step.sh runs it (rollout of PROMPTS GSM8K prompts x 6 samples x NEW new tokens,
# T = 0.7, segmentation, σ scoring, update), with a Qwen2 model of Qwen's 151,936-token vocabulary
# and the Qwen3 tokenizer but 2 layers of width 64 (random weights), so that the [rows, vocabulary]
# tensors weigh as with a real Qwen model and the layers cost little. Each stage is its own
# `pipeline run --until`, the two allocators alternating, REPS times; per stage its seconds (the
# runner's, without process start), the instance's peak RSS (its run record) and whether both
# wrote the same output hashes. Writes bench/results/cpu_alloc.json.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
REPS=${REPS:-2}
PROMPTS=${PROMPTS:-16}
NEW=${NEW:-128}
cargo build --release -p rredcot-ml --bin rredcot-worker
W=./target/release/rredcot-worker
$PY - "$TMP/model" <<'PYEOF'
import sys, torch, transformers
cfg = transformers.Qwen2Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                               tie_word_embeddings=True)
torch.manual_seed(0)
transformers.Qwen2ForCausalLM(cfg).save_pretrained(sys.argv[1])
PYEOF
tok=${QWEN_TOK:-.venv/share/qwen3-tokenizer}
cp "$tok/tokenizer.json" "$tok/tokenizer_config.json" "$TMP/model/"
gsm=data/gsm8k-mgs/gsm8k-mgs-eng.jsonl
m=file:$TMP/model
sets=(import_train.inputs.source=file:$PWD/$gsm import_train.layout=gsm8k import_train.source=gsm8k-mgs
      rredcot.repeat=1 grpo.repeat=1
      rollout.inputs.policy=$m segment.inputs.tokenizer=$m score.inputs.policy=$m
      update.inputs.policy=$m update.inputs.optimizer=$m update.inputs.reference=$m eval_base.inputs.policy=$m
      rollout.limit=$PROMPTS rollout.group_size=6 rollout.max_new_tokens=$NEW rollout.batch_size=$((PROMPTS * 6))
      update.max_completion_length=$NEW)
for b in minerva aime24 aime25 math500; do sets+=("import_$b.inputs.source=file:$PWD/$gsm"); done
args=()
for s in "${sets[@]}"; do args+=(--set "$s"); done

: >"$TMP/rows"
for rep in $(seq "$REPS"); do
  for cache in default 0; do
    store=$TMP/store-$rep-$cache
    for stage in rollout segment score update; do
      if [ "$cache" = default ]; then env=(env -u RREDCOT_CPU_CACHE_MB); else env=(env RREDCOT_CPU_CACHE_MB=0); fi
      line=$("${env[@]}" $W --store "$store" pipeline run pipelines/paper-table2.toml --until "rredcot.$stage[0]" "${args[@]}" 2>&1 |
             grep "^done     rredcot.$stage\[0\]")
      key=$(sed 's/.*(\([0-9a-f]*\)).*/\1/' <<<"$line")
      secs=$(sed 's/.* in \([0-9.]*\)s.*/\1/' <<<"$line")
      echo "$rep $cache $stage $secs $(ls -d "$store"/instances/"$key"*)/run.json" >>"$TMP/rows"
      echo "rep $rep, cache $cache: $stage $secs s" >&2
    done
  done
done

$PY - "$TMP/rows" "$REPS" "$PROMPTS" "$NEW" <<'PYEOF' >bench/results/cpu_alloc.json
import json, os, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
out = {"command": "bash bench/cpu_alloc.sh", "machine": f"{os.cpu_count()} CPUs, release build",
       "model": "Qwen2, vocabulary 151,936, 2 layers of width 64, random weights, Qwen3 tokenizer",
       "step": f"{sys.argv[3]} GSM8K prompts x 6 samples x {sys.argv[4]} new tokens through pipelines/paper-table2.toml",
       "reps": int(sys.argv[2]), "stages": {}}
for stage in ["rollout", "segment", "score", "update"]:
    per = {}
    for cache in ["default", "0"]:
        rs = [r for r in rows if r[1] == cache and r[2] == stage]
        runs = [json.load(open(r[4])) for r in rs]
        hashes = [{k: v["hash"] for k, v in sorted(x["outputs"].items())} for x in runs]
        per[cache] = {"seconds": [float(r[3]) for r in rs],
                      "peak_rss_mb": [round(x["peak_rss_mb"], 1) for x in runs],
                      "outputs": hashes[0],
                      "all_reps_same_outputs": all(h == hashes[0] for h in hashes)}
    c, b = per["default"], per["0"]
    out["stages"][stage] = {
        "cached_seconds_median": statistics.median(c["seconds"]), "libtorch_seconds_median": statistics.median(b["seconds"]),
        "speedup": statistics.median(b["seconds"]) / statistics.median(c["seconds"]),
        "cached_peak_rss_mb": max(c["peak_rss_mb"]), "libtorch_peak_rss_mb": max(b["peak_rss_mb"]),
        "same_outputs": c["outputs"] == b["outputs"] and c["all_reps_same_outputs"] and b["all_reps_same_outputs"],
        "runs": per}
json.dump(out, sys.stdout, indent=1)
print()
PYEOF
$PY - <<'PYEOF'
import json
d = json.load(open("bench/results/cpu_alloc.json"))
for s, v in d["stages"].items():
    print(f"{s}: {v['libtorch_seconds_median']:.2f} s -> {v['cached_seconds_median']:.2f} s ({v['speedup']:.2f}x), "
          f"peak RSS {v['libtorch_peak_rss_mb']:.0f} -> {v['cached_peak_rss_mb']:.0f} MB, same outputs: {v['same_outputs']}")
PYEOF
