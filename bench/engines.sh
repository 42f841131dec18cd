#!/usr/bin/env bash
# Sampling through an inference engine (issue 20): the tiny policy's rollout through `rredcot
# serve` (backend = "http", the stage starts and stops the server) vs the built-in rollout, same
# rows and seeds, in one run -> bench/results/engines.json. Wall times from the run records
# (engine start and model load included), median of REPS forced reruns; the HTTP rollout with
# entropies = "none" (the HTTP path alone) and = "prefill" (plus one prefill per completion).
# GPU engines (vLLM, SGLang) are not measured here: this script runs on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
PROFILE=${PROFILE:-release}
REPS=${REPS:-3}
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
if [ "$PROFILE" = release ]; then cargo build --release --workspace --bins; else cargo build --workspace --bins; fi
BIN=$TARGET/$PROFILE/rredcot-worker
STORE=${BENCH_STORE:-$TMP/store}
# Twice the server's slots in flight, so a slot that frees has a request waiting. (Before the
# server batched continuously across requests, `concurrency` = `--max-batch` ran clients and
# server in lockstep: the `http_lockstep` stage, 32 in flight, kept for comparison.)
HTTP='backend = "http", server_command = "{rredcot} serve --model {policy} --port {port} --model-name {policy_hash} --device cpu --threads 1 --max-batch 32 --max-new-tokens 256", concurrency = 64'
# The configuration measured before (requests in flight = the server's batch).
HTTP_LOCKSTEP=$(echo "$HTTP" | sed 's/concurrency = 64/concurrency = 32/')
cat > "$TMP/engines.toml" <<TOML
stage_dirs = ["$PWD/stages"]
$(world_front)
[[stage]]
name = "http"
uses = "rollout"
$ROLL, entropies = "none", $HTTP }
[[stage]]
name = "http_prefill"
uses = "rollout"
$ROLL, entropies = "prefill", $HTTP }
[[stage]]
name = "http_lockstep"
uses = "rollout"
$ROLL, entropies = "none", $HTTP_LOCKSTEP }
TOML
for i in $(seq 1 "$REPS"); do
  force=(--force builtin --force http --force http_prefill --force http_lockstep)
  "$BIN" --store "$STORE" pipeline run "$TMP/engines.toml" --json "${force[@]}" > "$TMP/run$i.json"
  $PY - "$TMP/run$i.json" "$STORE" >> "$TMP/walls.jsonl" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
rec = lambda st: json.load(open(f"{sys.argv[2]}/instances/{s['keys'][st]}/run.json"))
print(json.dumps({st: {"wall_s": rec(st)["wall_s"], "tokens": rec(st)["counters"].get("tokens_generated"), "ids": rec(st)["outputs"]["rollouts"]["hash"], "metrics": rec(st)["metrics"]} for st in ["builtin", "http", "http_prefill", "http_lockstep"]}))
PYEOF
done
$PY - "$TMP/walls.jsonl" bench/results/engines.json "$PROFILE" <<'PYEOF'
import json, os, statistics, sys
sys.path.insert(0, "bench")
import machine
runs = [json.loads(l) for l in open(sys.argv[1])]
med = lambda st: statistics.median(r[st]["wall_s"] for r in runs)
b, h, hp, hl = med("builtin"), med("http"), med("http_prefill"), med("http_lockstep")
last = runs[-1]
out = {
    "what": "rollout of the tiny default-world policy (64 prompts x 8 samples, <= 256 new tokens, T = 1): built-in vs through `rredcot serve` started by the stage",
    "command": f"PROFILE={sys.argv[3]} bench/engines.sh",
    "profile": sys.argv[3],
    **machine.facts(),
    "threads": 1,
    "reps": len(runs),
    "tokens_generated": last["builtin"]["tokens"],
    "builtin_wall_s": b,
    "http_wall_s": h,
    "http_prefill_wall_s": hp,
    "http_over_builtin": h / b,
    "http_prefill_over_builtin": hp / b,
    "http_lockstep_wall_s": hl,
    "http_lockstep_over_builtin": hl / b,
    "http_concurrency": 64,
    "http_lockstep_concurrency": 32,
    "server_max_batch": 32,
    "target": "http_over_builtin <= 1.3",
    # The engine's start (process, model load, health check) is paid once per stage; since the
    # built-in decode got ~10x faster it is half the built-in wall of this small workload.
    "http_without_engine_start_over_builtin": (h - statistics.median(r["http"]["metrics"].get("engine_startup_s", 0) for r in runs)) / b,
    "same_tokens_as_builtin": last["builtin"]["tokens"] == last["http"]["tokens"] == last["http_lockstep"]["tokens"],
    "engine": last["http"]["metrics"].get("engine"),
    "engine_version": last["http"]["metrics"].get("engine_version"),
    "engine_startup_s": statistics.median(r["http"]["metrics"].get("engine_startup_s", 0) for r in runs),
    "walls": runs and [{st: r[st]["wall_s"] for st in ["builtin", "http", "http_prefill", "http_lockstep"]} for r in runs],
    "gpu_engine": "not measured: no GPU here (vLLM's CPU build: the vllm_cpu key, bench/engines_vllm.sh)",
}
# Keep every key this script does not write: bench/engines_vllm.sh's `vllm_cpu`,
# bench/engine_reload.sh's `reload_*`, bench/engine_stale.sh's `stale_load`.
old = json.load(open(sys.argv[2])) if os.path.exists(sys.argv[2]) else {}
out.update({k: v for k, v in old.items() if k not in out})
json.dump(out, open(sys.argv[2], "w"), indent=2)
print(json.dumps(out, indent=2))
PYEOF
