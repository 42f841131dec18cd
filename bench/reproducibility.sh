#!/usr/bin/env bash
# How much the quickstart's figures move between runs and machines (issue 19 point 4). Writes
# bench/results/reproducibility.json (OUT=FILE: there instead, e.g. for another machine's run).
# The front of pipelines/quickstart.toml up to `final_base` (taskgen, tokenizer, bootstrap SFT, the
# SFT policy's avg@2 on the 800 eval problems and the GSM8K fixture: the table's base row) runs in
# a fresh store per configuration:
#   again     the same command twice: are the artifacts bitwise equal on one machine?
#   threads1  the SFT on 1 libtorch thread instead of 2 (final_base already runs on 1)
#   avx2      ATEN_CPU_CAPABILITY=avx2: ATen's AVX2 kernels, as on a CPU without AVX-512 (the
#             same kernels as the reference run on such a CPU: the JSON names the native ones)
#   default   ATEN_CPU_CAPABILITY=default: ATen's kernels without SIMD, other kernels on any CPU
# Per configuration: which stages' output hashes equal the reference run's, the SFT model's largest
# weight difference, the SFT eval loss, and the base row's avg@k per benchmark.
# About 4-7 min per configuration here (release build, 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
CONFIGS=${CONFIGS:-"again threads1 avx2 default"}
OUT=${OUT:-bench/results/reproducibility.json}
cargo build --release --workspace --bins
BIN=./target/release/rredcot
run() { # run NAME [VAR=VALUE ...] -- [ARGS...]
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local t0=$SECONDS
  env "${envs[@]}" $BIN --store "$TMP/$name" pipeline run pipelines/quickstart.toml --until final_base -j 1 --json "$@" > "$TMP/$name.json"
  echo "$name: $((SECONDS - t0)) s" >&2
}
run reference --
for c in $CONFIGS; do
  case $c in
    again) run again -- ;;
    threads1) run threads1 -- --set sft.threads=1 --set final_base.threads=1 ;;
    avx2) run avx2 ATEN_CPU_CAPABILITY=avx2 -- ;;
    default) run default ATEN_CPU_CAPABILITY=default -- ;;
    *) echo "unknown config $c" >&2; exit 2 ;;
  esac
done

$PY - "$TMP" "$OUT" "$CONFIGS" <<'PYEOF'
import json, os, sys
sys.path.insert(0, "bench")
import machine
from safetensors.torch import load_file
tmp, out, configs = sys.argv[1], sys.argv[2], sys.argv[3].split()
def summary(name): return json.load(open(os.path.join(tmp, name + ".json")))
def record(name, stage):
    return json.load(open(os.path.join(tmp, name, "instances", summary(name)["keys"][stage], "run.json")))
def weights(name):
    return load_file(os.path.join(tmp, name, "instances", summary(name)["keys"]["sft"], "outputs", "model", "model.safetensors"))
def figures(name):
    fb = record(name, "final_base")["metrics"]
    sft = record(name, "sft")["metrics"]
    return {"avg_at_k": {k.split(".", 1)[1]: v for k, v in fb.items() if k.startswith("avg_at_k.")}, "sft_metrics": {k: v for k, v in sft.items() if isinstance(v, (int, float))}}
ref = summary("reference")
stages = sorted(ref["keys"])
def hashes(name):
    return {s: {o: v["hash"] for o, v in record(name, s)["outputs"].items()} for s in stages}
ref_hashes, ref_w, ref_fig = hashes("reference"), weights("reference"), figures("reference")
res = {"pipeline": "pipelines/quickstart.toml --until final_base", "stages": stages, "reference": ref_fig, "configs": {}}
for c in configs:
    h = hashes(c)
    w = weights(c)
    fig = figures(c)
    diff = max((w[k].float() - ref_w[k].float()).abs().max().item() for k in ref_w)
    moved = {b: (fig["avg_at_k"][b] - ref_fig["avg_at_k"][b]) * 100 for b in ref_fig["avg_at_k"]}
    res["configs"][c] = {
        "identical_stages": [s for s in stages if h[s] == ref_hashes[s]],
        "different_stages": [s for s in stages if h[s] != ref_hashes[s]],
        "sft_max_abs_weight_diff": diff,
        "figures": fig,
        "avg_at_k_moved_points": moved,
    }
res["max_moved_points"] = max([abs(v) for c in res["configs"].values() for v in c["avg_at_k_moved_points"].values()] or [0.0])
# native_cpu_capability: the ATen kernels the reference run used (ATEN_CPU_CAPABILITY unset); on
# a CPU whose native capability is AVX2, the avx2 configuration is the reference's own kernels.
res.update(machine.facts())
res["command"] = f"CONFIGS='{' '.join(configs)}'" + ("" if out == "bench/results/reproducibility.json" else f" OUT={out}") + " bash bench/reproducibility.sh"
json.dump(res, open(out, "w"), indent=2)
print(json.dumps(res, indent=2))
PYEOF
