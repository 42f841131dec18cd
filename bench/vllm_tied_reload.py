# Why vLLM 0.32's CPU build reloads a tied-embedding model wrong (README, "Keeping the engine
# across a chain's steps"): two random tied Qwen2 checkpoints A and B; an engine started over A
# and reloaded in place with B (`reload_weights`, as `reload = "vllm"` asks it) greedily samples
# neither A's nor B's tokens; packing its head again (`process_weights_after_loading`, which the
# reload skips for a head that loads no weights of its own) makes it sample B's exactly.
# usage: env -u LD_LIBRARY_PATH .venv-vllm/bin/python bench/vllm_tied_reload.py [DIR]
# (bench/engines_vllm.sh installs .venv-vllm). Prints the three comparisons; exit 0 when the
# mechanism is as README says.
import os, sys, tempfile
OWN_DIR = len(sys.argv) < 2
DIR = tempfile.mkdtemp() if OWN_DIR else sys.argv[1]
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
def make(path, seed):
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      tie_word_embeddings=True)
    m = Qwen2ForCausalLM(cfg)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.5)
    m.save_pretrained(path)
make(f"{DIR}/A", 1)
make(f"{DIR}/B", 2)
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
sp = SamplingParams(max_tokens=12, temperature=0, logprobs=0)
prompts = [TokensPrompt(prompt_token_ids=[1, 2, 3, 4, 5]), TokensPrompt(prompt_token_ids=[9, 8, 7])]
def gen(llm):
    return [(o.outputs[0].token_ids, [round(list(d.values())[0].logprob, 4) for d in o.outputs[0].logprobs]) for o in llm.generate(prompts, sp, use_tqdm=False)]
llm = LLM(model=f"{DIR}/A", dtype="float32", enforce_eager=True, seed=0, skip_tokenizer_init=True, max_num_seqs=4)
a = gen(llm)
llm.collective_rpc("reload_weights", kwargs={"weights_path": f"{DIR}/B", "is_checkpoint_format": True})
after = gen(llm)
def repack(worker):
    m = worker.model_runner.model
    m.lm_head.quant_method.process_weights_after_loading(m.lm_head)
    return type(m.lm_head).__name__
print("repacked", llm.collective_rpc(repack))
repacked = gen(llm)
del llm
import gc; gc.collect()
llm = LLM(model=f"{DIR}/B", dtype="float32", enforce_eager=True, seed=0, skip_tokenizer_init=True, max_num_seqs=4)
b = gen(llm)
print("A         ", a[0])
print("B fresh   ", b[0])
print("A->B      ", after[0])
print("repacked  ", repacked[0])
print("after == B:", after == b, " repacked == B:", repacked == b, " after == A:", after == a)
if OWN_DIR:
    import shutil
    shutil.rmtree(DIR)
sys.exit(0 if (not after == b and not after == a and repacked == b) else 1)
