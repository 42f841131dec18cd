#!/usr/bin/env python3
"""Engine benchmark: no-op (fully cached) run of an equivalent 20-stage pipeline in rredcot, DVC
and Snakemake, measured side by side in one run, plus a 1000-instance unrolled rredcot DAG.

Usage: bench/engine.py RREDCOT_BINARY BENCH_VENV_BIN OUT_JSON
"""
import json, os, shutil, statistics, subprocess, sys, tempfile, time

REPS = 7
rredcot, venv_bin, out_json = sys.argv[1], sys.argv[2], sys.argv[3]
repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def timed(cmd, cwd):
    t = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def median_noop(cmd, cwd):
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # populate
    return statistics.median(timed(cmd, cwd) for _ in range(REPS))


def rredcot_pipeline(d, n_stages=20, chain=0):
    lines = [f'stage_dirs = ["{repo}/stages"]', '[[stage]]', 'name = "s0"', 'uses = "demo_numbers"', 'params = { n = 100 }']
    for i in range(1, n_stages):
        lines += ['[[stage]]', f'name = "s{i}"', 'uses = "demo_sum"', f'inputs = {{ table = "s{i-1}.table" }}']
    if chain:
        lines += ['[[chain]]', 'name = "train"', f'repeat = {chain}', 'carry = { "step.state" = "step.state" }',
                  '[[chain.stage]]', 'name = "step"', 'uses = "demo_step"', 'params = { decay = 1.0 }', f'inputs = {{ state = "s{n_stages-1}.table" }}']
    p = os.path.join(d, "p.toml")
    open(p, "w").write("\n".join(lines) + "\n")
    return p


def main():
    res = {"reps": REPS, "machine_cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as d:
        p = rredcot_pipeline(d)
        res["noop20_rredcot_s"] = median_noop([rredcot, "--store", "st", "pipeline", "run", p], d)
    with tempfile.TemporaryDirectory() as d:
        p = rredcot_pipeline(d, n_stages=1, chain=999)
        t0 = time.perf_counter()
        subprocess.run([rredcot, "--store", "st", "pipeline", "run", p], cwd=d, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        res["cold1000_rredcot_s"] = time.perf_counter() - t0
        res["noop1000_rredcot_s"] = median_noop([rredcot, "--store", "st", "pipeline", "run", p], d)
    # DVC: 20 stages, each reads the previous stage's output file.
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([f"{venv_bin}/dvc", "init", "--no-scm", "-q"], cwd=d, check=True)
        stages = {}
        for i in range(20):
            dep = [] if i == 0 else [f"o{i-1}.txt"]
            cmd = "echo 0 > o0.txt" if i == 0 else f"cat o{i-1}.txt > o{i}.txt && echo {i} >> o{i}.txt"
            stages[f"s{i}"] = {"cmd": cmd, "deps": dep, "outs": [f"o{i}.txt"]} if dep else {"cmd": cmd, "outs": [f"o{i}.txt"]}
        import_yaml = "stages:\n" + "".join(
            f"  {k}:\n    cmd: {json.dumps(v['cmd'])}\n" + (f"    deps: {json.dumps(v['deps'])}\n" if 'deps' in v else "") + f"    outs: {json.dumps(v['outs'])}\n"
            for k, v in stages.items())
        open(os.path.join(d, "dvc.yaml"), "w").write(import_yaml)
        res["noop20_dvc_s"] = median_noop([f"{venv_bin}/dvc", "repro", "-q"], d)
    # Snakemake: the same 20-step chain.
    with tempfile.TemporaryDirectory() as d:
        rules = ['rule all:\n    input: "o19.txt"\n', 'rule s0:\n    output: "o0.txt"\n    shell: "echo 0 > {output}"\n']
        for i in range(1, 20):
            rules.append(f'rule s{i}:\n    input: "o{i-1}.txt"\n    output: "o{i}.txt"\n    shell: "cat {{input}} > {{output}} && echo {i} >> {{output}}"\n')
        open(os.path.join(d, "Snakefile"), "w").write("\n".join(rules))
        res["noop20_snakemake_s"] = median_noop([f"{venv_bin}/snakemake", "-j", "1", "--quiet", "all"], d)
    fastest = min(res["noop20_dvc_s"], res["noop20_snakemake_s"])
    res["noop20_ratio_vs_fastest_baseline"] = res["noop20_rredcot_s"] / fastest
    res["target_ratio"] = 1 / 20
    res["command"] = "make bench (bench/engine.sh)"
    os.makedirs(os.path.dirname(out_json), exist_ok=True)
    json.dump(res, open(out_json, "w"), indent=2)
    print(json.dumps(res, indent=2))


main()
