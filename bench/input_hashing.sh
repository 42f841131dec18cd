#!/usr/bin/env bash
# What hashing a large checkpoint costs a pipeline, with its hash remembered by file identity
# (the default, engine/src/file_hashes.rs) and with every file read in full each time
# (RREDCOT_REHASH=1, what rredcot did before), alternating in one run. The pipeline has the shape
# of a training step around a checkpoint of SIZE_GB GB of random bytes named by `file:`: `update`
# copies it into a new checkpoint (as an update writes one), `rollout`, `score` and `update_next`
# read that one, `eval_base` reads the `file:` one (light external stages: the time is the
# engine's). Per mode and rep, a fresh store: a cold run, a run with nothing to do, and a run
# that forces the four readers (the stages of later steps that load a checkpoint).
# Writes bench/results/input_hashing.json.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
SIZE_GB=${SIZE_GB:-2}
cargo build --release --bins
BIN=$PWD/target/release/rredcot
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/p/ckpt" "$TMP/p/stages"
head -c $((SIZE_GB * 1024 * 1024 * 1024)) /dev/urandom >"$TMP/p/ckpt/model.safetensors"
echo '{"model_type": "qwen2"}' >"$TMP/p/ckpt/config.json"
cat >"$TMP/p/stages/copy_ckpt.toml" <<'TOML'
command = "cp '{inputs.src}/model.safetensors' '{inputs.src}/config.json' '{outputs.out}/'"
[inputs]
src = "dir"
[outputs]
out = "dir"
TOML
# `role` gives each reader its own key (same kind, inputs and params would be one instance).
cat >"$TMP/p/stages/peek.toml" <<'TOML'
command = "ls -l '{inputs.src}' > '{outputs.out}/listing.txt'"
[inputs]
src = "dir"
[outputs]
out = "dir"
[params]
role = ""
TOML
cat >"$TMP/p/step.toml" <<TOML
description = "input hashing bench: a training step's stages around a $SIZE_GB GB checkpoint"
[[stage]]
name = "update"
uses = "copy_ckpt"
inputs = { src = "file:ckpt" }
[[stage]]
name = "rollout"
uses = "peek"
params = { role = "rollout" }
inputs = { src = "update.out" }
[[stage]]
name = "score"
uses = "peek"
params = { role = "score" }
inputs = { src = "update.out" }
[[stage]]
name = "update_next"
uses = "peek"
params = { role = "update_next" }
inputs = { src = "update.out" }
[[stage]]
name = "eval_base"
uses = "peek"
params = { role = "eval_base" }
inputs = { src = "file:ckpt" }
TOML
# A hash is remembered only for a file left alone for 2 s before it is hashed.
sleep 3
# run MODE NAME ARGS...: wall seconds of one `pipeline run` to $TMP/NAME.wall, its summary to NAME.json.
run() {
  local mode=$1 name=$2 env=()
  shift 2
  [ "$mode" = full ] && env=(RREDCOT_REHASH=1)
  local t0=$EPOCHREALTIME
  (cd "$TMP/p" && env "${env[@]}" "$BIN" --store "$TMP/store-$mode" pipeline run step.toml -j 1 --json "$@" \
    >"$TMP/$name.json" 2>"$TMP/$name.err")
  python3 -c "print($EPOCHREALTIME - $t0)" >"$TMP/$name.wall"
  echo "$name $(cat "$TMP/$name.wall") s"
}
for i in $(seq 1 "$REPS"); do
  for mode in full remembered; do
    rm -rf "$TMP/store-$mode"
    run $mode "$mode-cold-$i"
    run $mode "$mode-noop-$i"
    run $mode "$mode-readers-$i" --force rollout --force score --force update_next --force eval_base
  done
done
python3 - "$TMP" "$REPS" "$SIZE_GB" <<'PYEOF'
import json, os, statistics, sys
tmp, reps, size = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def wall(name):
    return float(open(os.path.join(tmp, name + ".wall")).read())
def keys(name):
    return json.load(open(os.path.join(tmp, name + ".json")))["keys"]
res = {"command": "bash bench/input_hashing.sh", "checkpoint_gb": float(size),
       "machine": f"{os.cpu_count()} CPUs, release build, the checkpoint in the page cache after its first read",
       "note": "wall seconds of `pipeline run -j 1` on the pipeline in the script's header; full = RREDCOT_REHASH=1 "
               "(every file read in full at planning and by every stage exec, as before hashes were remembered), "
               "remembered = the default; one fresh store per mode and rep, modes alternating"}
for run in ["cold", "noop", "readers"]:
    full = [wall(f"full-{run}-{i}") for i in range(1, reps + 1)]
    rem = [wall(f"remembered-{run}-{i}") for i in range(1, reps + 1)]
    res[run] = {"full_s": full, "remembered_s": rem,
                "speedup_median": statistics.median(full) / statistics.median(rem)}
res["same_keys"] = all(keys(f"full-{r}-{i}") == keys(f"remembered-{r}-{i}")
                       for r in ["cold", "noop", "readers"] for i in range(1, reps + 1))
json.dump(res, open("bench/results/input_hashing.json", "w"), indent=2, sort_keys=True)
print(json.dumps(res, indent=2, sort_keys=True))
PYEOF
