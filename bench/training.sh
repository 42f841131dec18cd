#!/usr/bin/env bash
# Training benchmark (issues 7, 19): GRPO vs RREDCoT in the quickstart, same batch, same run, for
# SEEDS rollout seeds (the SFT policy and the evaluations' seeds are shared). Per training step:
# wall time and peak RSS of the step's stages (GRPO: rollout + update; RREDCoT: rollout + segment +
# score + update) and the small per-step eval (the learning curves). Final accuracies come from
# the quickstart's large final evaluation (`final_*`: avg@k at temperature 1 on the eval split).
# Writes bench/results/training.json (OUT=FILE: there instead, e.g. for another machine's run).
# With a fresh STORE, the first seed's pipeline wall time is the quickstart's cold time
# (`quickstart_cold_wall_s`).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
SEEDS=${SEEDS:-"0 1 2"}
STORE=${STORE:-$PWD/.rredcot/store}
OUT=${OUT:-bench/results/training.json}
cold=0; [ -d "$STORE/instances" ] || cold=1
cargo build --release --workspace --bins
for s in $SEEDS; do
  echo "== seed $s"
  start=$(date +%s)
  ./target/release/rredcot --store "$STORE" pipeline run pipelines/quickstart.toml --json \
    --set grpo.rollout.seed=$s --set rredcot.rollout.seed=$s > "$TMP/seed$s.json"
  echo "$(( $(date +%s) - start ))" > "$TMP/seed$s.wall"
done
$PY - "$TMP" "$STORE" "$OUT" "$cold" $SEEDS <<'PYEOF'
import json, math, os, sys, statistics as st
sys.path.insert(0, "bench")
import machine
tmp, store, out, cold, seeds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5:]
# Two-sided 95% Student t quantiles by degrees of freedom (n seeds -> n - 1).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
def ci95(xs):
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    if len(xs) < 2:
        return {"mean": xs[0] if xs else None, "ci95": None, "n": len(xs)}
    m = st.mean(xs)
    return {"mean": m, "ci95": T95.get(len(xs) - 1, 1.96) * st.stdev(xs) / math.sqrt(len(xs)), "n": len(xs)}
def rec(summary, stage):
    return json.load(open(os.path.join(store, "instances", summary["keys"][stage], "run.json")))
def final(summary, stage):
    m = rec(summary, stage)["metrics"]
    return m["avg_at_k.taskgen"], m["stderr.taskgen"]
runs, ratios, rss_ratios, gains, diffs, reach = {}, [], [], [], [], []
stderrs = []
for s in seeds:
    summ = json.load(open(os.path.join(tmp, f"seed{s}.json")))
    n = sum(1 for k in summ["keys"] if k.startswith("grpo.update["))
    base, base_se = final(summ, "final_base")
    g, g_se = final(summ, "final_grpo")
    r, r_se = final(summ, "final_rredcot")
    stderrs += [base_se, g_se, r_se]
    curves, times, rss = {}, {}, {}
    for m, stages in [("grpo", ["rollout", "update"]), ("rredcot", ["rollout", "segment", "score", "update"])]:
        curves[m] = [rec(summ, f"{m}.eval[{i}]")["metrics"]["avg_at_k.taskgen"] for i in range(n)]
        times[m] = [sum(rec(summ, f"{m}.{x}[{i}]")["wall_s"] for x in stages) for i in range(n)]
        rss[m] = max(rec(summ, f"{m}.{x}[{i}]")["peak_rss_mb"] for x in stages for i in range(n))
    ratios.append(st.mean(times["rredcot"]) / st.mean(times["grpo"]))
    rss_ratios.append(rss["rredcot"] / rss["grpo"])
    gains.append(g - base)
    diffs.append(r - g)
    # Steps RREDCoT needs to reach GRPO's final per-step accuracy (censored at n: never reached).
    hit = next((i + 1 for i, a in enumerate(curves["rredcot"]) if a >= curves["grpo"][-1]), None)
    reach.append((hit if hit is not None else n) / n)
    runs[s] = {"final_acc": {"base": base, "grpo": g, "rredcot": r}, "final_stderr": {"base": base_se, "grpo": g_se, "rredcot": r_se},
               "curve_base_acc": rec(summ, "eval_base")["metrics"]["avg_at_k.taskgen"], "curve_acc_per_step": curves,
               "step_time_s": times, "peak_rss_mb": rss, "rredcot_steps_to_grpo_final": hit, "steps": n,
               "pipeline_wall_s": int(open(os.path.join(tmp, f"seed{s}.wall")).read())}
res = {
    "grpo_gain_over_base": st.mean(gains),
    "grpo_gain_over_base_per_seed": gains,
    "eval_stderr": max(stderrs),
    "rredcot_minus_grpo_final_acc": ci95(diffs),
    "rredcot_steps_to_grpo_final_acc_ratio": ci95(reach),
    "seeds_reaching_grpo_final_acc": f"{sum(1 for s in seeds if runs[s]['rredcot_steps_to_grpo_final'] is not None)}/{len(seeds)}",
    "step_time_ratio_rredcot_vs_grpo": st.mean(ratios),
    "peak_rss_ratio_rredcot_vs_grpo": st.mean(rss_ratios),
    "metric": f"final: avg@{rec(summ, 'final_grpo')['params']['k']} at temperature 1 on the eval split (final_* stages); "
              f"curves: avg@{rec(summ, 'eval_base')['params']['k']} on its first {rec(summ, 'eval_base')['params']['limit']} problems after each step",
    "ci95": "Student t over seeds (mean ± t_{0.975,n-1} · sd / sqrt(n)); steps ratio censored at 1 when never reached",
    "per_seed": runs,
}
if cold:  # the first seed ran from an empty store: SFT and base evaluations included
    res["quickstart_cold_wall_s"] = runs[seeds[0]]["pipeline_wall_s"]
res.update(machine.facts())
json.dump(res, open(out, "w"), indent=2)
print(json.dumps({k: v for k, v in res.items() if k != "per_seed"}, indent=2))
PYEOF
