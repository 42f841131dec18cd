#!/usr/bin/env bash
# Warm stage processes vs a process per stage (`--fresh-processes`), in one run, on CPU: the wall
# time of the shortened quickstart (ml/tests/gpu.rs's sizes, 16 stages, each a fresh store), REPS
# times each, alternating; with FULL=1 also `make run`'s pipeline (pipelines/quickstart.toml) cold,
# once each way (~25 min on 2 cores). Both ways must give the same instance keys (the keys chain
# every upstream artifact's hash, so equal final keys mean equal artifacts).
# Writes bench/results/stage_processes.json.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
REPS=${REPS:-3}
cargo build --release --workspace --bins
BIN=./target/release/rredcot-worker
short_quickstart_sets cpu
# run NAME MODE ARGS...: one cold run into a fresh store; its wall seconds to $TMP/NAME.wall.
run() {
  local name=$1 mode=$2 extra=()
  shift 2
  [ "$mode" = fresh ] && extra=(--fresh-processes)
  rm -rf "$TMP/store-$name"
  local t0=$EPOCHREALTIME
  "$BIN" --store "$TMP/store-$name" pipeline run pipelines/quickstart.toml "$@" "${extra[@]}" --json \
    >"$TMP/$name.json" 2>"$TMP/$name.err"
  $PY -c "print($EPOCHREALTIME - $t0)" >"$TMP/$name.wall"
  echo "$name $mode $(cat "$TMP/$name.wall") s"
}
for i in $(seq 1 "$REPS"); do
  for mode in fresh warm; do
    run "short-$mode-$i" $mode --until grpo.eval[1] --until rredcot.eval[1] "${QS_SETS[@]}"
  done
done
if [ "${FULL:-0}" = 1 ]; then
  for mode in fresh warm; do run "full-$mode" $mode; done
fi
$PY - "$TMP" "$REPS" "${FULL:-0}" <<'PYEOF'
import json, os, statistics, sys
tmp, reps, full = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
def load(name):
    return float(open(os.path.join(tmp, name + ".wall")).read()), json.load(open(os.path.join(tmp, name + ".json")))
def stage_count(summary):
    return len(summary["ran"])
res = {"command": "bash bench/stage_processes.sh" + (" (FULL=1)" if full else ""),
       "machine": f"{os.cpu_count()} CPUs, release build, OpenMP default wait policy",
       "note": "wall seconds of a cold `pipeline run` (fresh store) with warm stage processes (the default) and with a "
               "process per stage (--fresh-processes), measured alternately in one run; same_keys: both ways gave "
               "the same instance keys, hence the same artifacts"}
fresh = [load(f"short-fresh-{i}") for i in range(1, reps + 1)]
warm = [load(f"short-warm-{i}") for i in range(1, reps + 1)]
res["shortened_quickstart"] = {
    "stages_run": stage_count(warm[0][1]),
    "fresh_processes_s": [w for w, _ in fresh], "warm_processes_s": [w for w, _ in warm],
    "speedup_median": statistics.median(w for w, _ in fresh) / statistics.median(w for w, _ in warm),
    "same_keys": all(s["keys"] == fresh[0][1]["keys"] for _, s in fresh + warm),
}
if full:
    (fw, fs), (ww, ws) = load("full-fresh"), load("full-warm")
    res["quickstart"] = {"stages_run": stage_count(ws), "fresh_processes_s": fw, "warm_processes_s": ww,
                         "speedup": fw / ww, "same_keys": fs["keys"] == ws["keys"]}
elif os.path.exists("bench/results/stage_processes.json"):
    old = json.load(open("bench/results/stage_processes.json"))
    if "quickstart" in old:
        res["quickstart"] = old["quickstart"]
os.makedirs("bench/results", exist_ok=True)
json.dump(res, open("bench/results/stage_processes.json", "w"), indent=2, sort_keys=True)
print(json.dumps(res, indent=2, sort_keys=True))
PYEOF
