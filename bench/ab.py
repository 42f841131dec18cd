"""Summary of an A/B benchmark made by `alternate` (bench/env.sh): usage: ab.py ROWS NEW OLD META.
ROWS has a line "WAY RUN_RECORD" per run; META is a JSON object of the benchmark's own facts
(command, model, run, baseline), merged first. Prints the JSON: per way the stage's seconds, tokens
and output hashes; NEW_seconds_median, OLD_seconds_median, speedup (OLD / NEW) and same_outputs
(every run of both ways wrote the same artifacts)."""
import json
import statistics
import sys

rows_path, new, old, meta = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
rows = [line.split() for line in open(rows_path)]
out = {**meta, "reps": sum(1 for r in rows if r[0] == new), "ways": {}}
for way in [new, old]:
    rs = [json.load(open(r[1])) for r in rows if r[0] == way]
    out["ways"][way] = {"seconds": [round(r["wall_s"], 2) for r in rs],
                        "tokens": [r["counters"].get("tokens_generated") for r in rs],
                        "outputs": [{n: o["hash"] for n, o in sorted(r["outputs"].items())} for r in rs]}
a, b = out["ways"][new], out["ways"][old]
out[f"{new}_seconds_median"] = statistics.median(a["seconds"])
out[f"{old}_seconds_median"] = statistics.median(b["seconds"])
out["speedup"] = out[f"{old}_seconds_median"] / out[f"{new}_seconds_median"]
out["same_outputs"] = all(o == a["outputs"][0] for o in a["outputs"] + b["outputs"])
json.dump(out, sys.stdout, indent=1)
print()
print(f"{out.get('run', '')}: {old} {out[f'{old}_seconds_median']:.1f} s -> {new} {out[f'{new}_seconds_median']:.1f} s "
      f"({out['speedup']:.2f}x), same outputs: {out['same_outputs']}", file=sys.stderr)
