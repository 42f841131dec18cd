"""Baseline half of bench/model.sh: transformers `generate` (eager attention, float32, CPU) on the
SmolLM2 GGUF, greedy, batch 1 and 8, 128 new tokens; plus reference logits for a parity check.

usage: model_transformers.py GGUF PROMPT_IDS_JSON OUT_DIR THREADS
"""
import json
import os
import resource
import sys
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM

gguf_path, ids_json, out, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
torch.set_num_threads(threads)
d, f = os.path.split(gguf_path)
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                             attn_implementation="eager").eval()
model.generation_config.eos_token_id = None
model.generation_config.pad_token_id = 0
prompt = json.load(open(ids_json))
res = {}
with torch.no_grad():
    model(torch.tensor([prompt])).logits[0].float().numpy().astype("<f4").tofile(f"{out}/ref_logits.f32")
    for b in (1, 8):
        ids = torch.tensor([prompt] * b)
        model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=4)
        t = time.perf_counter()
        g = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=128)
        dt = time.perf_counter() - t
        n = (g.shape[1] - len(prompt)) * b
        res[f"transformers_decode_tok_s_b{b}"] = n / dt
        if b == 1:
            res["transformers_greedy_b1"] = g[0, len(prompt):].tolist()
res["transformers_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
json.dump(res, open(f"{out}/transformers.json", "w"))
print(json.dumps({k: v for k, v in res.items() if "greedy" not in k}))
