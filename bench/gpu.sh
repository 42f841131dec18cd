#!/usr/bin/env bash
# GPU benchmark (issue 17), on a machine with CUDA: our decode of the 1.5B Qwen2 shape (bf16,
# sampled T = 1, 128 new tokens, batch 1/64/256) beside transformers' `generate` on the same GPU,
# model and batch in one run; σ's log-probabilities in bf16 vs f32; the shortened quickstart's
# wall time on the GPU over the CPU, both pinned to the same 2 cores (`taskset`) so the CPU run is
# what a 2-core machine does. Writes bench/results/gpu.json.
#
# Where cargo is, it builds what it runs. On a GPU host without a Rust toolchain it runs the
# binaries of `bash bench/gpu_bundle.sh` (built here, carried there as .gpu-bundle/).
# One update step of the same shape per training precision, with its peak GPU memory; one
# RREDCoT step at Table 2 scale through the pipeline (bench/table2_step.sh).
#
# REPEATS (default 3): timed decodes per figure on each side after the warm-up; the median is the
# figure, every run kept (`*_runs`).
# GPU_PARTS (default "decode train quickstart table2") picks the parts to run; the keys of the
# parts not run are kept from the existing bench/results/gpu.json (each part's entry in
# `measured` says which run wrote it). Within the decode part DECODE_FIGURES (bench_gpu's figure
# names, default all) and BATCHES (transformers' batch sizes, default "1 64 256") pick the
# figures, DECODE_TIMEOUT (seconds) bounds our side: the figures finished before it are kept,
# each figure's run is stamped in `decode_measured`, and a ratio is only formed from two figures
# of the same run. TABLE2_PROMPTS (default 64) sizes the Table 2 step and
# TABLE2_SETS adds `--set`s to it (kept in table2.sets);
# below 64 the rollout alone also runs at 64 prompts and the other stages' seconds at 64 are
# extrapolated linearly in rows (and marked so).
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

parts=" ${GPU_PARTS:-decode train quickstart table2} "
has() { [[ $parts == *" $1 "* ]]; }
echo '{}' >"$TMP/ours.json"; echo '{}' >"$TMP/transformers.json"; echo null >"$TMP/train.json"
echo null >"$TMP/table2.json"; CPU_S=null GPU_S=null
if has decode || has table2; then
  # Cut short (DECODE_TIMEOUT) or failed after the checkpoint: the figures written so far count.
  limit=(timeout "${DECODE_TIMEOUT:-0}")
  run examples/bench_gpu "$TMP" || echo "bench_gpu stopped early (exit $?): keeping the figures it wrote" >&2
  limit=()
  [ -f "$TMP/model/config.json" ] || { echo "bench_gpu wrote no checkpoint: nothing to compare" >&2; exit 1; }
fi
if has decode; then
  $PY bench/gpu_transformers.py "$TMP/model" "$TMP/prompt.json" "$TMP/transformers.json" ||
    echo "transformers' decode failed (exit $?): keeping the batches it finished" >&2
fi
if has table2; then
  # The Table 2 step on bench_gpu's checkpoint (the 1.5B shape, random weights, bf16).
  n=${TABLE2_PROMPTS:-64}
  if [ -f .gpu-bundle/run.sh ] && ! command -v cargo >/dev/null; then
    export RUN="bash .gpu-bundle/run.sh target-gpu/release/rredcot-worker" QWEN_TOK=$TMP/qwen3-tokenizer
    mkdir -p "$QWEN_TOK"
    for f in tokenizer.json tokenizer_config.json; do xz -dc ".gpu-bundle/qwen3-tokenizer/$f.xz" >"$QWEN_TOK/$f"; done
  fi
  # TABLE2_SETS: extra `--set`s for the step, e.g. "rollout.dtype=tf32 score.dtype=tf32".
  t2_sets=()
  for s in ${TABLE2_SETS:-}; do t2_sets+=(--set "$s"); done
  bash bench/table2_step.sh "$TMP/model" "$TMP/table2-step.json" "$n" 6 1024 "${t2_sets[@]}" || true
  if [ "$n" -lt 64 ]; then
    STAGES=rollout bash bench/table2_step.sh "$TMP/model" "$TMP/table2-rollout64.json" 64 6 1024 "${t2_sets[@]}" || true
  fi
  $PY - "$TMP/table2-step.json" "$TMP/table2-rollout64.json" "$n" >"$TMP/table2.json" <<'PYEOF'
