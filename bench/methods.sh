#!/usr/bin/env bash
# Credit-method benchmark (issue 9). Writes bench/results/methods.json.
# pipelines/credit-methods.toml on the quickstart's tiny model: the same rollouts and the same
# segmentation scored by RREDCoT σ, MC values with k = 5 and k = 20, leave-one-out (PMI with the
# rest of the trace) and gradient attribution, one stage after another (-j 1) so none shares the
# cores. Per method, from the run records: scoring time per trace (the scoring loop, without
# process start and model load; the stage's wall time is reported too), tokens generated,
# sequences and token positions run through the model; and the Spearman rank correlation of each
# method's per-segment credit σ with MC (k = 20), per trace, averaged over the traces where both
# are non-constant.
# Two segmentations of the same rollouts, each a run of its own: hybrid with ≤ SEGMENTS segments
# (the top-level figures) and entropy cuts with ≤ FINE_SEGMENTS segments (finer granularity, closer
# to the paper's 40 segments per trace: MC's cost grows with the number of exit points, σ's barely).
# Then the truncation sweep of paper Fig. 3: MC k = 5 with max_new_tokens in TRUNCATION.
# Scale (2 shared CPU cores): PROMPTS prompts × 2 samples, MC completions of ≤ MC_MAX_NEW tokens;
# the build is the debug profile (libtorch does the arithmetic either way).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
STORE=${STORE:-$PWD/.rredcot/store}
PROMPTS=${PROMPTS:-4}
SEGMENTS=${SEGMENTS:-8}
FINE_SEGMENTS=${FINE_SEGMENTS:-24}
TRUNCATION=${TRUNCATION:-"8 16 24 32"}
MC_MAX_NEW=${MC_MAX_NEW:-160}
PROFILE=${PROFILE:-debug}
if [ "$PROFILE" = release ]; then cargo build --release --workspace --bins; else cargo build --workspace --bins; fi
BIN=./target/$PROFILE/rredcot

run() { # run NAME ARGS...: the pipeline, score stages forced so they are timed in this run, one at a time
  local name=$1; shift
  $BIN --store "$STORE" pipeline run pipelines/credit-methods.toml -j 1 --set rollout.limit=$PROMPTS \
    --set mc5.max_new_tokens=$MC_MAX_NEW --set mc20.max_new_tokens=$MC_MAX_NEW --set srpo.max_new_tokens=$MC_MAX_NEW "$@" --json > "$TMP/$name.json"
}
run coarse --set segment.method=hybrid --set segment.max_segments=$SEGMENTS \
  --force sigma --force mc5 --force mc20 --force loo --force grad --force progress --force srpo
run fine --set segment.method=entropy --set segment.max_segments=$FINE_SEGMENTS \
  --force sigma --force mc5 --force mc20 --force loo --force grad --force progress --force srpo
for n in $TRUNCATION; do
  run trunc$n --set segment.method=hybrid --set segment.max_segments=$SEGMENTS --set mc5.max_new_tokens=$n --until mc5
done

$PY - "$TMP" "$STORE" bench/results/methods.json "$PROFILE" "$PROMPTS" "$SEGMENTS" "$FINE_SEGMENTS" "$MC_MAX_NEW" "$TRUNCATION" <<'PYEOF'
import json, os, sys
import pyarrow.parquet as pq
sys.path.insert(0, "bench")
import machine
tmp, store, out, profile, prompts, segments, fine_segments, mc_max_new, truncation = sys.argv[1:10]
def inst(summary, stage): return os.path.join(store, "instances", summary["keys"][stage])
def record(summary, stage): return json.load(open(os.path.join(inst(summary, stage), "run.json")))
def scores(summary, stage):
    t = pq.read_table(os.path.join(inst(summary, stage), "outputs", "scores.parquet")).to_pylist()
    return {(r["prompt_id"], r["sample_idx"]): r for r in t}

def ranks(x):
    order = sorted(range(len(x)), key=lambda i: x[i])
    r = [0.0] * len(x)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2.0
        i = j + 1
    return r

def pearson(a, b):
    n = len(a); ma = sum(a) / n; mb = sum(b) / n
    sa = sum((x - ma) ** 2 for x in a) ** 0.5; sb = sum((y - mb) ** 2 for y in b) ** 0.5
    return sum((x - ma) * (y - mb) for x, y in zip(a, b)) / (sa * sb)

def spearman(a, b):
    if len(a) < 2 or len(set(a)) < 2 or len(set(b)) < 2:
        return None
    return pearson(ranks(a), ranks(b))

methods = {"sigma": "score_sigma", "mc5": "score_mc k=5", "mc20": "score_mc k=20", "loo": "score_loo (target = rest)", "grad": "score_grad (target = rest)",
           "progress": "score_progress (prefill, prover = the policy)"}

