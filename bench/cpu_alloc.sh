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
cargo build --release -p rredcot-ml --bin rredcot-worker
W=./target/release/rredcot-worker
qwen_vocab_model "$TMP/model"

: >"$TMP/rows"
for rep in $(seq "$REPS"); do
  for cache in default 0; do
    records=$TMP/records-$rep-$cache
    mkdir -p "$records"
    if [ "$cache" = default ]; then run="env -u RREDCOT_CPU_CACHE_MB $W"; else run="env RREDCOT_CPU_CACHE_MB=0 $W"; fi
    RUN=$run RUN_RECORDS=$records bash bench/table2_step.sh "$TMP/model" "$records/step.json" "$PROMPTS" 6 "$NEW" >/dev/null
    for stage in rollout segment score update; do
      echo "$rep $cache $stage $records/$stage.json" >>"$TMP/rows"
    done
  done
done

$PY - "$TMP/rows" "$REPS" "$PROMPTS" "$NEW" <<'PYEOF' >bench/results/cpu_alloc.json
import json, os, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
out = {"command": "bash bench/cpu_alloc.sh", "machine": f"{os.cpu_count()} CPUs, release build",
       "model": "Qwen2, vocabulary 151,936, 2 layers of width 64, random weights, Qwen3 tokenizer",
       "step": f"{sys.argv[3]} GSM8K prompts x 6 samples x {sys.argv[4]} new tokens through pipelines/paper-table2.toml (bench/table2_step.sh: update in bf16 with gradient checkpointing)",
       "reps": int(sys.argv[2]), "stages": {}}
for stage in ["rollout", "segment", "score", "update"]:
    per = {}
    for cache in ["default", "0"]:
        rs = [r for r in rows if r[1] == cache and r[2] == stage]
        runs = [json.load(open(r[3])) for r in rs]
        hashes = [{k: v["hash"] for k, v in sorted(x["outputs"].items())} for x in runs]
        per[cache] = {"seconds": [round(x["wall_s"], 2) for x in runs],
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
