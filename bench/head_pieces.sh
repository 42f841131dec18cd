#!/usr/bin/env bash
# The LM head in pieces sized for the device (ml/src/model/head.rs: 2^24 logits at once on the
# CPU) against the previous sizes (RREDCOT_HEAD_LOGITS=2^28: σ scoring's chunks of up to 1,024
# target positions in one piece and the update's head in pieces of 2^28 logits, as before the
# change), on the CPU: one RREDCoT step of pipelines/paper-table2.toml through
# bench/table2_step.sh (PROMPTS GSM8K prompts x 6 samples x NEW new tokens, update in bf16 with
# gradient checkpointing), a Qwen2 model of Qwen's 151,936-token vocabulary with 2 layers of
# width 64 (random weights), so that the [rows, vocabulary] tensors weigh as with a real Qwen
# model and the layers cost little. The two sizes alternate, REPS times; per stage its seconds and
# peak RSS (the instance's run record, without process start) and whether both wrote the same
# output hashes. Then once each with a KL term (update.beta = 0.04, so the reference policy's
# log-probabilities are computed) at the default size and with the head at once
# (RREDCOT_HEAD_LOGITS=2^40), for the update's peak RSS. Writes bench/results/head_pieces.json.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
REPS=${REPS:-2}
PROMPTS=${PROMPTS:-16}
NEW=${NEW:-128}
cargo build --release -p rredcot-ml --bin rredcot-worker
W=./target/release/rredcot-worker
qwen_vocab_model "$TMP/model"

# One step: $1 = a name, $2 = RREDCOT_HEAD_LOGITS or "default", the rest extra --set args.
step() {
  local name=$1 size=$2; shift 2
  local records=$TMP/records-$name
  mkdir -p "$records"
  local run="env -u RREDCOT_HEAD_LOGITS $W"
  [ "$size" = default ] || run="env RREDCOT_HEAD_LOGITS=$size $W"
  RUN=$run RUN_RECORDS=$records bash bench/table2_step.sh "$TMP/model" "$records/step.json" "$PROMPTS" 6 "$NEW" "$@" >/dev/null
  for stage in rollout segment score update; do
    echo "$name $size $stage $records/$stage.json" >>"$TMP/rows"
  done
}
: >"$TMP/rows"
for rep in $(seq "$REPS"); do
  step "rep$rep-default" default
  step "rep$rep-previous" $((1 << 28))
done
step kl-default default --set update.beta=0.04
step kl-at-once $((1 << 40)) --set update.beta=0.04

$PY - "$TMP/rows" "$REPS" "$PROMPTS" "$NEW" <<'PYEOF' >bench/results/head_pieces.json
import json, os, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
out = {"command": "bash bench/head_pieces.sh", "machine": f"{os.cpu_count()} CPUs, release build",
       "model": "Qwen2, vocabulary 151,936, 2 layers of width 64, random weights, Qwen3 tokenizer",
       "step": f"{sys.argv[3]} GSM8K prompts x 6 samples x {sys.argv[4]} new tokens through pipelines/paper-table2.toml (bench/table2_step.sh: update in bf16 with gradient checkpointing)",
       "reps": int(sys.argv[2]), "stages": {}}
def runs(prefix, size, stage):
    return [json.load(open(r[3])) for r in rows if r[0].startswith(prefix) and r[1] == size and r[2] == stage]
for stage in ["rollout", "segment", "score", "update"]:
    per = {}
    for label, size in [("default", "default"), ("previous", str(1 << 28))]:
        rs = runs("rep", size, stage)
        hashes = [{k: v["hash"] for k, v in sorted(x["outputs"].items())} for x in rs]
        per[label] = {"seconds": [round(x["wall_s"], 2) for x in rs],
                      "peak_rss_mb": [round(x["peak_rss_mb"], 1) for x in rs],
                      "outputs": hashes[0], "all_reps_same_outputs": all(h == hashes[0] for h in hashes)}
    d, p = per["default"], per["previous"]
    out["stages"][stage] = {
        "default_seconds_median": statistics.median(d["seconds"]), "previous_seconds_median": statistics.median(p["seconds"]),
        "speedup": statistics.median(p["seconds"]) / statistics.median(d["seconds"]),
        "default_peak_rss_mb": max(d["peak_rss_mb"]), "previous_peak_rss_mb": max(p["peak_rss_mb"]),
        "same_outputs": d["outputs"] == p["outputs"] and d["all_reps_same_outputs"] and p["all_reps_same_outputs"],
        "runs": per}
kl = {}
for label, size in [("default", "default"), ("at_once", str(1 << 40))]:
    [u] = runs("kl-", size, "update")
    kl[label] = {"seconds": round(u["wall_s"], 2), "peak_rss_mb": round(u["peak_rss_mb"], 1),
                 "outputs": {k: v["hash"] for k, v in sorted(u["outputs"].items())}}
out["update_with_kl_beta_0.04"] = kl
json.dump(out, sys.stdout, indent=1)
print()
PYEOF
$PY - <<'PYEOF'
import json
d = json.load(open("bench/results/head_pieces.json"))
for s, v in d["stages"].items():
    print(f"{s}: {v['previous_seconds_median']:.2f} s -> {v['default_seconds_median']:.2f} s ({v['speedup']:.2f}x), "
          f"peak RSS {v['previous_peak_rss_mb']:.0f} -> {v['default_peak_rss_mb']:.0f} MB, same outputs: {v['same_outputs']}")
k = d["update_with_kl_beta_0.04"]
print(f"update with a KL term: head at once {k['at_once']['seconds']} s, {k['at_once']['peak_rss_mb']:.0f} MB -> "
      f"in pieces {k['default']['seconds']} s, {k['default']['peak_rss_mb']:.0f} MB")
PYEOF
