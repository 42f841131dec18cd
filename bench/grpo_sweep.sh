#!/usr/bin/env bash
# GRPO settings sweep (issue 19, README "Does RL visibly learn"): GRPO from the quickstart's SFT
# policy with each setting below, 20 steps, then avg@4 at T = 1 on 400 problems of another taskgen
# seed (`eval_final`) beside the SFT policy on the same problems (`eval_base`), and the mean token
# entropy of each step's rollouts. Prints one line per setting. The README's table was measured
# at commit e532675 (before the thinking default world).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
STORE=${STORE:-$PWD/.rredcot/store}
cargo build --release --workspace --bins
one=(--set rollout.threads=1 --set update.threads=1 --set eval_final.threads=1 --set eval_base.threads=1)
run() {
  local name=$1; shift
  ./target/release/rredcot --store "$STORE" pipeline run bench/grpo-sweep.toml --json "${one[@]}" "$@" > "$TMP/$name.json"
  $PY - "$STORE" "$TMP/$name.json" "$name" <<'PYEOF'
import json, os, sys
import pyarrow.parquet as pq
store, summary, name = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3]
rec = lambda st: json.load(open(os.path.join(store, "instances", summary["keys"][st], "run.json")))
base, final = (rec(s)["metrics"]["avg_at_k.taskgen"] for s in ("eval_base", "eval_final"))
ent = []
for k in sorted((k for k in summary["keys"] if ".rollout[" in k), key=lambda k: int(k.split("[")[1][:-1])):
    t = pq.read_table(os.path.join(store, "instances", summary["keys"][k], "outputs", "rollouts.parquet"), columns=["entropies"]).to_pydict()
    e = [x for row in t["entropies"] for x in row]
    ent.append(sum(e) / len(e))
print(f"{name}: base {base:.4f} final {final:.4f} ({100 * (final - base):+.1f} points); entropy {ent[0]:.3f} -> {ent[-1]:.3f}")
with open(os.path.join(os.path.dirname(sys.argv[2]), "sweep.jsonl"), "a") as f:
    f.write(json.dumps({"setting": name, "base_acc": base, "final_acc": final, "gain": final - base, "entropy_first": ent[0], "entropy_last": ent[-1]}) + "\n")
PYEOF
}
run lr1e-4
run lr3e-4 --set update.lr=3e-4
run lr1e-3 --set update.lr=1e-3
run b256_mb64_lr2e-4 --set update.lr=2e-4 --set rollout.limit=32 --set update.minibatch_size=64
run b256_one_step_lr5e-4 --set update.lr=5e-4 --set rollout.limit=32 --set update.minibatch_size=0 --set update.micro_batch_size=32
run g16_mb64_lr1e-4 --set rollout.group_size=16 --set update.minibatch_size=64
run lr3e-4_kl0.1 --set update.lr=3e-4 --set update.beta=0.1
$PY -c 'import json,sys; json.dump({"metric": "avg@4 at T=1 on 400 problems of taskgen seed 7 after 20 GRPO steps", "settings": [json.loads(l) for l in open(sys.argv[1])]}, open("bench/results/grpo_sweep.json", "w"), indent=2)' "$TMP/sweep.jsonl"
