#!/usr/bin/env bash
# Training benchmark (issue 7): GRPO vs RREDCoT in the quickstart, same batch, same run, for
# SEEDS rollout seeds (the SFT policy is shared). Per training step: wall time and peak RSS of
# the step's stages (GRPO: rollout + update; RREDCoT: rollout + segment + score + update), and the
# eval after each step (avg@4 at temperature 1 on 100 eval problems). Writes
# bench/results/training.json.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
SEEDS=${SEEDS:-"0 1 2"}
STORE=${STORE:-$PWD/.rredcot/store}
cargo build --release --workspace --bins
for s in $SEEDS; do
  echo "== seed $s"
  ./target/release/rredcot --store "$STORE" pipeline run pipelines/quickstart.toml --json \
    --set grpo.rollout.seed=$s --set rredcot.rollout.seed=$s > "$TMP/seed$s.json"
done
$PY - "$TMP" "$STORE" bench/results/training.json $SEEDS <<'PYEOF'
import json, os, sys, statistics as st
tmp, store, out, seeds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
def rec(summary, stage):
    return json.load(open(os.path.join(store, "instances", summary["keys"][stage], "run.json")))
runs, ratios, rss_ratios, gfin, rfin, reach = {}, [], [], [], [], []
for s in seeds:
    summ = json.load(open(os.path.join(tmp, f"seed{s}.json")))
    n = sum(1 for k in summ["keys"] if k.startswith("grpo.update["))
    base = rec(summ, "eval_base")["metrics"]["mean_reward"]
    curves, times, rss = {}, {}, {}
    for m, stages in [("grpo", ["rollout", "update"]), ("rredcot", ["rollout", "segment", "score", "update"])]:
        curves[m] = [rec(summ, f"{m}.eval[{i}]")["metrics"]["mean_reward"] for i in range(n)]
        times[m] = [sum(rec(summ, f"{m}.{x}[{i}]")["wall_s"] for x in stages) for i in range(n)]
        rss[m] = max(rec(summ, f"{m}.{x}[{i}]")["peak_rss_mb"] for x in stages for i in range(n))
    ratios.append(st.mean(times["rredcot"]) / st.mean(times["grpo"]))
    rss_ratios.append(rss["rredcot"] / rss["grpo"])
    gfin.append(curves["grpo"][-1]); rfin.append(curves["rredcot"][-1])
    hit = next((i + 1 for i, a in enumerate(curves["rredcot"]) if a >= curves["grpo"][-1]), None)
    reach.append(None if hit is None else hit / n)
    runs[s] = {"base_acc": base, "acc_per_step": curves, "step_time_s": times, "peak_rss_mb": rss,
               "rredcot_steps_to_grpo_final": hit, "steps": n}
reached = [r for r in reach if r is not None]
res = {
    "step_time_ratio_rredcot_vs_grpo": st.mean(ratios),
    "peak_rss_ratio_rredcot_vs_grpo": st.mean(rss_ratios),
    "grpo_final_acc": st.mean(gfin),
    "rredcot_final_acc": st.mean(rfin),
    # Mean over the seeds where RREDCoT reached GRPO's final accuracy (None if it never did).
    "rredcot_steps_to_grpo_final_acc_ratio": st.mean(reached) if reached else None,
    "seeds_reaching_grpo_final_acc": f"{len(reached)}/{len(seeds)}",
    "metric": "avg@4 at temperature 1 on the first 100 eval problems, after each step",
    "per_seed": runs,
}
json.dump(res, open(out, "w"), indent=2)
print(json.dumps({k: v for k, v in res.items() if k != "per_seed"}, indent=2))
PYEOF
