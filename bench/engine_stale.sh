#!/usr/bin/env bash
# A kept engine whose load did not take, between two checkpoints one GRPO step apart: does the
# kept-engine check (param `reload`) catch it when the engine runs in bf16, whose own noise may be
# as large as one step's change? The checkpoints are grpo.update[0] and grpo.update[1] of the
# shortened quickstart (ml/tests/gpu.rs's sizes), at each learning rate of LRS (default: the
# quickstart's 1e-4, and 1e-6 as RL of real reasoning models uses). Two rollouts over them
# (16 prompts x 4 samples <= 64 tokens, prefill entropies in the f32 model core), one stage at a
# time through `rredcot serve --dtype DTYPE` behind ml/tests/engine_proxy.py with reload =
# "sglang":
#   stale: the proxy answers success to the load without passing it on, so the second rollout
#          samples the first checkpoint: it must fail, and the message says which check caught it
#          (the logprob gap, or the canary: the earlier probe answered the same to the bit);
#   plain: the proxy passes the load on: both rollouts must pass, the canary changed.
# For DTYPE f32 and bf16. Writes the `stale_load` key of bench/results/engines.json.
LRS=${LRS:-1e-4 1e-6}
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
cargo build --release --workspace --bins
BIN=$PWD/target/release/rredcot
STORE=$TMP/store

short_quickstart_sets cpu
output() { # $1: stage, $2: output
  $PY -c 'import json,sys; s=json.load(open(sys.argv[1])); print(sys.argv[2] + "/instances/" + s["keys"][sys.argv[3]] + "/outputs/" + sys.argv[4])' "$TMP/qs.json" "$STORE" "$1" "$2"
}

: > "$TMP/rows"
for lr in $LRS; do
  "$BIN" --store "$STORE" pipeline run pipelines/quickstart.toml "${QS_SETS[@]}" --set "grpo.update.lr=$lr" --until 'grpo.update[1]' --json > "$TMP/qs.json"
  PROMPTS=$(output taskgen eval.parquet)
  STEP1=$(output 'grpo.update[0]' policy)
  STEP2=$(output 'grpo.update[1]' policy)
for dtype in f32 bf16; do
  for mode in stale plain; do
    cmd="python3 $PWD/ml/tests/engine_proxy.py {port} $mode {rredcot} serve --model {policy} --port INNER --model-name {policy_hash} --device cpu --dtype $dtype --threads 1 --max-batch 16 --max-new-tokens 64"
    {
      echo "stage_dirs = [\"$PWD/stages\"]"
      for i in 1 2; do
        ckpt=STEP$i
        printf '[[stage]]\nname = "r%s"\nuses = "rollout"\ninputs = { prompts = "file:%s", policy = "file:%s" }\n' "$i" "$PROMPTS" "${!ckpt}"
        printf 'params = { seed = 5, limit = 16, group_size = 4, max_new_tokens = 64, batch_size = 16, device = "cpu", threads = 1, backend = "http", server_command = "%s", concurrency = 8, timeout_s = 300.0, reload = "sglang" }\n' "$cmd"
      done
    } > "$TMP/$dtype-$mode.toml"
    run=$TMP/$lr-$dtype-$mode
    "$BIN" --store "$STORE" pipeline run "$TMP/$dtype-$mode.toml" --jobs 1 --json > "$run.json" 2> "$run.err" || true
    echo "$lr $dtype $mode $run.json $run.err" >> "$TMP/rows"
  done
done
done

$PY - "$TMP/rows" "$STORE" bench/results/engines.json <<'PYEOF'
import json, os, re, sys
sys.path.insert(0, "bench")
import machine
rows, store, out_path = sys.argv[1:]
res = {}
for line in open(rows):
    lr, dtype, mode, summary, err = line.split()
    s = json.load(open(summary))
    recs = {}
    for st in ["r1", "r2"]:
        p = f"{store}/instances/{s['keys'][st]}/run.json"
        if os.path.exists(p):
            m = json.load(open(p))["metrics"]
            recs[st] = {k: m.get(k) for k in ["engine_reused", "engine_logprob_gap_mean", "engine_logprob_gap_limit", "engine_canary_unchanged", "engine_canary_core_shift"]}
    text = open(err).read()
    failed = re.search(r"stage `(r\d)`: the engine kept from an earlier stage.*", text)
    entry = {"stages": recs, "failed": None}
    if failed:
        msg = failed.group(0)
        num = lambda pat: (lambda m: float(m.group(1)) if m else None)(re.search(pat, msg))
        by = "canary" if "exactly as before, to the bit" in msg else "logprob gap"
        entry["failed"] = {"stage": failed.group(1), "caught_by": by,
                           "gap_mean": num(r"samples with logprobs (\S+) nats") if by == "logprob gap" else num(r"its logprob gap over its samples, (\S+),"),
                           "limit": num(r"above the (\S+) allowed") if by == "logprob gap" else num(r"was within the (\S+) allowed"),
                           "canary_core_shift": num(r"logprobs by (\S+) nats")}
    res.setdefault(f"lr_{lr}", {}).setdefault(dtype, {})[mode] = entry
out = json.load(open(out_path)) if os.path.exists(out_path) else {}
out["stale_load"] = {
    "what": "a kept engine (rredcot serve, reload = sglang) behind a proxy that answers success to the load without passing it on (stale) or passes it on (plain), between grpo.update[0] and grpo.update[1] of the shortened quickstart (one GRPO step apart, at each learning rate lr_*); two rollouts of 16 prompts x 4 samples <= 64 tokens, prefill entropies in the f32 model core; per engine dtype",
    "command": "bash bench/engine_stale.sh",
    **machine.facts(),
    **res,
}
json.dump(out, open(out_path, "w"), indent=2)
print(json.dumps(out["stale_load"], indent=2))
PYEOF
