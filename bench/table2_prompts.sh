#!/usr/bin/env bash
# Whether the Table 2 step's memory grows with its prompts (issue 17, item 3: 64 prompts must fit
# where 16 were measured), on the CPU: the step of bench/cpu_alloc.sh (the Qwen-vocabulary model
# of 2 layers of width 64, 6 samples x NEW new tokens, update in bf16 with checkpointing) at 16 and
# at 64 prompts, per stage its seconds and peak RSS (the instance's run record). The rollout's
# batch is all its rows (bench/table2_step.sh sets batch_size = prompts x 6), the update's
# micro-batches are 16 sequences. Writes bench/results/table2_prompts.json.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
NEW=${NEW:-128}
table2_cpu_setup
for p in 16 64; do PROMPTS=$p table2_cpu_step "p$p-1" "-u RREDCOT_CPU_CACHE_MB"; done
$PY - "$TMP/rows" "$NEW" <<'PYEOF'
import json, sys
sys.path.insert(0, "bench")
from stage_runs import STAGES, header, read_rows, runs
rows, new = read_rows(sys.argv[1]), sys.argv[2]
out = header("bash bench/table2_prompts.sh", 1, "16 and 64", new)
for stage in STAGES:
    per = {p: runs(rows, f"p{p}-", stage)[0] for p in (16, 64)}
    out["stages"][stage] = {f"p{p}": {"seconds": round(r["wall_s"], 2), "peak_rss_mb": round(r["peak_rss_mb"], 1)} for p, r in per.items()}
    out["stages"][stage]["peak_rss_ratio_64_over_16"] = per[64]["peak_rss_mb"] / per[16]["peak_rss_mb"]
    print(f"{stage}: 16 prompts {per[16]['wall_s']:.1f} s {per[16]['peak_rss_mb']:.0f} MB, 64 prompts {per[64]['wall_s']:.1f} s {per[64]['peak_rss_mb']:.0f} MB")
json.dump(out, open("bench/results/table2_prompts.json", "w"), indent=1)
PYEOF
