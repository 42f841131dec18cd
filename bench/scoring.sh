#!/usr/bin/env bash
# σ-scoring benchmark (issue 6). Writes bench/results/scoring.json.
#  1. The real stages on the quickstart model: pipelines/incremental-rescore.toml (rollout,
#     segment, score_sigma); wall time and peak RSS from their run records.
#  2. Per trace, on the quickstart model and on SmolLM2-135M (f32 CPU): one rollout's generation
#     time, KV-shared σ scoring and the naive per-prefix oracle at T = 40 segments, each mode in
#     its own process so each peak RSS is its own, each with rredcot-worker's caching CPU allocator
#     as the stages have it (RREDCOT_CPU_CACHE_MB=0: libtorch's own, as before 2026-12-02).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
THREADS=${THREADS:-1}
STORE=${STORE:-$PWD/.rredcot/store}
GGUF=$(smollm2_gguf)
cargo build --release --workspace --bins
cargo build --release -p rredcot-ml --example bench_scoring
BIN=./target/release/examples/bench_scoring

./target/release/rredcot --store "$STORE" pipeline run pipelines/incremental-rescore.toml --json > "$TMP/pipeline.json"
CKPT=$($PY -c 'import json,sys;s=json.load(open(sys.argv[1]));print(sys.argv[2]+"/instances/"+s["keys"]["sft"]+"/outputs/model")' "$TMP/pipeline.json" "$STORE")

for spec in "quickstart $CKPT 300" "smollm2 $GGUF 1000"; do
  set -- $spec
  for mode in generate kv naive; do
    echo "== $1 $mode"
    $BIN "$2" $mode "$TMP/$1.trace.json" "$TMP/$1.$mode.json" "$THREADS" "$3" 40
  done
done

$PY - "$TMP" "$STORE" bench/results/scoring.json "$THREADS" <<'PYEOF'
import json, os, sys
sys.path.insert(0, "bench")
import machine
tmp, store, out, threads = sys.argv[1:5]
def load(name): return json.load(open(os.path.join(tmp, name)))
summary = load("pipeline.json")
def record(stage): return json.load(open(os.path.join(store, "instances", summary["keys"][stage], "run.json")))
per_model = {}
for m in ["quickstart", "smollm2"]:
    g, kv, nv = load(f"{m}.generate.json"), load(f"{m}.kv.json"), load(f"{m}.naive.json")
    diff = max(abs(a - b) for ra, rb in zip(kv["values"], nv["values"]) for a, b in zip(ra, rb))
    per_model[m] = {
        "trace_tokens": kv["trace_tokens"], "segments": kv["segments"], "target_tokens": kv["target_tokens"],
        "generate_s": g["generate_s"], "kv_score_s": kv["score_s"], "naive_score_s": nv["score_s"],
        "speedup_vs_naive": nv["score_s"] / kv["score_s"],
        "kv_score_over_generate": kv["score_s"] / g["generate_s"],
        "max_abs_diff_vs_naive": diff,
        "peak_rss_generate_mb": g["peak_rss_mb"], "peak_rss_kv_mb": kv["peak_rss_mb"], "peak_rss_naive_mb": nv["peak_rss_mb"],
        "cpu_allocator": kv["cpu_allocator"],
    }
stages = {}
for st in ["rollout", "segment", "score"]:
    r = record(st)
    stages[st] = {"wall_s": r.get("wall_s"), "peak_rss_mb": r.get("peak_rss_mb"), "counters": r.get("counters"), "metrics": r.get("metrics")}
s = per_model["smollm2"]
res = {
    "sigma_speedup_vs_naive_t40": s["speedup_vs_naive"],
    "peak_rss_rollout_mb": s["peak_rss_generate_mb"],
    "peak_rss_scoring_mb": s["peak_rss_kv_mb"],
    "headline_model": "SmolLM2-135M-Instruct (GGUF Q4_1 dequantized to f32), CPU",
    "threads": int(threads),
    **machine.facts(),
    "per_model": per_model,
    "quickstart_pipeline_stages": stages,
}
json.dump(res, open(out, "w"), indent=2)
print(json.dumps({k: v for k, v in res.items() if not isinstance(v, dict)}, indent=2))
PYEOF
