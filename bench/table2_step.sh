#!/usr/bin/env bash
# One RREDCoT step at the paper's Table 2 scale (issue 17, item 3), through the real pipeline
# (pipelines/paper-table2.toml, the rredcot chain, one step): rollout of PROMPTS GSM8K prompts x
# SAMPLES samples x NEW new tokens (T = 0.7, one static batch), hybrid segmentation (<= 120
# segments), σ scoring (on_too_long = truncate), update_rredcot (bf16 mixed precision with
# gradient checkpointing, the setting that fits one 80 GB GPU). Each stage runs as its own
# `pipeline run --until` (the earlier ones cached), so its seconds include loading the
# checkpoint; with nvidia-smi the peak GPU memory of each is read every 100 ms.
#
# usage: bash bench/table2_step.sh MODEL_DIR OUT_JSON [PROMPTS SAMPLES NEW] [--set ...]
#   MODEL_DIR: a Hugging Face checkpoint (bench_gpu writes the 1.5B shape with random weights);
#   tokenizer.json is copied in from $QWEN_TOK (the Qwen3 tokenizer) when it has none.
#   Defaults 64 6 1024 (Table 2); `RUN` is the command prefix of rredcot-worker
#   (default ./target/release/rredcot-worker); STAGES (default "rollout segment score update")
#   picks the stages timed; RUN_RECORDS=DIR copies each stage instance's run record (its own
#   seconds, peak RSS, output hashes) to DIR/STAGE.json. Not a benchmark of its own: bench/gpu.sh
#   and the CPU step benchmarks (bench/env.sh's table2_cpu_step) run it.
set -euo pipefail
cd "$(dirname "$0")/.."
model=$(cd "$1" && pwd); out=$2; shift 2
prompts=64 samples=6 new=1024
if [ $# -ge 3 ] && [[ $1 != --* ]]; then prompts=$1 samples=$2 new=$3; shift 3; fi
extra=("$@")
tok=${QWEN_TOK:-.venv/share/qwen3-tokenizer}
for f in tokenizer.json tokenizer_config.json; do
  [ -f "$model/$f" ] || cp "$tok/$f" "$model/$f"
done
read -r -a run <<<"${RUN:-./target/release/rredcot-worker}"
store=$(mktemp -d)
trap 'rm -rf "$store"' EXIT
gsm=data/gsm8k-mgs/gsm8k-mgs-eng.jsonl
m=file:$model
sets=(import_train.inputs.source=file:$PWD/$gsm import_train.layout=gsm8k import_train.source=gsm8k-mgs
      rredcot.repeat=1 grpo.repeat=1
      rollout.inputs.policy=$m segment.inputs.tokenizer=$m score.inputs.policy=$m
      update.inputs.policy=$m update.inputs.optimizer=$m update.inputs.reference=$m eval_base.inputs.policy=$m
      rollout.limit=$prompts rollout.group_size=$samples rollout.max_new_tokens=$new
      rollout.batch_size=$((prompts * samples))
      update.max_completion_length=$new update.dtype=bf16 update.gradient_checkpointing=true)
# The evaluation imports are not run (--until), but their files must resolve.
for b in minerva aime24 aime25 math500; do sets+=("import_$b.inputs.source=file:$PWD/$gsm"); done
args=()
for s in "${sets[@]}"; do args+=(--set "$s"); done
for s in "${extra[@]}"; do args+=("$s"); done

json="{"
for stage in ${STAGES:-rollout segment score update}; do
  smi=""
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$store/smi-$stage" &
    smi=$!
  fi
  t0=$EPOCHREALTIME
  ok=true
  "${run[@]}" --store "$store/s" pipeline run pipelines/paper-table2.toml --until "rredcot.$stage[0]" \
    "${args[@]}" >"$store/$stage.out" 2>"$store/$stage.err" || ok=false
  secs=$(awk "BEGIN{print $EPOCHREALTIME - $t0}")
  peak=null
  if [ -n "$smi" ]; then
    kill "$smi"; wait "$smi" 2>/dev/null || true
    peak=$(sort -n "$store/smi-$stage" | tail -1 | awk '{printf "%.2f", $1/1024}')
  fi
  if [ -n "${RUN_RECORDS:-}" ]; then
    # The runner's line for the instance: "done     rredcot.STAGE[0] (KEY) in Ns".
    key=$(sed -n "s/^done     rredcot\.$stage\[0\] (\([0-9a-f]*\)).*/\1/p" "$store/$stage.err" | head -1)
    [ -n "$key" ] && cp "$store"/s/instances/"$key"*/run.json "$RUN_RECORDS/$stage.json" || true
  fi
  echo "table2 $stage: $secs s, peak GPU memory ${peak} GB, ok=$ok" >&2
  json+="\"$stage\": {\"seconds\": $secs, \"peak_gpu_mem_gb\": ${peak:-null}, \"ok\": $ok},"
  if ! $ok; then
    tail -5 "$store/$stage.err" >&2
    err=$(tail -c 400 "$store/$stage.err" | tr -d '\000-\037' | sed 's/\\/\\\\/g; s/"/\\"/g')
    json+="\"error\": \"$stage: $err\","
    break
  fi
done
json+="\"prompts\": $prompts, \"samples\": $samples, \"new_tokens\": $new}"
echo "$json" >"$out"
echo "$json"
