#!/usr/bin/env bash
# Checkpoint I/O on the host: loading a bf16 Hugging Face checkpoint into a float32 model,
# saving it, and restoring an AdamW state (float32 first and second moments), each in a process
# of its own, rredcot's way (memory-mapped reads, tensors copied out one at a time as the writer
# reaches them) beside the way it did before (whole files read into memory; every tensor copied
# to a host buffer before writing; tch's read_safetensors for the moments), alternating, REPS
# times. The checkpoint has the Qwen2 shape of SHAPE (0.5b: Qwen2.5-0.5B, 494 M parameters; 1.5b:
# DeepSeek-R1-Distill-Qwen-1.5B, whose moments take 14 GB and whose baseline restore needs 28 GB),
# random weights. ml/examples/bench_checkpoint_io.rs holds both ways.
# Writes bench/results/checkpoint_io.json.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/env.sh
REPS=${REPS:-3}
SHAPE=${SHAPE:-0.5b}
cargo build --release -p rredcot-ml --example bench_checkpoint_io
BIN=./target/release/examples/bench_checkpoint_io
$PY - "$TMP" "$SHAPE" <<'PYEOF'
import json, os, sys, torch
from safetensors.torch import save_file
tmp, shape = sys.argv[1], sys.argv[2]
H, I, L, heads, kv, tied = {"0.5b": (896, 4864, 24, 14, 2, True), "1.5b": (1536, 8960, 28, 12, 2, False)}[shape]
V, hd = 151936, H // heads
cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": V, "hidden_size": H,
       "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": heads, "num_key_value_heads": kv,
       "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": tied,
       "bos_token_id": 151643, "eos_token_id": 151643, "torch_dtype": "bfloat16"}
shapes = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
if not tied:
    shapes["lm_head.weight"] = (V, H)
for i in range(L):
    p = f"model.layers.{i}."
    shapes.update({p + "self_attn.q_proj.weight": (H, H), p + "self_attn.q_proj.bias": (H,),
                   p + "self_attn.k_proj.weight": (kv * hd, H), p + "self_attn.k_proj.bias": (kv * hd,),
                   p + "self_attn.v_proj.weight": (kv * hd, H), p + "self_attn.v_proj.bias": (kv * hd,),
                   p + "self_attn.o_proj.weight": (H, H), p + "mlp.gate_proj.weight": (I, H),
                   p + "mlp.up_proj.weight": (I, H), p + "mlp.down_proj.weight": (H, I),
                   p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,)})
g = torch.Generator().manual_seed(0)
os.makedirs(f"{tmp}/model"); os.makedirs(f"{tmp}/adamw")
json.dump(cfg, open(f"{tmp}/model/config.json", "w"))
save_file({n: (torch.randn(*s, generator=g) * 0.02).to(torch.bfloat16) for n, s in shapes.items()},
          f"{tmp}/model/model.safetensors", metadata={"format": "pt"})
moments = {}
for n, s in shapes.items():
    moments["m." + n] = torch.randn(*s, generator=g) * 1e-3
    moments["v." + n] = torch.rand(*s, generator=g) * 1e-6
save_file(moments, f"{tmp}/adamw/moments.safetensors")
del moments
json.dump({"cfg": {"beta1": 0.9, "beta2": 0.99, "eps": 1e-8, "weight_decay": 0.0}, "t": 1}, open(f"{tmp}/adamw/adamw.json", "w"))
print(f"{shape}: {sum(torch.Size(s).numel() for s in shapes.values()) / 1e6:.0f} M parameters")
PYEOF
: >"$TMP/lines"
for i in $(seq 1 "$REPS"); do
  for mode in read mapped; do "$BIN" load "$TMP/model" $mode | tee -a "$TMP/lines"; done
  for mode in copied streamed; do rm -rf "$TMP/out"; "$BIN" save "$TMP/model" "$TMP/out" $mode | tee -a "$TMP/lines"; done
  for mode in read mapped; do "$BIN" adamw "$TMP/adamw" $mode | tee -a "$TMP/lines"; done
done
$PY - "$TMP" "$SHAPE" "$REPS" <<'PYEOF'
import json, os, statistics, sys
tmp, shape, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
lines = [json.loads(l) for l in open(os.path.join(tmp, "lines"))]
gb = lambda p: os.path.getsize(p) / 2**30
res = {"command": "bash bench/checkpoint_io.sh" + ("" if shape == "0.5b" else f" (SHAPE={shape})"),
       "shape": shape, "checkpoint_gb": gb(f"{tmp}/model/model.safetensors"),
       "moments_gb": gb(f"{tmp}/adamw/moments.safetensors"),
       "machine": f"{os.cpu_count()} CPUs, release build, files in the page cache",
       "note": "one operation per process, medians of the reps; peak_anon_mb: the largest anonymous resident memory "
               "(sampled every 2 ms; save: during the save, the model loaded before, anon_before_mb), the memory taken "
               "from everything else; peak_rss_mb: VmHWM, which also counts mapped pages of the page cache; baseline = rredcot before: load and restore read each file whole into "
               "memory (restore through tch's read_safetensors, which also makes every tensor on the host before any "
               "is used), save copied every tensor to a host buffer before writing"}
for op, base, new in [("load", "read", "mapped"), ("save", "copied", "streamed"), ("adamw", "read", "mapped")]:
    row = {}
    for mode in (base, new):
        xs = [l for l in lines if l["op"] == op and l["mode"] == mode]
        row[mode] = {k: statistics.median(x[k] for x in xs) for k in xs[0] if k not in ("op", "mode")}
    row["time_ratio"] = row[new]["seconds"] / row[base]["seconds"]
    row["peak_anon_saved_mb"] = row[base]["peak_anon_mb"] - row[new]["peak_anon_mb"]
    res[op] = row
json.dump(res, open("bench/results/checkpoint_io.json", "w"), indent=2, sort_keys=True)
print(json.dumps(res, indent=2, sort_keys=True))
PYEOF
