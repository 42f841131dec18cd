"""Sums up the CPU Table 2 step benchmarks' runs (bench/env.sh's table2_cpu_step rows: NAME STAGE
RECORD, the record a stage instance's run.json): per stage and way, the seconds and peak RSS of
every run, its output hashes, and the two ways' medians, speed-up and whether every run of both
wrote the same outputs.

usage (bench/env.sh's table2_cpu_compare): stage_runs.py ROWS BENCH REPS PROMPTS NEW LABEL BASE_LABEL
writes bench/results/BENCH.json from the runs named LABEL-i and BASE_LABEL-i."""
import json
import os
import statistics
import sys

STAGES = ["rollout", "segment", "score", "update"]


def read_rows(path):
    return [line.split() for line in open(path)]


def runs(rows, name_prefix, stage):
    """The run records of `stage` in the runs whose name starts with `name_prefix`."""
    return [json.load(open(r[2])) for r in rows if r[0].startswith(name_prefix) and r[1] == stage]


def outputs(record):
    return {k: v["hash"] for k, v in sorted(record["outputs"].items())}


def header(command, reps, prompts, new):
    return {"command": command, "machine": f"{os.cpu_count()} CPUs, release build",
            "model": "Qwen2, vocabulary 151,936, 2 layers of width 64, random weights, Qwen3 tokenizer",
            "step": f"{prompts} GSM8K prompts x 6 samples x {new} new tokens through pipelines/paper-table2.toml "
                    "(bench/table2_step.sh: update in bf16 with gradient checkpointing)",
            "reps": int(reps), "stages": {}}


def compare(rows, ways):
    """`ways`: [(label, name prefix)] of the way measured and its baseline, in that order. Per
    stage: `{label}_seconds_median`, `speedup` (baseline / measured), `{label}_peak_rss_mb`,
    `same_outputs` and every run under `runs`, keyed by each way's `runs` key."""
    (label, _), (base_label, _) = ways
    stages = {}
    for stage in STAGES:
        per = {}
        for lab, prefix in ways:
            rs = runs(rows, prefix, stage)
            hashes = [outputs(x) for x in rs]
            per[lab] = {"seconds": [round(x["wall_s"], 2) for x in rs],
                        "peak_rss_mb": [round(x["peak_rss_mb"], 1) for x in rs],
                        "outputs": hashes[0], "all_reps_same_outputs": all(h == hashes[0] for h in hashes)}
        a, b = per[label], per[base_label]
        stages[stage] = {
            f"{label}_seconds_median": statistics.median(a["seconds"]),
            f"{base_label}_seconds_median": statistics.median(b["seconds"]),
            "speedup": statistics.median(b["seconds"]) / statistics.median(a["seconds"]),
            f"{label}_peak_rss_mb": max(a["peak_rss_mb"]), f"{base_label}_peak_rss_mb": max(b["peak_rss_mb"]),
            "same_outputs": a["outputs"] == b["outputs"] and a["all_reps_same_outputs"] and b["all_reps_same_outputs"],
            "runs": per}
    return stages


def print_stages(stages, label, base_label):
    for s, v in stages.items():
        print(f"{s}: {v[f'{base_label}_seconds_median']:.2f} s -> {v[f'{label}_seconds_median']:.2f} s ({v['speedup']:.2f}x), "
              f"peak RSS {v[f'{base_label}_peak_rss_mb']:.0f} -> {v[f'{label}_peak_rss_mb']:.0f} MB, same outputs: {v['same_outputs']}")


if __name__ == "__main__":
    rows_path, bench, reps, prompts, new, label, base_label = sys.argv[1:8]
    out = header(f"bash bench/{bench}.sh", reps, prompts, new)
    out["stages"] = compare(read_rows(rows_path), [(label, f"{label}-"), (base_label, f"{base_label}-")])
    json.dump(out, open(f"bench/results/{bench}.json", "w"), indent=1)
    print_stages(out["stages"], label, base_label)