import json, os, sys
step = json.load(open(sys.argv[1])) if os.path.exists(sys.argv[1]) else {"error": "no result"}
n = int(sys.argv[3])
stages = ["rollout", "segment", "score", "update"]
res = {"step": step, "sets": os.environ.get("TABLE2_SETS", "").split()}
if n < 64 and os.path.exists(sys.argv[2]):
    r64 = json.load(open(sys.argv[2]))
    res["rollout_at_64_prompts"] = r64
    secs = {s: step[s]["seconds"] * (1 if s == "segment" else 64 / n) for s in stages if s in step}
    if "rollout" in r64 and r64["rollout"].get("ok"):
        secs["rollout"] = r64["rollout"]["seconds"]
    res["seconds_at_64_prompts"] = secs
    res["note"] = (f"all four stages measured at {n} prompts x 6 x 1024; the rollout also at 64 prompts; score and "
                   f"update at 64 prompts extrapolated x {64 / n:g} (linear in rows; micro-batched, so their memory does not grow)")
else:
    res["seconds_at_64_prompts"] = {s: step[s]["seconds"] for s in stages if s in step}
peaks = [v["peak_gpu_mem_gb"] for v in list(step.values()) + list(res.get("rollout_at_64_prompts", {}).values())
         if isinstance(v, dict) and v.get("peak_gpu_mem_gb") is not None]
