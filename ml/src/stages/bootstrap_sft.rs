//! `bootstrap_sft`: trains the default world's tiny Qwen2 model from scratch on generated problems
//! with their worked solutions, so the RL stages have a policy without any model download.
//!
//! Each example is the chat prompt (`<|im_start|>user … <|im_end|>` + assistant header) followed by
//! the reference solution and `<|im_end|>`; the loss is next-token cross-entropy on the solution
//! tokens only. AdamW, linear warmup then cosine decay to `min_lr_ratio`, gradient clipping. After
//! training, greedy decoding on the first `eval_n` eval problems gives the accuracy recorded in the
//! run record (`metrics.eval_accuracy`). Deterministic for the same inputs, params and threads.
//!
//! `teacher_skip_rate` makes the teacher imperfect: that share of the demonstrations closes the
//! thinking before the last operation and answers the value reached so far. The quickstart uses it
//! so the SFT policy has a habit that RL can remove from the outcome reward alone (from a perfect
//! teacher's policy, 20 GRPO steps moved nothing measurable: README, "Does RL visibly learn").

use std::path::Path;

use anyhow::{bail, Context, Result};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rredcot::artifact::rows::PromptRow;
use rredcot::artifact::{read_rows, Schema};
use rredcot::engine::{Builtin, Executable, StageContext};
use rredcot::prompt_text::prompt_text;
use rredcot::stages::taskgen::solution_skipping_last_step;
use tch::nn::OptimizerConfig;
use tch::{nn, Device, Kind, Tensor};

pub use crate::train::lr_at;
use crate::model::{self, ChatMessage, ChatTemplate, DecoderLm, ModelConfig, SamplingParams, Tokenizer};

/// The stage's params (stages/bootstrap_sft.toml documents them); unknown or mistyped ones are
/// errors naming the stage and the param.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SftParams {
    seed: u64,
    device: model::DeviceChoice,
    dtype: model::DtypeChoice,
    threads: i64,
    layers: i64,
    hidden: i64,
    heads: i64,
    kv_heads: i64,
    intermediate: i64,
    max_len: i64,
    steps: usize,
    batch_size: usize,
    warmup_steps: usize,
    lr: f64,
    min_lr_ratio: f64,
    weight_decay: f64,
    grad_clip: f64,
    teacher_skip_rate: f64,
    eval_n: usize,
    eval_max_new_tokens: usize,
}

impl SftParams {
    /// Params that would not train, refused before anything is read, naming the param.
    fn check(&self) -> Result<()> {
        if self.steps == 0 || self.batch_size == 0 {
            bail!("bootstrap_sft: steps and batch_size must be positive");
        }
        if !matches!(self.dtype, model::DtypeChoice::F32 | model::DtypeChoice::Auto) {
            bail!("bootstrap_sft: dtype must be f32 or auto: the model trains in float32");
        }
        crate::train::OptimizerParams { lr: self.lr, min_lr_ratio: self.min_lr_ratio, weight_decay: self.weight_decay, grad_clip: self.grad_clip, adam: None }
            .check()
            .map_err(|e| anyhow::anyhow!("bootstrap_sft: {e}"))?;
        if !(0.0..=1.0).contains(&self.teacher_skip_rate) {
            bail!("bootstrap_sft: teacher_skip_rate must be in [0, 1], got {}", self.teacher_skip_rate);
        }
        // Each head takes hidden / heads dimensions; each key-value head serves heads / kv_heads.
        if self.heads <= 0 || self.kv_heads <= 0 || self.hidden % self.heads != 0 || self.heads % self.kv_heads != 0 {
            bail!("bootstrap_sft: hidden = {} must be a multiple of heads = {}, and heads of kv_heads = {}", self.hidden, self.heads, self.kv_heads);
        }
        Ok(())
    }
}

/// The Qwen2 config of the model trained here, from the stage's architecture params.
fn qwen2_config(p: &SftParams, tok: &Tokenizer) -> Result<ModelConfig> {
    let vocab = tok.vocab_size() as i64;
    let bos = tok.inner.token_to_id("<|im_start|>").map(i64::from);
    let json = serde_json::json!({
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "vocab_size": vocab,
        "hidden_size": p.hidden,
        "intermediate_size": p.intermediate,
        "num_hidden_layers": p.layers,
        "num_attention_heads": p.heads,
        "num_key_value_heads": p.kv_heads,
        "max_position_embeddings": p.max_len,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": true,
        "hidden_act": "silu",
        "bos_token_id": bos,
        "eos_token_id": tok.eos_ids.first().copied(),
        "torch_dtype": "float32",
    });
    Ok(ModelConfig::from_json_str(&json.to_string(), Path::new("<bootstrap_sft config>"))?)
}

