"""TRL's own GRPO loss on a batch given by tests/trl_parity.rs.

  trl_ref.py BATCH_JSON OUT_JSON

BATCH_JSON: per-token log-probs `logp`, `old`, `ref`, `mask` ([B][T], float64), `adv` ([B]),
`epsilon_low`, `epsilon_high`, and `cases`: each a loss type, an importance-sampling level, a β,
TRL's `use_bias_correction_kl` (True by default in TRL 1.16: k3 × the IS ratio) and `steps`: the
optimizer steps the batch is split into, each a list of micro-batches, each a
list of row indices (all micro-batches the same size, as TRL's are).

For every case a real `trl.GRPOTrainer` is built (tiny random Qwen2 saved to a temp dir, policy
and reference loaded from it, a 1-row dataset, a constant reward) with `GRPOConfig(loss_type,
importance_sampling_level, beta, epsilon, epsilon_high, per_device_train_batch_size,
gradient_accumulation_steps, steps_per_generation)` matching the case's split. Each micro-batch
goes through `trainer.compute_loss` -> TRL's unmodified `_compute_loss`. The only thing replaced
is where the per-token log-probs come from: `_get_per_token_logps_and_entropies` returns rows of
one float64 leaf tensor (the batch's `logp`), so d loss / d logp is exactly the gradient TRL's
loss code gives for those log-probs. As in TRL's training loop, the gradients of the micro-batches
of an optimizer step are summed (GRPOTrainer.loss_is_scaled_for_ga is True: the Trainer does not
divide again), and `num_items_in_batch` is the generation batch's completion tokens (what
`_generate_and_score_completions` puts there).

OUT_JSON: per case, `losses` [step][micro], `grads` [step][B][T] (d step loss / d logp), and the
micro-batches' logged `kl` (mean k3 over tokens) and `clip_fraction` (TRL's clip_ratio/region_mean).
"""
import json
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import transformers  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402

import trl  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

torch.set_num_threads(1)


def tiny_model_dir(root):
    """A tiny random Qwen2 + word-level tokenizer saved locally (nothing is downloaded)."""
    vocab = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i + 2 for i in range(30)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    cfg = transformers.Qwen2Config(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                   pad_token_id=0, eos_token_id=1, bos_token_id=None)
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(root)
    fast.save_pretrained(root)
    return root


def constant_reward(completions, **kwargs):
    return [0.0] * len(completions)


def run_case(model_dir, out_dir, batch, case, logp_all):
    steps = case["steps"]
    micro_sizes = {len(mb) for step in steps for mb in step}
    ga_sizes = {len(step) for step in steps}
    if len(micro_sizes) != 1 or len(ga_sizes) != 1:
        raise SystemExit(f"case {case}: TRL needs equal micro-batches and equal steps")
    per_device, ga = micro_sizes.pop(), ga_sizes.pop()
    n_micro = sum(len(step) for step in steps)
    n_rows = len(batch["adv"])
    args = GRPOConfig(
        output_dir=out_dir, report_to="none", use_cpu=True, seed=0,
        loss_type=case["loss_type"], importance_sampling_level=case["importance_sampling"], beta=case["beta"],
        epsilon=batch["epsilon_low"], epsilon_high=batch["epsilon_high"],
        per_device_train_batch_size=per_device, gradient_accumulation_steps=ga, steps_per_generation=n_micro,
        num_generations=n_rows, max_completion_length=len(batch["mask"][0]), logging_steps=1,
        use_bias_correction_kl=case["use_bias_correction_kl"],
    )
    trainer = GRPOTrainer(model=model_dir, reward_funcs=constant_reward, args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["w1 w2"]}))
    assert trainer.loss_is_scaled_for_ga is True, "the Trainer would rescale the loss for accumulation"
    assert trainer.loss_type == case["loss_type"] and trainer.beta == case["beta"]
    assert trainer.importance_sampling_level == case["importance_sampling"]
    assert (trainer.beta == 0.0) == (trainer.ref_model is None)
    trainer.model.train()  # `_compute_loss` uses the training normalizers only in train mode
    # Set by the Trainer's loop before each optimizer step (the micro-batches it accumulates).
    trainer.current_gradient_accumulation_steps = ga

    def as_t(key, rows):
        return torch.tensor([batch[key][r] for r in rows], dtype=torch.float64)

    state = {}

    def logps_of_rows(model, input_ids, attention_mask, logits_to_keep, **kwargs):
        rows = state["rows"]
        lp = logp_all[rows]
        return lp, torch.zeros_like(lp.detach()), None

    trainer._get_per_token_logps_and_entropies = logps_of_rows
    mask_all = torch.tensor(batch["mask"], dtype=torch.float64)
    num_items = mask_all.sum()  # the generation batch's completion tokens
    losses, grads, kls, clips = [], [], [], []
    for step in steps:
        logp_all.grad = None
        step_losses, step_kl, step_clip = [], [], []
        for rows in step:
            state["rows"] = rows
            t = mask_all.shape[1]
            inputs = {
                "prompt_ids": torch.full((len(rows), 2), 2, dtype=torch.long),
                "prompt_mask": torch.ones((len(rows), 2), dtype=torch.long),
                "completion_ids": torch.full((len(rows), t), 3, dtype=torch.long),
                "completion_mask": as_t("mask", rows),
                "advantages": torch.tensor([batch["adv"][r] for r in rows], dtype=torch.float64),
                "old_per_token_logps": as_t("old", rows),
                "num_items_in_batch": num_items,
            }
            if case["beta"] != 0.0:
                inputs["ref_per_token_logps"] = as_t("ref", rows)
            loss = trainer.compute_loss(trainer.model, inputs)
            loss.backward()
            step_losses.append(loss.item())
            # The diagnostics TRL logs for this micro-batch.
            metrics = trainer._metrics["train"]
            step_kl.append(metrics["kl"][-1] if case["beta"] != 0.0 else 0.0)
            step_clip.append(metrics["clip_ratio/region_mean"][-1])
        losses.append(step_losses)
        kls.append(step_kl)
        clips.append(step_clip)
        grads.append(logp_all.grad.tolist())
    return {"losses": losses, "grads": grads, "kl": kls, "clip_fraction": clips}


def main(batch_path, out_path):
    batch = json.load(open(batch_path))
    with tempfile.TemporaryDirectory() as root:
        model_dir = tiny_model_dir(os.path.join(root, "tiny"))
        logp_all = torch.tensor(batch["logp"], dtype=torch.float64, requires_grad=True)
        results = [run_case(model_dir, os.path.join(root, "out"), batch, c, logp_all) for c in batch["cases"]]
    json.dump({"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
               "cases": results}, open(out_path, "w"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
