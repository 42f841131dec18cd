"""Baseline half of bench/gpu.sh: transformers `generate` (sdpa, bfloat16, CUDA) on the checkpoint
bench_gpu saved, the same 64-token prompt, 128 new tokens sampled at T = 1, batch 1, 64 and 256; REPEATS timed decodes each, the median
reported.

usage: gpu_transformers.py MODEL_DIR PROMPT_IDS_JSON OUT_JSON
BATCHES (space-separated, default "1 64 256"): the batch sizes decoded. OUT_JSON is rewritten
after each, so a run cut short keeps the batches it finished.
"""
import json
import os
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM

model_dir, ids_json, out = sys.argv[1], sys.argv[2], sys.argv[3]
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
model.generation_config.eos_token_id = None
model.generation_config.pad_token_id = 0
prompt = json.load(open(ids_json))
res = {"gpu": torch.cuda.get_device_name(0)}
with torch.no_grad():
    for b in [int(b) for b in os.environ.get("BATCHES", "1 64 256").split()]:
        ids = torch.tensor([prompt] * b, device="cuda")
        kw = dict(attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_p=1.0, top_k=0)
        # Warm-up: the same decode in full (a first decode at a batch size runs slower).
        model.generate(ids, max_new_tokens=128, min_new_tokens=128, **kw)
        # REPEATS timed decodes (default 3): the median is the figure, every run is kept (one
        # timed decode per figure left a 20-30% spread at b256 unexplained).
        runs = []
        for _ in range(int(os.environ.get("REPEATS", "3"))):
            torch.cuda.synchronize()
            t = time.perf_counter()
            g = model.generate(ids, max_new_tokens=128, min_new_tokens=128, **kw)
            torch.cuda.synchronize()
            runs.append((g.shape[1] - len(prompt)) * b / (time.perf_counter() - t))
        res[f"transformers_decode_tok_s_b{b}"] = statistics.median(runs)
        res[f"transformers_decode_tok_s_b{b}_runs"] = runs
        json.dump(res, open(out, "w"))
json.dump(res, open(out, "w"))
print(json.dumps(res))