/// Prompt ids and the ids of the solution (the trained part) of one problem.
fn encode_example(tok: &Tokenizer, row: &PromptRow) -> Result<(Vec<i64>, Vec<i64>)> {
    let prompt = tok.encode_chat(&[ChatMessage::new("user", &prompt_text(&row.prompt))], true)?;
    let solution = row
        .solution
        .as_deref()
        .filter(|s| !s.trim().is_empty())
        .with_context(|| format!("problem {}: no reference solution to train on", row.id))?;
    let target = tok.encode(&format!("{solution}<|im_end|>"))?;
    Ok((prompt, target))
}

/// One right-padded batch: input ids, targets shifted by one, and the loss mask (solution tokens).
fn batch_tensors(examples: &[&(Vec<i64>, Vec<i64>)], pad: i64, device: Device) -> (Tensor, Tensor, Tensor) {
    let len = examples.iter().map(|(p, t)| p.len() + t.len() - 1).max().unwrap_or(1);
    let (mut ids, mut targets, mut mask) = (Vec::new(), Vec::new(), Vec::new());
    for (p, t) in examples {
        let full: Vec<i64> = p.iter().chain(t.iter()).copied().collect();
        for i in 0..len {
            ids.push(*full.get(i).unwrap_or(&pad));
            targets.push(*full.get(i + 1).unwrap_or(&pad));
            // Position i predicts token i+1; train only where that token is part of the solution.
            mask.push(if i + 1 >= p.len() && i + 1 < full.len() { 1f32 } else { 0f32 });
        }
    }
    let b = examples.len() as i64;
    let shape = [b, len as i64];
    (
        Tensor::from_slice(&ids).view(shape).to(device),
        Tensor::from_slice(&targets).view(shape).to(device),
        Tensor::from_slice(&mask).view(shape).to(device),
    )
}

/// Mean cross-entropy over the masked positions.
fn masked_loss(model: &DecoderLm, ids: &Tensor, targets: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let logits = model.forward(ids, None, None)?;
    let logp = logits.log_softmax(-1, Kind::Float);
    let nll = -logp.gather(-1, &targets.unsqueeze(-1), false).squeeze_dim(-1);
    Ok((nll * mask).sum(Kind::Float) / mask.sum(Kind::Float).clamp_min(1.0))
}

/// Greedy accuracy of `model` on `rows` (answers checked with the math verifier).
pub fn greedy_accuracy(model: &DecoderLm, tok: &Tokenizer, rows: &[PromptRow], max_new_tokens: usize, batch: usize) -> Result<(f64, usize)> {
    let params = SamplingParams { temperature: 0.0, max_new_tokens, ..SamplingParams::default() };
    let mut correct = 0usize;
    let mut tokens = 0usize;
    for chunk in rows.chunks(batch.max(1)) {
        let prompts = chunk
            .iter()
            .map(|r| tok.encode_chat(&[ChatMessage::new("user", &prompt_text(&r.prompt))], true))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let seeds = vec![0u64; chunk.len()];
        let gens = model::generate(model, Some(tok), &prompts, &seeds, &params)?;
        for (row, g) in chunk.iter().zip(&gens) {
            tokens += g.tokens.len();
            let text = tok.decode(&g.tokens, true)?;
            let gold = row.answer.as_deref().with_context(|| format!("eval problem {}: no reference answer", row.id))?;
            // Judged like a rollout: the answer after the end of thinking.
            let cut = g.finish_reason == model::FinishReason::Length;
            if crate::sampling::split_answer(tok, crate::sampling::Thinking::Auto, gold, &g.tokens, &text, cut)?.verdict.correct {
                correct += 1;
            }
        }
    }
    Ok((correct as f64 / rows.len().max(1) as f64, tokens))
}

// Version 4: its greedy accuracy credits a cut completion only for a stated answer.
pub const STAGE: Builtin = Builtin { name: "bootstrap_sft", version: "4", runs_in: Executable::Worker, run };

