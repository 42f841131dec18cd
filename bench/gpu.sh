#!/usr/bin/env bash
# GPU benchmark (issue 17), on a machine with CUDA: our decode of the 1.5B Qwen2 shape (bf16,
# sampled T = 1, 128 new tokens, batch 1/64/256) beside transformers' `generate` on the same GPU,
# model and batch in one run; σ's log-probabilities in bf16 vs f32; the shortened quickstart's
# wall time on the GPU over the CPU, both pinned to the same 2 cores (`taskset`) so the CPU run is
# what a 2-core machine does. Writes bench/results/gpu.json.
#
# Where cargo is, it builds what it runs. On a GPU host without a Rust toolchain it runs the
# binaries of `bash bench/gpu_bundle.sh` (built here, carried there as .gpu-bundle/).
# One update step of the same shape per training precision, with its peak GPU memory. The whole
# Table 2 step (64 prompts x 6 samples x 1024 tokens through rollout, segment, score, update) is
# not scripted yet: its keys are written as null with a note.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
if ! $PY -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "SKIP bench/gpu.sh: torch sees no CUDA device (bench/results/gpu.json left as it is)"
  exit 0
fi
pin=()
command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ] && pin=(taskset -c 0,1)
limit=()  # a caller's `local limit=(timeout N)` bounds its runs
# run [--pinned] EXE ARGS...: one of our binaries, on cores 0,1 with --pinned.
if [ -f .gpu-bundle/run.sh ] && ! command -v cargo >/dev/null; then
  run() { local p=(); [ "$1" = --pinned ] && { p=("${pin[@]}"); shift; }
          local exe=$1; shift; "${limit[@]}" bash .gpu-bundle/run.sh "${p[@]}" "target-gpu/release/$exe" "$@"; }
else
  cargo build --release -p rredcot-ml --example bench_gpu --bin rredcot-worker
  run() { local p=(); [ "$1" = --pinned ] && { p=("${pin[@]}"); shift; }
          local exe=$1; shift; "${limit[@]}" "${p[@]}" "./target/release/$exe" "$@"; }
fi

run examples/bench_gpu "$TMP"
$PY bench/gpu_transformers.py "$TMP/model" "$TMP/prompt.json" "$TMP/transformers.json"
rm -rf "$TMP/model"

# One update step of the 1.5B shape on 16 sequences of 1088 tokens (the update's default micro-batch;
# 64-token prompts + 1024 new tokens as in Table 2) per precision / checkpointing setting, each in
# its own process, with the peak GPU memory nvidia-smi reads while it runs.
train_step() {
  local log=$TMP/smi-$1-$2.txt
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$log" &
  local smi=$!
  local out
  out=$(run examples/bench_gpu train "$1" "$2" 16 1088 2>"$TMP/train-$1-$2.err") || out='{"error": "failed"}'
  kill $smi; wait $smi 2>/dev/null || true
  tail -3 "$TMP/train-$1-$2.err" >&2
  $PY -c "import json,sys; r=json.loads(sys.argv[1]); r['peak_gpu_mem_gb']=max([float(l) for l in open(sys.argv[2]) if l.strip()], default=0)/1024; r['error_tail']=open(sys.argv[3]).read()[-300:] if 'error' in r else None; print(json.dumps(r))" "$out" "$log" "$TMP/train-$1-$2.err"
}
{
  echo "{"
  echo "\"f32\": $(train_step f32 false),"
  echo "\"f32_checkpointing\": $(train_step f32 true),"
  echo "\"bf16_mixed\": $(train_step bf16 false),"
  echo "\"bf16_mixed_checkpointing\": $(train_step bf16 true)"
  echo "}"
} >"$TMP/train.json"

# The shortened quickstart (as tests/gpu.rs runs it) on each device, timed from a fresh store.
quickstart() {
  local sets=() s
  for s in taskgen.n_train=300 taskgen.n_eval=20 taskgen.max_steps=2 sft.steps=40 sft.batch_size=8 \
           sft.layers=2 sft.hidden=64 sft.heads=2 sft.kv_heads=1 sft.intermediate=128 sft.eval_n=4 \
           sft.eval_max_new_tokens=16 grpo.repeat=2 rredcot.repeat=2; do sets+=(--set "$s"); done
  for s in grpo.rollout rredcot.rollout grpo.update rredcot.update grpo.eval rredcot.eval rredcot.score sft; do
    sets+=(--set "$s.device=$1")
  done
  local t0=$EPOCHREALTIME
  # QS_TIMEOUT (seconds, default none): a run cut short is written as null.
  local limit=(timeout "${QS_TIMEOUT:-0}")
  if run --pinned rredcot-worker --store "$TMP/store-$1" pipeline run pipelines/quickstart.toml \
      --until grpo.eval[1] --until rredcot.eval[1] "${sets[@]}" >/dev/null; then
    $PY -c "print($EPOCHREALTIME - $t0)"
  else
    echo null
  fi
}
CPU_S=$(quickstart cpu)
GPU_S=$(quickstart cuda)

mkdir -p bench/results
$PY - "$TMP/ours.json" "$TMP/transformers.json" "$CPU_S" "$GPU_S" "${#pin[@]}" "$TMP/train.json" <<'PYEOF'
import json, sys
ours, theirs = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
num = lambda x: None if x == "null" else float(x)
cpu_s, gpu_s, pinned = num(sys.argv[3]), num(sys.argv[4]), sys.argv[5] != "0"
train = json.load(open(sys.argv[6]))
res = {"command": "bash bench/gpu.sh", "gpu": theirs.pop("gpu"),
       "model": "Qwen2 1.5B shape (DeepSeek-R1-Distill-Qwen-1.5B), random weights, bf16, CUDA"}
for b in (1, 64, 256):
    res[f"decode_tok_s_b{b}"] = ours[f"decode_tok_s_b{b}"]
    res[f"transformers_decode_tok_s_b{b}"] = theirs[f"transformers_decode_tok_s_b{b}"]
for b in (1, 256):
    res[f"decode_speedup_vs_transformers_b{b}"] = ours[f"decode_tok_s_b{b}"] / theirs[f"transformers_decode_tok_s_b{b}"]
for k, v in ours.items():
    if not k.startswith("decode_tok_s_"):
        res[k] = v
res["quickstart_cpu_s"], res["quickstart_gpu_s"] = cpu_s, gpu_s
res["quickstart_gpu_over_cpu_time_ratio"] = gpu_s / cpu_s if cpu_s and gpu_s else None
res["quickstart_note"] = ("shortened quickstart (tests/gpu.rs's sizes), fresh store per device, "
                          + ("both runs pinned to cores 0,1" if pinned else "not pinned: no taskset"))
res["update_step_16x1088"] = train
res["update_step_note"] = ("one optimizer step (forward, backward, clip, AdamW) of the 1.5B shape on 16 x 1088 "
                           "tokens; step_seconds = [first, second]; peak from nvidia-smi every 100 ms")
res["table2_step_seconds"] = None
res["table2_peak_gpu_mem_gb"] = None
res["table2_note"] = "not measured: the Table 2 step is not scripted yet (issue 17, item 3)"
json.dump(res, open("bench/results/gpu.json", "w"), indent=2, sort_keys=True)
print(json.dumps(res, indent=2, sort_keys=True))
PYEOF
