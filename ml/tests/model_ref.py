"""Reference outputs from Hugging Face transformers for tests/model_parity.rs.

  model_ref.py tiny  ARCH OUT     write a tiny random ARCH (qwen2|qwen3) checkpoint to OUT and its
                                  reference logits / greedy outputs (OUT/ref.json, OUT/logits.f32)
  model_ref.py gguf  GGUF OUT     dequantize GGUF with transformers+gguf into an HF dir OUT and
                                  write references for chat prompts
  model_ref.py logits DIR IDS_JSON OUT_F32   logits of DIR (loaded by transformers) for one prompt
"""
import json
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

torch.manual_seed(0)
torch.set_num_threads(2)


def refs(model, prompts, out, n_new=32):
    model.eval()
    # Greedy references run exactly n_new steps: no EOS stop (ours is asked for the same).
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    logits = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            logits.append(model(ids).logits[0].float().numpy())
        greedy = []
        for p in prompts:
            ids = torch.tensor([p])
            g = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=n_new)
            greedy.append(g[0, len(p):].tolist())
        # left-padded batch of all prompts
        L = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (L - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
        g = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n_new)
        batch_greedy = g[:, L:].tolist()
    flat = np.concatenate([l.reshape(-1) for l in logits]).astype("<f4")
    flat.tofile(f"{out}/logits.f32")
    json.dump({"prompts": prompts, "vocab": int(logits[0].shape[-1]), "greedy": greedy,
               "batch_greedy": batch_greedy, "transformers": transformers.__version__},
              open(f"{out}/ref.json", "w"))


def tiny(arch, out):
    common = dict(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-6, tie_word_embeddings=(arch == "qwen2"),
                  initializer_range=0.3, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if arch == "qwen2":
        cfg = transformers.Qwen2Config(rope_theta=10000.0, **common)
        model = transformers.Qwen2ForCausalLM(cfg)
        with torch.no_grad():  # biases are zero-initialised: make them matter
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.3)
    else:
        cfg = transformers.Qwen3Config(head_dim=24, rope_theta=1000000.0, **common)
        model = transformers.Qwen3ForCausalLM(cfg)
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
                layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n and "q_norm" not in n and "k_norm" not in n:
                p.uniform_(0.5, 1.5)
    # Qwen3 in shards (model.safetensors.index.json + several files): the sharded loading path.
    model.save_pretrained(out, max_shard_size=("100KB" if arch == "qwen3" else "5GB"))
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 96, (n,), generator=g).tolist() for n in (5, 9, 13)]
    refs(model, prompts, out)


def gguf(path, out):
    import os
    d, f = os.path.split(path)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    # transformers refuses save_pretrained on a GGUF-loaded model: write the dequantized float32
    # weights ourselves (tied lm_head written once, as save_pretrained does) and the config.
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    save_file(sd, f"{out}/model.safetensors", metadata={"format": "pt"})
    cfg = model.config.to_dict()
    for k in ("quantization_config", "_name_or_path"):
        cfg.pop(k, None)
    json.dump(cfg, open(f"{out}/config.json", "w"), indent=1)
    tok.save_pretrained(out)
    texts = ["What is 12 * 7? Think step by step.", "Write a haiku about the sea.",
             "List three prime numbers greater than 100."]
    prompts = [tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                       add_generation_prompt=True) for t in texts]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    refs(model, ids, out)
    r = json.load(open(f"{out}/ref.json"))
    r["texts"] = prompts
    json.dump(r, open(f"{out}/ref.json", "w"))


def logits(d, ids_json, out):
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    ids = torch.tensor([json.load(open(ids_json))])
    with torch.no_grad():
        model(ids).logits[0].float().numpy().astype("<f4").tofile(out)


# DeepSeek-R1-Distill's special tokens, in the order the Rust test adds them to the Qwen3 vocabulary.
R1_SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"]


def tokenize(d, texts_json, out, r1_template=None):
    """Qwen's tokenizer as transformers loads it: plain encodings and chat-template encodings
    (Qwen3's template in thinking mode, enable_thinking=True); with `r1_template` (a Jinja file),
    also DeepSeek-R1-Distill's template rendered over the same vocabulary plus R1's special tokens."""
    tok = AutoTokenizer.from_pretrained(d)
    texts = json.load(open(texts_json))
    chats = [[{"role": "user", "content": t}] for t in texts] + [
        [{"role": "system", "content": "Reason step by step."}, {"role": "user", "content": texts[0]}]]
    r = {
        "plain": [tok(t, add_special_tokens=False)["input_ids"] for t in texts],
        "chat": [tok.apply_chat_template(c, tokenize=True, add_generation_prompt=True, enable_thinking=True,
                                         return_dict=False) for c in chats],
        "chat_text": [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True, enable_thinking=True)
                      for c in chats],
        "chat_no_thinking": [tok.apply_chat_template(c, tokenize=True, add_generation_prompt=True, enable_thinking=False,
                                                     return_dict=False) for c in chats],
        "chats": chats,
    }
    if r1_template:
        template = open(r1_template).read()
        tok.add_tokens(R1_SPECIALS, special_tokens=True)
        tok.bos_token = R1_SPECIALS[0]
        r1_chats = chats + [[{"role": "system", "content": "S1"}, {"role": "system", "content": "S2"},
                             {"role": "user", "content": "2+2?"},
                             {"role": "assistant", "content": "<think>\n2+2=4\n</think>\n\nThe answer is 4."},
                             {"role": "user", "content": "And 3+3?"}]]
        r["r1_chats"] = r1_chats
        r["r1_text"] = [tok.apply_chat_template(c, chat_template=template, tokenize=False, add_generation_prompt=True)
                        for c in r1_chats]
        r["r1"] = [tok(t, add_special_tokens=False)["input_ids"] for t in r["r1_text"]]
        r["r1_special_ids"] = tok.convert_tokens_to_ids(R1_SPECIALS)
    json.dump(r, open(out, "w"))


def dequant(out):
    """Random blocks of each quant type (scales set to finite halves) and gguf's dequantization."""
    import gguf as g
    from gguf.quants import dequantize
    rng = np.random.default_rng(0)
    # type id, block elems, block bytes, byte offsets of f16 scale fields
    specs = {"Q4_0": (2, 32, 18, [0]), "Q4_1": (3, 32, 20, [0, 2]), "Q8_0": (8, 32, 34, [0]),
             "Q4_K": (12, 256, 144, [0, 2]), "Q6_K": (14, 256, 210, [208]), "F16": (1, 1, 2, [0])}
    meta = {}
    for name, (tid, be, bb, offs) in specs.items():
        nblocks = 64 if be > 1 else 512
        raw = rng.integers(0, 256, size=(nblocks, bb), dtype=np.uint8)
        for o in offs:
            halves = rng.uniform(-2, 2, size=nblocks).astype(np.float16)
            raw[:, o:o + 2] = halves.view(np.uint8).reshape(nblocks, 2)
        raw.tofile(f"{out}/{name}.bin")
        qt = g.GGMLQuantizationType[name]
        deq = dequantize(raw.reshape(1, -1), qt).reshape(-1).astype("<f4")
        deq.tofile(f"{out}/{name}.f32")
        meta[name] = {"type": tid, "n": int(deq.size)}
    json.dump(meta, open(f"{out}/dequant.json", "w"))


if __name__ == "__main__":
    cmd = sys.argv[1]
    {"tiny": tiny, "gguf": gguf, "logits": logits, "dequant": dequant, "tokenize": tokenize}[cmd](*sys.argv[2:])