pub fn run(ctx: &mut StageContext) -> Result<()> {
    let p: SftParams = ctx.params()?;
    let seed = p.seed;
    super::use_threads(p.threads);
    let (steps, batch_size, warmup, lr) = (p.steps, p.batch_size, p.warmup_steps, p.lr);
    let (min_lr_ratio, weight_decay, clip) = (p.min_lr_ratio, p.weight_decay, p.grad_clip);
    let (eval_n, eval_max_new) = (p.eval_n, p.eval_max_new_tokens);
    p.check()?;
    tch::manual_seed(seed as i64);
    let opts = model::LoadOptions { device: p.device, dtype: p.dtype };
    let device = opts.device()?;
    opts.apply_matmul_precision(device)?;

    let tok_dir = ctx.input("tokenizer")?.to_path_buf();
    let tok = Tokenizer::from_file(&tok_dir.join("tokenizer.json"), ChatTemplate::Qwen, vec![])?;
    let train_path = ctx.input("train")?.to_path_buf();
    let train: Vec<PromptRow> = read_rows(&train_path, Schema::Prompts)?;
    let eval: Vec<PromptRow> = read_rows(ctx.input("eval")?, Schema::Prompts)?;
    if train.is_empty() {
        bail!("{}: no training problems", train_path.display());
    }
    let skip_rate = p.teacher_skip_rate;
    // Which demonstrations skip their last step: fixed per row (the teacher's dataset), drawn
    // from its own stream so the rate does not change the batch order.
    let mut teacher_rng = ChaCha8Rng::seed_from_u64(seed);
    teacher_rng.set_stream(1);
    let mut examples = Vec::with_capacity(train.len());
    let mut too_long = 0i64;
    let mut flawed = 0i64;
    for (i, row) in train.iter().enumerate() {
        let flawed_row;
        let row = if skip_rate > 0.0 && teacher_rng.random_bool(skip_rate) {
            let solution = row.solution.as_deref().unwrap_or_default();
            let skipped = solution_skipping_last_step(solution).with_context(|| {
                format!("{} row {i} (problem {}): teacher_skip_rate needs taskgen's worked solutions with two or more steps, got {solution:?}", train_path.display(), row.id)
            })?;
            flawed += 1;
            flawed_row = PromptRow { solution: Some(skipped), ..row.clone() };
            &flawed_row
        } else {
            row
        };
        let ex = encode_example(&tok, row).with_context(|| format!("{}", train_path.display()))?;
        if (ex.0.len() + ex.1.len()) as i64 > p.max_len {
            too_long += 1;
            continue;
        }
        examples.push(ex);
    }
    ctx.count("examples_skipped_too_long", too_long);
    ctx.count("teacher_skipped_last_step", flawed);
    if examples.is_empty() {
        bail!("{}: every problem is longer than max_len = {} tokens", train_path.display(), p.max_len);
    }

    let cfg = qwen2_config(&p, &tok)?;
    // host: initialised from the CPU generator, then moved, so the same seed gives the same
    // initial weights on every device (CUDA has its own generator).
    let mut model = DecoderLm::new(&cfg, Device::Cpu);
    model.to_device(device);
    let mut opt = nn::AdamW { wd: weight_decay, ..Default::default() }.build(&model.vs, lr)?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut order: Vec<usize> = Vec::new();
    let mut progress = ctx.progress(steps as u64, "sft");
    let mut trained_tokens = 0i64;
    let mut last_loss = f64::NAN;
    let mut loss_log = Vec::new();
    for step in 0..steps {
        if order.len() < batch_size {
            let mut epoch: Vec<usize> = (0..examples.len()).collect();
            epoch.shuffle(&mut rng);
            order.extend(epoch);
        }
        let picked: Vec<&(Vec<i64>, Vec<i64>)> = order.drain(..batch_size).map(|i| &examples[i]).collect();
        let (ids, targets, mask) = batch_tensors(&picked, tok.pad_id, device);
        trained_tokens += picked.iter().map(|(_, target)| target.len() as i64).sum::<i64>();
        opt.set_lr(lr_at(step, steps, warmup, lr, min_lr_ratio));
        let loss = masked_loss(&model, &ids, &targets, &mask)?;
        let l = loss.double_value(&[]);
        if !l.is_finite() {
            bail!("bootstrap_sft: loss is {l} at step {step} (lr {lr}); lower `lr`");
        }
        opt.zero_grad();
        loss.backward();
        opt.clip_grad_norm(clip);
        opt.step();
        last_loss = l;
        if step % 10 == 0 || step + 1 == steps {
            loss_log.push(serde_json::json!([step, l]));
        }
        progress.set(step as u64 + 1, &format!("sft loss {l:.3}"));
    }
    ctx.count("tokens_trained", trained_tokens);
    ctx.metric("final_loss", last_loss);
    ctx.metric("loss_log", serde_json::Value::Array(loss_log));

    let eval_rows = &eval[..eval_n.min(eval.len())];
    let (acc, gen_tokens) = tch::no_grad(|| greedy_accuracy(&model, &tok, eval_rows, eval_max_new, 32))?;
    ctx.count("tokens_generated", gen_tokens as i64);
    ctx.metric("eval_accuracy", acc);
    ctx.metric("eval_problems", eval_rows.len() as i64);
    eprintln!("bootstrap_sft: final loss {last_loss:.4}, greedy accuracy {acc:.3} on {} eval problems", eval_rows.len());

    let out = ctx.output("model")?.to_path_buf();
    std::fs::create_dir_all(&out)?;
    model::save(&model, Some(&tok), &out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_params_are_what_the_stage_reads() {
        let shipped = super::super::tests::shipped_params("bootstrap_sft");
        let p: SftParams = rredcot::engine::context::parse_params("bootstrap_sft", &shipped).unwrap();
        assert_eq!((p.steps, p.eval_n), (600, 100));
        let mut typo = shipped.clone();
        typo.insert("warmup".into(), 3.into());
        let e = rredcot::engine::context::parse_params::<SftParams>("sft", &typo).unwrap_err().to_string();
        assert!(e.contains("unknown field `warmup`"), "{e}");
        let mut wrong = shipped;
        wrong.insert("steps".into(), "many".into());
        let e = rredcot::engine::context::parse_params::<SftParams>("sft", &wrong).unwrap_err().to_string();
        assert!(e.contains("stage `sft`: param `steps`"), "{e}");
    }

    /// What would not train is refused naming the param, before the first step (torch said
    /// "Invalid learning rate: -1" behind a C++ backtrace; min_lr_ratio 5 trained on). A warmup
    /// longer than a shortened run stays allowed: the rate ramps over the whole run.
    #[test]
    fn params_that_would_not_train_are_refused_naming_the_param() {
        let shipped = super::super::tests::shipped_params("bootstrap_sft");
        let check = |edits: &[(&str, serde_json::Value)]| {
            let mut p = shipped.clone();
            for (k, v) in edits {
                p.insert(k.to_string(), v.clone());
            }
            rredcot::engine::context::parse_params::<SftParams>("sft", &p).unwrap().check().map_err(|e| e.to_string())
        };
        assert_eq!(check(&[]), Ok(()));
        for (edits, says) in [
            (vec![("lr", (-1.0).into())], "param lr = -1 must be positive"),
            (vec![("lr", 0.0.into())], "param lr = 0 must be positive"),
            (vec![("weight_decay", (-1.0).into())], "param weight_decay = -1 is negative"),
            (vec![("grad_clip", (-1.0).into())], "param grad_clip = -1 is negative"),
            (vec![("min_lr_ratio", 5.0.into())], "param min_lr_ratio = 5 is outside [0, 1]"),
            (vec![("heads", 3.into()), ("hidden", 64.into())], "hidden = 64 must be a multiple of heads = 3"),
        ] {
            let e = check(&edits).unwrap_err();
            assert!(e.contains(says), "{edits:?}: {e}");
        }
    }

    #[test]
    fn lr_schedule_warms_up_then_decays_to_the_floor() {
        let (steps, warmup, lr) = (100, 10, 1e-3);
        assert!((lr_at(0, steps, warmup, lr, 0.1) - 1e-4).abs() < 1e-12);
        assert!((lr_at(9, steps, warmup, lr, 0.1) - lr).abs() < 1e-12);
        assert!((lr_at(10, steps, warmup, lr, 0.1) - lr).abs() < 1e-12);
        assert!((lr_at(100, steps, warmup, lr, 0.1) - 1e-4).abs() < 1e-12);
        let mid = lr_at(55, steps, warmup, lr, 0.1);
        assert!((mid - (1e-4 + 0.9e-3 * 0.5)).abs() < 1e-9, "{mid}");
    }

    #[test]
    fn batch_masks_exactly_the_solution_tokens() {
        let a = (vec![1, 2, 3], vec![7, 8]);
        let b = (vec![4], vec![9, 9, 9]);
        let (ids, targets, mask) = batch_tensors(&[&a, &b], 0, Device::Cpu);
        assert_eq!(ids.size(), vec![2, 4]);
        let ids: Vec<i64> = Vec::try_from(ids.flatten(0, -1)).unwrap();
        let targets: Vec<i64> = Vec::try_from(targets.flatten(0, -1)).unwrap();
        let mask: Vec<f32> = Vec::try_from(mask.flatten(0, -1)).unwrap();
        assert_eq!(ids, vec![1, 2, 3, 7, 4, 9, 9, 9]);
        assert_eq!(targets, vec![2, 3, 7, 8, 9, 9, 9, 0]);
        assert_eq!(mask, vec![0., 0., 1., 1., 1., 1., 1., 0.]);
    }
}
