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
table2_cpu_setup
table2_cpu_compare head_pieces default "-u RREDCOT_HEAD_LOGITS" previous "RREDCOT_HEAD_LOGITS=$((1 << 28))"
table2_cpu_step kl-default "-u RREDCOT_HEAD_LOGITS" --set update.beta=0.04
table2_cpu_step kl-at-once "RREDCOT_HEAD_LOGITS=$((1 << 40))" --set update.beta=0.04
$PY - "$TMP/rows" <<'PYEOF'
import json, sys
sys.path.insert(0, "bench")
import stage_runs
rows, path = stage_runs.read_rows(sys.argv[1]), "bench/results/head_pieces.json"
kl = {}
for label in ["default", "at-once"]:
    [u] = stage_runs.runs(rows, f"kl-{label}", "update")
    kl[label.replace("-", "_")] = {"seconds": round(u["wall_s"], 2), "peak_rss_mb": round(u["peak_rss_mb"], 1),
                                   "outputs": stage_runs.outputs(u)}
out = json.load(open(path))
out["update_with_kl_beta_0.04"] = kl
json.dump(out, open(path, "w"), indent=1)
print(f"update with a KL term: head at once {kl['at_once']['seconds']} s, {kl['at_once']['peak_rss_mb']:.0f} MB -> "
      f"in pieces {kl['default']['seconds']} s, {kl['default']['peak_rss_mb']:.0f} MB")
PYEOF
