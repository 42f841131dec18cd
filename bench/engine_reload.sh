#!/usr/bin/env bash
# An engine kept across a training chain's steps (param `reload`) vs one started per step: three
# rollouts over three checkpoints of the tiny policy (the SFT model and two more trained with
# other seeds, as a chain's steps hand the rollout a new policy each time), one stage at a time
# in one run, through the same engine command both ways. Per stage: wall time, the engine's
# start or checkpoint load, and the largest gap between the engine's logprobs and the model
# core's prefill of the same tokens under that stage's checkpoint (an engine still sampling an
# older checkpoint, or reusing KV blocks computed under it, shows here); and the built-in rollout
# of the same rows, for the ratios to it. Writes the
# `reload_<ENGINE>` key (`reload_<ENGINE>_untied` with UNTIED=1, `..._sleep` with SLEEP=1) of
# bench/results/engines.json.
#
# SLEEP=1: the kept way with `sleep = true` (the engine sleeps between the stages and is woken to
# load the next checkpoint). vLLM's CPU build refuses --enable-sleep-mode ("not supported on
# current platform"), so there its dev-mode /sleep and /wake_up change the engine's state
# (scheduling paused, tags asleep) and free no memory; on a GPU add --enable-sleep-mode.
#
# ENGINE=serve (default): `rredcot serve`, reload = "sglang" (its POST /update_weights_from_disk).
# ENGINE=vllm: vLLM's CPU build from $VLLM_VENV (bench/engines_vllm.sh installs it), started with
# VLLM_SERVER_DEV_MODE=1, reload = "vllm" (POST /collective_rpc reload_weights, then
# POST /reset_prefix_cache).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
PROFILE=${PROFILE:-release}
ENGINE=${ENGINE:-serve}
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
VLLM_VENV=${VLLM_VENV:-$PWD/.venv-vllm}
if [ "$PROFILE" = release ]; then cargo build --release --workspace --bins; else cargo build --workspace --bins; fi
BIN=$TARGET/$PROFILE/rredcot-worker
STORE=${BENCH_STORE:-$TMP/store}

case "$ENGINE" in
  serve)
    CMD='{rredcot} serve --model {policy} --port {port} --model-name {policy_hash} --device cpu --threads 1 --max-batch 32 --max-new-tokens 256'
    RELOAD=sglang ;;
  vllm)
    "$VLLM_VENV/bin/python" -c 'import vllm' || { echo "no vLLM in $VLLM_VENV: run bench/engines_vllm.sh once" >&2; exit 1; }
    # As bench/engines_vllm.sh runs it (it says why), plus the dev-mode endpoints reload needs.
    CMD="env -u LD_LIBRARY_PATH VLLM_SERVER_DEV_MODE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=0 $VLLM_VENV/bin/python -m vllm.entrypoints.openai.api_server --model {policy} --port {port} --seed {seed} --served-model-name {policy_hash} --dtype float32 --enforce-eager --logprobs-mode processed_logprobs --max-num-seqs 64"
    RELOAD=vllm ;;
  *) echo "ENGINE is serve or vllm, not $ENGINE" >&2; exit 2 ;;
esac

# The world and two more checkpoints; then one pipeline per way: the rollouts r1..r3 over the
# three checkpoints (64 prompts x 8 samples <= 256 tokens, as bench/engines.sh), prefill entropies.
cat > "$TMP/policies.toml" <<TOML
stage_dirs = ["$PWD/stages"]
$(world_front)
TOML
for i in 2 3; do
  printf '[[stage]]\nname = "sft%s"\nuses = "bootstrap_sft"\ninputs = { train = "taskgen.train", eval = "taskgen.eval", tokenizer = "tokenizer.tokenizer" }\n' "$i"
  printf 'params = { seed = %s, steps = 100, batch_size = 8, layers = 2, hidden = 64, heads = 2, kv_heads = 1, intermediate = 128, eval_n = 4, eval_max_new_tokens = 16 }\n' "$i"
done >> "$TMP/policies.toml"
"$BIN" --store "$STORE" pipeline run "$TMP/policies.toml" --json > "$TMP/policies.json"
# The checkpoints as files. UNTIED=1: each with its own lm_head.weight (a copy of the embedding)
# and tie_word_embeddings = false. Without it they are tied, as bootstrap_sft writes them, and
# reload = "vllm" gives vLLM untied views of them (its CPU build reloads tied models wrong).
CKPTS=()
for st in sft sft2 sft3; do
  dir=$STORE/instances/$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["keys"][sys.argv[2]])' "$TMP/policies.json" "$st")/outputs/model
  if [ "${UNTIED:-0}" = 1 ]; then
    $PY - "$dir" "$TMP/$st-untied" <<'PYEOF'
import json, shutil, sys
from safetensors.torch import load_file, save_file
src, dst = sys.argv[1:]
shutil.copytree(src, dst)
t = load_file(f"{src}/model.safetensors")
t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()
save_file(t, f"{dst}/model.safetensors", metadata={"format": "pt"})
c = json.load(open(f"{dst}/config.json"))
c["tie_word_embeddings"] = False
json.dump(c, open(f"{dst}/config.json", "w"), indent=2)
PYEOF
    dir=$TMP/$st-untied
  fi
  CKPTS+=("$dir")