res["peak_gpu_mem_gb"] = max(peaks, default=None)
print(json.dumps(res))
PYEOF
fi
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
# TRAIN_SETTINGS (default all four: f32 / bf16 mixed, without / with checkpointing) picks the
# settings measured; the others keep their entries in gpu.json.
has train && {
  echo "{"
  sep=""
  for setting in ${TRAIN_SETTINGS:-f32:false f32:true bf16:false bf16:true}; do
    dtype=${setting%:*} ckpt=${setting#*:}
    name=$([ "$dtype" = bf16 ] && echo bf16_mixed || echo f32)$([ "$ckpt" = true ] && echo _checkpointing)
    echo "$sep\"$name\": $(train_step "$dtype" "$ckpt")"; sep=","
  done
  echo "}"
} >"$TMP/train.json"

# The shortened quickstart (as ml/tests/gpu.rs runs it) on each device, timed from a fresh store.
# `quickstart DEVICE [fresh]`: with `fresh`, a process per stage (--fresh-processes) instead of the
# warm stage processes, whose difference is the per-process start (libtorch, CUDA context).
quickstart() {
  local name=$1 extra=()
  if [ "${2:-}" = fresh ]; then name=$1-fresh extra=(--fresh-processes); fi
  short_quickstart_sets "$1"
  # QS_SETS_EXTRA: more `--set`s for both devices, e.g. static batches instead of continuous ones:
  # "grpo.rollout.continuous_batching=false rredcot.rollout.continuous_batching=false" (kept in
  # quickstart_sets).
  for s in ${QS_SETS_EXTRA:-}; do QS_SETS+=(--set "$s"); done
  local t0=$EPOCHREALTIME
  # QS_TIMEOUT (seconds, default none): a run cut short is written as null.
  local limit=(timeout "${QS_TIMEOUT:-0}")
  # --json: the summary names each stage's record, whose wall_s quickstart_stage_wall_s keeps.
  if run --pinned rredcot-worker --store "$TMP/store-$name" pipeline run pipelines/quickstart.toml \
      --until grpo.eval[1] --until rredcot.eval[1] "${QS_SETS[@]}" "${extra[@]}" --json >"$TMP/quickstart-$name.json"; then
    $PY -c "print($EPOCHREALTIME - $t0)"
  else
    echo null
  fi
}
if has quickstart; then
  CPU_S=$(quickstart cpu)
  GPU_S=$(quickstart cuda)
  CPU_FRESH_S=$(quickstart cpu fresh)
  GPU_FRESH_S=$(quickstart cuda fresh)
fi

mkdir -p bench/results
$PY - "$TMP/ours.json" "$TMP/transformers.json" "$CPU_S" "$GPU_S" "${#pin[@]}" "$TMP/train.json" \
    "$TMP/table2.json" "$parts" "$TMP" "${CPU_FRESH_S:-null}" "${GPU_FRESH_S:-null}" <<'PYEOF'
import datetime, json, os, sys
ours, theirs = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
def stage_walls(device):
    """Each stage's wall_s in the quickstart run on `device` (its fresh store's run records)."""
    summary = os.path.join(sys.argv[9], f"quickstart-{device}.json")
    try:
        keys = json.load(open(summary))["keys"]
    except (OSError, ValueError, KeyError):
        return {}
    store = os.path.join(sys.argv[9], f"store-{device}", "instances")
    walls = {}
    for stage, key in keys.items():
        try:
            walls[stage] = json.load(open(os.path.join(store, key, "run.json")))["wall_s"]
        except (OSError, ValueError, KeyError):
            walls[stage] = None
    return walls
num = lambda x: None if x == "null" else float(x)
cpu_s, gpu_s, pinned = num(sys.argv[3]), num(sys.argv[4]), sys.argv[5] != "0"
train, table2, parts = json.load(open(sys.argv[6])), json.load(open(sys.argv[7])), sys.argv[8].split()
path = "bench/results/gpu.json"
res = json.load(open(path)) if os.path.exists(path) else {}
res.pop("earlier_run_same_session", None)
gpu = theirs.pop("gpu", None) or res.get("gpu")
stamp = f"{datetime.date.today()} on {gpu}"
measured = res.setdefault("measured", {})
res.update({"command": "bash bench/gpu.sh", "gpu": gpu,
            "model": "Qwen2 1.5B shape (DeepSeek-R1-Distill-Qwen-1.5B), random weights, bf16, CUDA"})
if "decode" in parts:
    # This run's figures (DECODE_FIGURES / BATCHES may have picked some): each replaces its
    # earlier value and is stamped; the others keep theirs.
    now = {**theirs, **ours}
    res.update(now)
    res.setdefault("decode_measured", {}).update({k: stamp for k in now if not k.endswith("_runs")})
    def ratio(name, num, den):
        """name = num / den where both are this run's; dropped where only one is (a stale pair)."""
        if num in now and den in now:
            res[name] = now[num] / now[den]
        elif num in now or den in now:
            res.pop(name, None)
    for b in (1, 256):
        ratio(f"decode_speedup_vs_transformers_b{b}", f"decode_tok_s_b{b}", f"transformers_decode_tok_s_b{b}")
    for b in (1, 64, 256):
        ratio(f"decode_fusion_speedup_b{b}", f"decode_tok_s_b{b}", f"decode_unfused_tok_s_b{b}")
        ratio(f"decode_graph_speedup_b{b}", f"decode_graph_tok_s_b{b}", f"decode_tok_s_b{b}")
    ratio("decode_graph_speedup_vs_transformers_b256", "decode_graph_tok_s_b256", "transformers_decode_tok_s_b256")
    # Continuous batching (the stages' default) at b256, eager and replayed, against the static batch.
    ratio("decode_continuous_over_static_b256", "decode_continuous_tok_s_b256", "decode_tok_s_b256")
    ratio("decode_continuous_speedup_vs_transformers_b256", "decode_continuous_tok_s_b256", "transformers_decode_tok_s_b256")
    ratio("decode_continuous_graph_speedup_vs_transformers_b256", "decode_continuous_graph_tok_s_b256", "transformers_decode_tok_s_b256")
    figures = os.environ.get("DECODE_FIGURES")
    measured["decode"] = stamp + (f" (figures: {figures})" if figures else "")
if "quickstart" in parts:
    res["quickstart_cpu_s"], res["quickstart_gpu_s"] = cpu_s, gpu_s
    # Per stage, to tell a GPU's fixed costs (process start, CUDA context) from its compute.
    cpu_w, gpu_w = stage_walls("cpu"), stage_walls("cuda")
    res["quickstart_stage_wall_s"] = {st: {"cpu": cpu_w.get(st), "cuda": gpu_w.get(st)} for st in sorted(set(cpu_w) | set(gpu_w))}
    res["quickstart_gpu_over_cpu_time_ratio"] = gpu_s / cpu_s if cpu_s and gpu_s else None
    # The same runs with a process per stage (`--fresh-processes`): what warm processes save.
    res["quickstart_cpu_fresh_processes_s"], res["quickstart_gpu_fresh_processes_s"] = num(sys.argv[10]), num(sys.argv[11])
    res["quickstart_sets"] = os.environ.get("QS_SETS_EXTRA", "").split()
    res["quickstart_decode_graphs"] = os.environ.get("RREDCOT_DECODE_GRAPHS") == "1"
    res["quickstart_note"] = ("shortened quickstart (ml/tests/gpu.rs's sizes), fresh store per device, "
                              + ("both runs pinned to cores 0,1" if pinned else "not pinned: no taskset"))
    measured["quickstart"] = stamp
if "train" in parts:
    for setting in train.values():
        setting["measured"] = stamp
    res.setdefault("update_step_16x1088", {}).update(train)
    res["update_step_note"] = ("one optimizer step (forward, backward, clip, AdamW) of the 1.5B shape on 16 x 1088 "
                               "tokens; step_seconds = [first, second]; peak from nvidia-smi every 100 ms")
    measured["train"] = stamp
if "table2" in parts:
    res["table2"] = table2
    res["table2_step_seconds"] = table2.get("seconds_at_64_prompts") if table2 else None
    res["table2_peak_gpu_mem_gb"] = table2.get("peak_gpu_mem_gb") if table2 else None
    res["table2_note"] = ("bench/table2_step.sh: one RREDCoT step of pipelines/paper-table2.toml on GSM8K prompts, "
                          "the 1.5B shape with random weights and the Qwen3 tokenizer, x 6 samples x 1024 new tokens, "
                          "update in bf16 with gradient checkpointing; seconds per stage include loading the checkpoint")
    measured["table2"] = stamp
json.dump(res, open(path, "w"), indent=2, sort_keys=True)
print(json.dumps(res, indent=2, sort_keys=True))
PYEOF