def compare(name, segmentation):
    summary = json.load(open(os.path.join(tmp, name + ".json")))
    mc = scores(summary, "mc20")
    per = {}
    for m, what in methods.items():
        rec = record(summary, m); c = rec.get("counters", {}); met = rec.get("metrics", {})
        traces = c["traces_scored"]
        sc = scores(summary, m)
        rhos = [spearman(sc[k]["sigma"], mc[k]["sigma"]) for k in sc]
        valid = [r for r in rhos if r is not None]
        per[m] = {
            "kind": what,
            "traces": traces,
            "segments": c["segments_scored"],
            "scoring_s_per_trace": met["scoring_s_per_trace"],
            "stage_wall_s": rec["wall_s"],
            "peak_rss_mb": rec["peak_rss_mb"],
            "tokens_generated_per_trace": c.get("tokens_generated", 0) / traces,
            "forward_sequences_per_trace": c["forward_sequences"] / traces,
            "forward_tokens_per_trace": c["forward_tokens"] / traces,
            "spearman_vs_mc20_mean": sum(valid) / len(valid) if valid else None,
            "spearman_traces_defined": len(valid),
            "sigma_uniform_fallback": c.get("sigma_uniform_fallback", 0),
        }
        if m.startswith("mc"):
            for key in ["truncation_loss_fraction", "completion_accuracy", "value_sd_bootstrap_by_k", "k_sd_below_0_1"]:
                per[m][key] = met.get(key)
    s = per["sigma"]
    res = {
        "segmentation": segmentation,
        "mc20_over_sigma_cost_ratio": per["mc20"]["scoring_s_per_trace"] / s["scoring_s_per_trace"],
        "mc5_over_sigma_cost_ratio": per["mc5"]["scoring_s_per_trace"] / s["scoring_s_per_trace"],
        "mc20_over_sigma_forward_tokens_ratio": per["mc20"]["forward_tokens_per_trace"] / s["forward_tokens_per_trace"],
        "mc5_over_sigma_forward_tokens_ratio": per["mc5"]["forward_tokens_per_trace"] / s["forward_tokens_per_trace"],
        "target_sigma_100x_cheaper_than_mc20_met": per["mc20"]["scoring_s_per_trace"] / s["scoring_s_per_trace"] >= 100,
    }
    for m in ["sigma", "mc5", "loo", "grad", "progress"]:
        res[f"{m}_spearman_vs_mc"] = per[m]["spearman_vs_mc20_mean"]
    # SRPO reset (localize + k continuations per trace): cost only, it has no per-segment values.
    rec = record(summary, "srpo"); c = rec["counters"]
    per["srpo"] = {"kind": "reset_self k=4, every trace", "traces": c["traces"], "scoring_s_per_trace": rec["metrics"]["scoring_s_per_trace"],
                   "stage_wall_s": rec["wall_s"], "peak_rss_mb": rec["peak_rss_mb"],
                   "tokens_generated_per_trace": c["tokens_generated"] / c["traces"],
                   "forward_sequences_per_trace": c["forward_sequences"] / c["traces"], "forward_tokens_per_trace": c["forward_tokens"] / c["traces"]}
    res["srpo_over_sigma_cost_ratio"] = per["srpo"]["scoring_s_per_trace"] / s["scoring_s_per_trace"]
    res["per_method"] = per
    return res

coarse = compare("coarse", f"hybrid, max_segments = {segments}")
fine = compare("fine", f"entropy, max_segments = {fine_segments}")
sweep = []
for n in truncation.split():
    summary = json.load(open(os.path.join(tmp, f"trunc{n}.json")))
    met = record(summary, "mc5")["metrics"]; c = record(summary, "mc5")["counters"]
    sweep.append({"max_new_tokens": int(n), "truncation_loss_fraction": met["truncation_loss_fraction"],
                  "completions": c["completions"], "completions_truncated": c["completions_truncated"]})
sweep.append({"max_new_tokens": int(mc_max_new), "truncation_loss_fraction": coarse["per_method"]["mc5"]["truncation_loss_fraction"],
              "completions": None, "completions_truncated": None})
res = {k: v for k, v in coarse.items() if k != "per_method"}
res.update({
    "cost_measure": "scoring_s_per_trace: seconds in the stage's scoring/sampling loop per trace (model load and process start excluded); forward_tokens: token positions run through the model",
    "correlation": "Spearman of per-segment σ (normalize = l1) with MC k = 20, per trace, mean over traces where both vary",
    "model": "quickstart tiny Qwen2 (bootstrap_sft defaults), CPU f32, 2 threads",
    "scale": {"prompts": int(prompts), "samples_per_prompt": 2, "mc_max_new_tokens": int(mc_max_new),
              "note": "reduced for 2 shared CPU cores; the paper uses 40 segments and 20 completions of up to 8196 tokens"},
    "build_profile": profile,
    **machine.facts(),
    "command": f"PROMPTS={prompts} SEGMENTS={segments} FINE_SEGMENTS={fine_segments} MC_MAX_NEW={mc_max_new} TRUNCATION='{truncation}' bash bench/methods.sh",
    "per_method": coarse["per_method"],
    "fine_segmentation": fine,
    "truncation_sweep_mc5": sweep,
})
# Keep what bench/methods_real.sh added (the real-model figures): this script does not measure them.
if os.path.exists(out):
    res.update({k: v for k, v in json.load(open(out)).items() if "real_model" in k})
json.dump(res, open(out, "w"), indent=2)
print(json.dumps({k: v for k, v in res.items() if not isinstance(v, (dict, list))}, indent=2))
print(json.dumps({k: v for k, v in fine.items() if k != "per_method"}, indent=2))
print(json.dumps(sweep))
PYEOF