done
SLEEP=${SLEEP:-0}
chain() { # $1: reload, or "builtin" for the model core (no engine)
  cat "$TMP/policies.toml"
  sleep_param=""
  [ "$SLEEP" = 1 ] && [ "$1" != none ] && sleep_param=", sleep = true"
  for i in 1 2 3; do
    backend=", entropies = \"prefill\", backend = \"http\", server_command = \"$CMD\", concurrency = 64, timeout_s = 600.0, reload = \"$1\"$sleep_param"
    [ "$1" = builtin ] && backend=""
    printf '[[stage]]\nname = "r%s"\nuses = "rollout"\n%s%s }\n' "$i" "$(echo "$ROLL" | sed "s|policy = \"sft.model\"|policy = \"file:${CKPTS[$((i - 1))]}\"|")" "$backend"
  done
}
chain builtin > "$TMP/builtin.toml"
chain none > "$TMP/fresh.toml"
chain "$RELOAD" > "$TMP/kept.toml"
"$BIN" --store "$STORE" pipeline run "$TMP/builtin.toml" --jobs 1 --json --force r1 --force r2 --force r3 > "$TMP/builtin.json"
# One stage at a time: one warm process runs the chain, and keeps the engine in the kept way.
"$BIN" --store "$STORE" pipeline run "$TMP/fresh.toml" --jobs 1 --json --force r1 --force r2 --force r3 > "$TMP/fresh.json"
"$BIN" --store "$STORE" pipeline run "$TMP/kept.toml" --jobs 1 --json --force r1 --force r2 --force r3 > "$TMP/kept.json" 2> "$TMP/kept.err" || true
KEPT_ERROR=$(grep -o "stage \`r[0-9]\`: the engine kept.*" "$TMP/kept.err" | head -1 || true)
LEFT=$(ps -eo args= | grep -E -- "--(model-name|served-model-name) |^VLLM::" | grep -cv grep || true)

export LEFT KEPT_ERROR
$PY - "$TMP/fresh.json" "$TMP/kept.json" "$STORE" bench/results/engines.json "$PROFILE" "$ENGINE" "$RELOAD" "${UNTIED:-0}" "$TMP/builtin.json" "$SLEEP" <<'PYEOF'
import json, os, sys
sys.path.insert(0, "bench")
import machine
fresh, kept, store, out_path, profile, engine, reload, untied, builtin, sleep = sys.argv[1:]
def stages(summary):
    s = json.load(open(summary))
    out = {}
    for st in ["r1", "r2", "r3"]:
        path = f"{store}/instances/{s['keys'][st]}/run.json"
        if not os.path.exists(path):
            continue
        r = json.load(open(path))
        m = r["metrics"]
        if "engine_startup_s" not in m:  # the built-in rollout
            out[st] = {"wall_s": r["wall_s"], "tokens": r["counters"]["tokens_generated"]}
            continue
        out[st] = {"wall_s": r["wall_s"], "engine_startup_s": m["engine_startup_s"], "engine_reused": m["engine_reused"],
                   "engine_reload_s": m["engine_reload_s"], "logprob_gap_max_vs_prefill": m["engine_logprob_gap_max"],
                   "tokens": r["counters"]["tokens_generated"], "rollouts_hash": r["outputs"]["rollouts"]["hash"]}
        for t in ("engine_sleep_s", "engine_wake_s"):  # sleep = true
            if t in m:
                out[st][t[len("engine_"):]] = m[t]
        if "engine_canary_unchanged" in m:  # a kept engine's load, checked by the previous stage's probe sent again
            out[st].update({"canary_unchanged": m["engine_canary_unchanged"], "canary_core_shift": m["engine_canary_core_shift"]})
    return out
f, k, b = stages(fresh), stages(kept), stages(builtin)
total = lambda x: sum(v["wall_s"] for v in x.values())
key = f"reload_{engine}" + ("_untied" if untied == "1" else "") + ("_sleep" if sleep == "1" else "")
out = json.load(open(out_path)) if os.path.exists(out_path) else {}
out[key] = {
    "what": "three rollouts over three checkpoints of the tiny policy (%s; 64 prompts x 8 samples <= 256 tokens, T = 1, prefill entropies), one stage at a time: the engine started and stopped by each stage (reload = \"none\") vs started once and loaded with each next checkpoint (reload = \"%s\"%s)" % ("untied copies: lm_head.weight of its own" if untied == "1" else "tied embeddings, as bootstrap_sft writes them", reload, ", sleep = true: put to sleep after each stage, woken before each load" if sleep == "1" else ""),
    "command": f"ENGINE={engine} UNTIED={untied} SLEEP={sleep} PROFILE={profile} bash bench/engine_reload.sh",
    "profile": profile,
    **machine.facts(),
    "fresh_per_stage": f, "kept": k, "builtin": b,
    "kept_error": os.environ["KEPT_ERROR"] or None,
    "fresh_total_s": total(f),
    "builtin_total_s": total(b),
    "fresh_over_builtin": total(f) / total(b),
    "logprob_gap_max_vs_prefill_fresh": max(v["logprob_gap_max_vs_prefill"] for v in f.values()),
    "engine_processes_after_the_runs": int(os.environ["LEFT"]),
}
if len(k) == 3:
    out[key].update({"kept_total_s": total(k), "fresh_over_kept": total(f) / total(k), "kept_over_builtin": total(k) / total(b),
                     "logprob_gap_max_vs_prefill_kept": max(v["logprob_gap_max_vs_prefill"] for v in k.values())})
json.dump(out, open(out_path, "w"), indent=2)
print(json.dumps(out[key], indent=2))
PYEOF
