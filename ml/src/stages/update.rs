//! `update`: one training step of the policy on the rollouts of that step (paper Eq. 11–12).
//!
//! Advantages are group-normalized outcome rewards ([`rredcot::credit::weights::advantages`]).
//! Each completion's credit is uniform 1/|o| (`credit = "uniform"`, GRPO) or σ_t/|u_t| from the
//! `scores` and `segments` inputs (`credit = "sigma"`, RREDCoT), mixed by `sigma_mix`; segments
//! cover the chain of thought only, and the answer tokens after it keep GRPO's 1/|o| (a trace
//! left unsegmented because its thinking never closed trains with uniform weights). With
//! `credit = "progress"` (seed 002) the credit stays uniform and the *advantage* is per token: the
//! outcome advantage plus `progress_coef` × the prover's progress Δ_t of the token's step (from
//! `score_progress` values), times the token's entropy normalized over its step, mixed by
//! `entropy_mix` ([`rredcot::credit::progress`]). Each row's credit is
//! [`rredcot::credit::builder::token_credit`]; the loss is [`crate::train::loss::policy_loss`];
//! the forward and backward ([`crate::train::step::TrainModel`]: precision, checkpointing) run
//! `inner_epochs` × minibatches optimizer steps of the resumable AdamW, each accumulated over
//! micro-batches (so a batch larger than memory works), with a warmup + cosine schedule over the
//! whole run (`step` of `total_steps`, usually `"{step}"` / `"{repeat}"` in a chain) and
//! gradient clipping.
//!
//! Outputs: the next policy (HF checkpoint with tokenizer), the optimizer state, and a `metrics`
//! table with one row per optimizer step. Deterministic for the same inputs, params and threads.

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use rredcot::artifact::rows::{PromptRow, RolloutRow, ScoreRow, SegmentRow};
use rredcot::artifact::{read_rows, write_rows, Schema};
use rredcot::credit::segmentation::checked_ends;
use rredcot::credit::builder::{token_credit, CreditSource, TokenCredit};
use rredcot::credit::weights::{advantages, ScaleRewards};
use rredcot::engine::{Builtin, Executable, StageContext};
use serde::Serialize;
use tch::{Device, Kind, Tensor};

use super::{load_policy_f32, use_threads};
use crate::traces::encode_prompt;
use crate::model::{self, DeviceChoice, LoadOptions};
use crate::train::adamw::{clip_grads, grad_norm, AdamW, AdamWConfig};
use crate::train::loss::{check_credit_with_is, dapo_tokens_per_step, policy_loss, sequence_factors, IsLevel, LossConfig, LossType};
use crate::train::lr_at;
use crate::train::step::{token_logprobs, TrainDtype, TrainModel};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum Credit {
    Uniform,
    Sigma,
    Progress,
}

/// One completion ready for the loss.
struct Sequence {
    /// Prompt + completion token ids.
    ids: Vec<i64>,
    prompt_len: usize,
    /// Per completion token share of the sequence's credit (sums to 1).
    credit: Vec<f64>,
    /// Per completion token advantage (the sequence's outcome advantage unless `progress`).
    advantage: Vec<f64>,
    reward: f64,
    sigma_entropy: Option<f64>,
}

impl Sequence {
    fn completion_len(&self) -> usize {
        self.ids.len() - self.prompt_len
    }
}

/// One row of the `metrics` output.
#[derive(Debug, Serialize)]
struct MetricsRow {
    train_step: i64,
    opt_step: i64,
    epoch: i64,
    minibatch: i64,
    loss: f64,
    kl: f64,
    clip_fraction: f64,
    grad_norm: f64,
    lr: f64,
    mean_reward: f64,
    mean_sigma_entropy: f64,
    sequences: i64,
    tokens: i64,
}

/// Right-padded tensors of a micro-batch: ids `[B, L]`, and over completion positions (the
/// targets `ids[:, 1:]`) the mask, credit and advantages `[B, L-1]`.
fn micro_tensors(seqs: &[&Sequence], device: Device) -> (Tensor, Tensor, Tensor, Tensor) {
    let len = seqs.iter().map(|s| s.ids.len()).max().unwrap_or(1);
    let (mut ids, mut mask, mut credit, mut adv) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for s in seqs {
        for i in 0..len {
            ids.push(*s.ids.get(i).unwrap_or(&0));
        }
        // Position i predicts token i + 1; completion tokens start at prompt_len.
        for i in 0..len - 1 {
            let tok = i + 1;
            let inside = tok >= s.prompt_len && tok < s.ids.len();
            mask.push(if inside { 1f32 } else { 0f32 });
            credit.push(if inside { s.credit[tok - s.prompt_len] as f32 } else { 0f32 });
            adv.push(if inside { s.advantage[tok - s.prompt_len] as f32 } else { 0f32 });
        }
    }
    let b = seqs.len() as i64;
    (
        Tensor::from_slice(&ids).view([b, len as i64]).to_device(device),
        Tensor::from_slice(&mask).view([b, len as i64 - 1]).to_device(device),
        Tensor::from_slice(&credit).view([b, len as i64 - 1]).to_device(device),
        Tensor::from_slice(&adv).view([b, len as i64 - 1]).to_device(device),
    )
}

/// Params of `update`, `update_rredcot` and `update_progress` (defaults and their docs:
/// `stages/update.toml` and the files that extend it).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateParams {
    seed: i64,
    credit: Credit,
    sigma_mix: f64,
    scale_rewards: ScaleRewards,
    reward_eps: f64,
    loss_type: LossType,
    importance_sampling: IsLevel,
    epsilon_low: f64,
    epsilon_high: f64,
    beta: f64,
    kl_bias_correction: bool,
    temperature: f64,
    max_completion_length: usize,
    inner_epochs: usize,
    minibatch_size: usize,
    micro_batch_size: usize,
    step: usize,
    total_steps: usize,
    lr: f64,
    warmup_steps: usize,
    min_lr_ratio: f64,
    weight_decay: f64,
    grad_clip: f64,
    adam_beta1: f64,
    adam_beta2: f64,
    adam_eps: f64,
    allow_off_policy: bool,
    device: DeviceChoice,
    dtype: TrainDtype,
    gradient_checkpointing: bool,
    threads: i64,
    /// `update_progress` only.
    progress_coef: Option<f64>,
    entropy_mix: Option<f64>,
}

impl Credit {
    fn name(self) -> &'static str {
        match self {
            Credit::Uniform => "uniform",
            Credit::Sigma => "sigma",
            Credit::Progress => "progress",
        }
    }
}

pub const STAGE: Builtin = Builtin { name: "update", version: "2", runs_in: Executable::Worker, run };

pub fn run(ctx: &mut StageContext) -> Result<()> {
    let p: UpdateParams = ctx.params()?;
    use_threads(p.threads);
    tch::manual_seed(p.seed);
    let (credit_kind, sigma_mix, scale) = (p.credit, p.sigma_mix, p.scale_rewards);
    let loss_cfg = LossConfig {
        loss_type: p.loss_type,
        importance_sampling: p.importance_sampling,
        epsilon_low: p.epsilon_low,
        epsilon_high: p.epsilon_high,
        beta: p.beta,
        kl_bias_correction: p.kl_bias_correction,
    };
    let (temperature, max_completion, inner_epochs) = (p.temperature, p.max_completion_length, p.inner_epochs);
    let (minibatch, micro) = (p.minibatch_size, p.micro_batch_size);
    let (train_step, total_steps) = (p.step, p.total_steps);
    let (lr, warmup, min_ratio, clip) = (p.lr, p.warmup_steps, p.min_lr_ratio, p.grad_clip);
    let adam = AdamWConfig { beta1: p.adam_beta1, beta2: p.adam_beta2, eps: p.adam_eps, weight_decay: p.weight_decay };
    let allow_off_policy = p.allow_off_policy;
    if inner_epochs == 0 || micro == 0 || temperature <= 0.0 || total_steps == 0 {
        bail!("stage `{}`: inner_epochs, micro_batch_size, temperature and total_steps must be positive", ctx.instance);
    }
    if !(0.0..=1.0).contains(&sigma_mix) {
        bail!("stage `{}`: sigma_mix = {sigma_mix} is outside [0, 1]", ctx.instance);
    }
    let credit_name = credit_kind.name();
    let uniform = credit_kind == Credit::Uniform || (credit_kind == Credit::Sigma && sigma_mix == 0.0);
    check_credit_with_is(loss_cfg.importance_sampling, credit_name, uniform).map_err(|e| anyhow::anyhow!("stage `{}`: {e}", ctx.instance))?;

    // Inputs.
    let prompts: Vec<PromptRow> = read_rows(ctx.input("prompts")?, Schema::Prompts)?;
    let rollouts_path = ctx.input("rollouts")?.to_path_buf();
    let rollouts: Vec<RolloutRow> = read_rows(&rollouts_path, Schema::Rollouts)?;
    if rollouts.is_empty() {
        bail!("{}: no rollouts to train on", rollouts_path.display());
    }
    let policy_hash = ctx.input_hash("policy")?.to_string();
    if let Some(r) = rollouts.iter().find(|r| r.policy_ckpt != policy_hash).filter(|_| !allow_off_policy) {
        bail!(
            "{}: rollout (prompt {}, sample {}) was sampled from checkpoint {} but the policy input is {} (on-policy update; set allow_off_policy = true to train anyway)",
            rollouts_path.display(), r.prompt_id, r.sample_idx, &r.policy_ckpt[..12.min(r.policy_ckpt.len())], &policy_hash[..12]
        );
    }
    // Only the progress kind (update_progress) declares these.
    let (progress_coef, entropy_mix) = match (credit_kind, p.progress_coef, p.entropy_mix) {
        (Credit::Progress, Some(c), Some(m)) => (c, m),
        (Credit::Progress, _, _) => bail!("stage `{}`: credit = \"progress\" needs params progress_coef and entropy_mix", ctx.instance),
        _ => (0.0, 0.0),
    };
    if !(0.0..=1.0).contains(&entropy_mix) || !progress_coef.is_finite() {
        bail!("stage `{}`: entropy_mix = {entropy_mix} must be in [0, 1] and progress_coef finite", ctx.instance);
    }
    let scores_of: HashMap<(String, i32), (ScoreRow, SegmentRow)> = if credit_kind != Credit::Uniform {
        let scores: Vec<ScoreRow> = read_rows(ctx.input("scores")?, Schema::Scores)?;
        let segs: Vec<SegmentRow> = read_rows(ctx.input("segments")?, Schema::Segments)?;
        let mut by: HashMap<(String, i32), SegmentRow> = segs.into_iter().map(|s| ((s.prompt_id.clone(), s.sample_idx), s)).collect();
        scores
            .into_iter()
            .filter_map(|sc| by.remove(&(sc.prompt_id.clone(), sc.sample_idx)).map(|sg| ((sc.prompt_id.clone(), sc.sample_idx), (sc, sg))))
            .collect()
    } else {
        HashMap::new()
    };
    // Float32 master weights whatever `dtype` says (it sets the compute precision).
    let (model, tok) = load_policy_f32(ctx, "policy", p.device)?;
    let device = model.device();
    let context = model.cfg.max_position_embeddings as usize;
    let by_id: HashMap<&str, &PromptRow> = prompts.iter().map(|p| (p.id.as_str(), p)).collect();

    // Advantages over groups of the same prompt.
    let mut group_of: HashMap<&str, usize> = HashMap::new();
    let groups: Vec<usize> = rollouts.iter().map(|r| { let n = group_of.len(); *group_of.entry(r.prompt_id.as_str()).or_insert(n) }).collect();
    let rewards: Vec<f64> = rollouts.iter().map(|r| r.reward).collect();
    if let Some(i) = rewards.iter().position(|r| !r.is_finite()) {
        bail!("{} row {i}: reward is {}", rollouts_path.display(), rewards[i]);
    }
    let (adv, flat_groups) = advantages(&rewards, &groups, scale, p.reward_eps);
    ctx.count("groups", group_of.len() as i64);
    ctx.count("groups_all_rewards_equal", flat_groups as i64);

    let mut seqs = Vec::with_capacity(rollouts.len());
    let (mut empty, mut unclosed_uniform) = (0i64, 0i64);
    for (i, r) in rollouts.iter().enumerate() {
        let at = || format!("{} row {i} (prompt {}, sample {})", rollouts_path.display(), r.prompt_id, r.sample_idx);
        let n = r.completion_ids.len();
        if n == 0 {
            empty += 1;
            continue;
        }
        let prompt = by_id.get(r.prompt_id.as_str()).with_context(|| format!("{}: prompt not in the wired prompts", at()))?;
        let pids = encode_prompt(&tok, prompt).with_context(at)?;
        if pids.len() + n > context {
            bail!("{}: prompt + completion = {} tokens exceed the policy's context of {context}", at(), pids.len() + n);
        }
        if let Some(bad) = r.completion_ids.iter().find(|&&t| t < 0 || t as i64 >= model.cfg.vocab_size) {
            bail!("{}: token id {bad} outside the policy's vocabulary ({}): rollouts and checkpoint disagree", at(), model.cfg.vocab_size);
        }
        let scored = || -> Result<(&ScoreRow, Vec<usize>)> {
            let (sc, sg) = scores_of
                .get(&(r.prompt_id.clone(), r.sample_idx))
                .with_context(|| format!("{}: no score/segments row for this rollout", at()))?;
            // Segments tile the chain of thought; a malformed row is an error here, not a panic
            // in token_weights.
            let ends = checked_ends(&sg.seg_starts, &sg.seg_ends, r.cot_len()).map_err(|e| anyhow::anyhow!("{}: {e}", at()))?;
            Ok((sc, ends))
        };
        // A trace whose thinking never closed and that `segment` skipped (on_unclosed = "skip")
        // has no credit scores: it trains with GRPO's uniform weights, counted.
        let unscored = credit_kind != Credit::Uniform && r.cot_end.is_none() && !scores_of.contains_key(&(r.prompt_id.clone(), r.sample_idx));
        unclosed_uniform += unscored as i64;
        let scored_row = if credit_kind != Credit::Uniform && !unscored { Some(scored()?) } else { None };
        let source = match (credit_kind, &scored_row) {
            (Credit::Sigma, Some((sc, ends))) => CreditSource::Sigma { sigma: &sc.sigma, ends, mix: sigma_mix },
            (Credit::Progress, Some((sc, ends))) => {
                CreditSource::Progress { values: &sc.r, ends, entropies: &r.entropies, coef: progress_coef, entropy_mix }
            }
            _ => CreditSource::Uniform,
        };
        let TokenCredit { weights: credit, advantages: advantage, sigma_entropy } =
            token_credit(n, adv[i], source).map_err(|e| anyhow::anyhow!("{}: {e}", at()))?;
        seqs.push(Sequence {
            ids: pids.iter().copied().chain(r.completion_ids.iter().map(|&t| t as i64)).collect(),
            prompt_len: pids.len(),
            credit,
            advantage,
            reward: r.reward,
            sigma_entropy,
        });
    }
    ctx.count("empty_completions_skipped", empty);
    ctx.count("unclosed_uniform_credit", unclosed_uniform);
    if seqs.is_empty() {
        bail!("{}: every rollout has an empty completion; nothing to train on", rollouts_path.display());
    }

    let reference = if loss_cfg.beta > 0.0 {
        let path = ctx.input("reference")?;
        // On the policy's device (not `auto`: device = "cpu" on a CUDA host put it on the GPU).
        let opts = LoadOptions { device: DeviceChoice::of(device), dtype: model::DtypeChoice::F32 };
        Some(model::load(path, &opts).with_context(|| format!("loading the reference policy {}", path.display()))?.model)
    } else {
        None
    };

    let mb_size = if minibatch == 0 { seqs.len() } else { minibatch };
    let minibatches: Vec<&[Sequence]> = seqs.chunks(mb_size).collect();
    let steps_per_update = inner_epochs * minibatches.len();
    // dapo's normalizer as in TRL: the batch's completion tokens over its optimizer steps per epoch.
    let dapo_tokens = dapo_tokens_per_step(seqs.iter().map(|s| s.completion_len()).sum(), minibatches.len());
    let train = TrainModel::new(model, p.dtype, p.gradient_checkpointing);
    let params = train.params();
    let opt_dir = ctx.input("optimizer")?.to_path_buf();
    let mut opt = AdamW::load_or_new(&opt_dir, adam, device)?;

    // Old log-probs (π_old = the policy before this update) are only needed when the policy moves
    // within the update; with one step, π_old = π detached (ratio 1), as in TRL.
    let needs_old = steps_per_update > 1;
    let micro_batches = |mb: &[Sequence]| -> Vec<Vec<usize>> {
        (0..mb.len()).collect::<Vec<_>>().chunks(micro).map(|c| c.to_vec()).collect()
    };
    let mut old_logps: Vec<Vec<Tensor>> = Vec::new();
    let mut ref_logps: Vec<Vec<Option<Tensor>>> = Vec::new();
    for mb in &minibatches {
        let (mut olds, mut refs) = (Vec::new(), Vec::new());
        for idx in micro_batches(mb) {
            let picked: Vec<&Sequence> = idx.iter().map(|&i| &mb[i]).collect();
            let (ids, _, _, _) = micro_tensors(&picked, device);
            olds.push(if needs_old { tch::no_grad(|| train.token_logprobs(&ids, temperature))? } else { Tensor::new() });
            refs.push(match &reference {
                Some(r) => Some(tch::no_grad(|| token_logprobs(r, &ids, temperature))?),
                None => None,
            });
        }
        old_logps.push(olds);
        ref_logps.push(refs);
    }

    let mut metrics = Vec::new();
    let mut progress = ctx.progress(steps_per_update as u64, "update");
    for epoch in 0..inner_epochs {
        for (mbi, mb) in minibatches.iter().enumerate() {
            let opt_step = epoch * minibatches.len() + mbi;
            let global = train_step * steps_per_update + opt_step;
            let step_lr = lr_at(global, total_steps * steps_per_update, warmup, lr, min_ratio);
            let parts_idx = micro_batches(mb);
            let lens: Vec<Vec<usize>> = parts_idx.iter().map(|idx| idx.iter().map(|&i| mb[i].completion_len()).collect()).collect();
            let factors = sequence_factors(loss_cfg.loss_type, &lens, max_completion, Some(dapo_tokens));
            train.zero_grad();
            let (mut loss_sum, mut kl_sum, mut clip_sum, mut tokens) = (0.0, 0.0, 0.0, 0i64);
            for (k, idx) in parts_idx.iter().enumerate() {
                let picked: Vec<&Sequence> = idx.iter().map(|&i| &mb[i]).collect();
                let (ids, mask, credit, adv_t) = micro_tensors(&picked, device);
                let f_t = Tensor::from_slice(&factors[k].iter().map(|&f| f as f32).collect::<Vec<_>>()).to_device(device);
                let (l, kl, clip_fraction) = train.backward(&ids, temperature, |logp| {
                    let old = if needs_old { old_logps[mbi][k].shallow_clone() } else { logp.detach() };
                    let parts = policy_loss(&loss_cfg, logp, &old, ref_logps[mbi][k].as_ref(), &adv_t, &credit, &f_t, &mask);
                    let l = parts.loss.double_value(&[]);
                    if !l.is_finite() {
                        bail!(
                            "update step {train_step}: loss is {l} in optimizer step {opt_step}, micro-batch {k} (lr {step_lr:.3e}); nothing was saved"
                        );
                    }
                    Ok((parts.loss, (l, parts.kl, parts.clip_fraction)))
                })?;
                let n_tok = mask.sum(Kind::Float).double_value(&[]);
                loss_sum += l;
                kl_sum += kl * n_tok;
                clip_sum += clip_fraction * n_tok;
                tokens += n_tok as i64;
            }
            let norm = grad_norm(params).map_err(|name| {
                anyhow::anyhow!("update step {train_step}: gradient of `{name}` is not finite in optimizer step {opt_step} (lr {step_lr:.3e}); nothing was saved")
            })?;
            clip_grads(params, norm, clip);
            opt.step(params, step_lr)?;
            train.weights_changed();
            let sig: Vec<f64> = mb.iter().filter_map(|s| s.sigma_entropy).collect();
            metrics.push(MetricsRow {
                train_step: train_step as i64,
                opt_step: opt_step as i64,
                epoch: epoch as i64,
                minibatch: mbi as i64,
                loss: loss_sum,
                kl: kl_sum / tokens.max(1) as f64,
                clip_fraction: clip_sum / tokens.max(1) as f64,
                grad_norm: norm,
                lr: step_lr,
                mean_reward: mb.iter().map(|s| s.reward).sum::<f64>() / mb.len() as f64,
                mean_sigma_entropy: if sig.is_empty() { f64::NAN } else { sig.iter().sum::<f64>() / sig.len() as f64 },
                sequences: mb.len() as i64,
                tokens,
            });
            progress.set(opt_step as u64 + 1, &format!("update loss {loss_sum:.4} |g| {norm:.3}"));
        }
    }
    progress.finish();
    let last = metrics.last().expect("at least one optimizer step");
    ctx.metric("loss", last.loss);
    ctx.metric("grad_norm", last.grad_norm);
    ctx.metric("kl", last.kl);
    ctx.metric("clip_fraction", last.clip_fraction);
    ctx.metric("lr", last.lr);
    ctx.metric("mean_reward", rewards.iter().sum::<f64>() / rewards.len() as f64);
    ctx.count("optimizer_steps", metrics.len() as i64);
    ctx.count("tokens_trained", seqs.iter().map(|s| s.completion_len() as i64).sum::<i64>() * inner_epochs as i64);

    let out = ctx.output("policy")?.to_path_buf();
    std::fs::create_dir_all(&out)?;
    model::save(train.master(), Some(&tok), &out)?;
    opt.save(ctx.output("optimizer")?)?;
    write_rows(ctx.output("metrics")?, Schema::Table, &metrics)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rredcot::credit::progress;
    use rredcot::credit::weights::token_weights;

    use super::super::tests::shipped_params as shipped;

    #[test]
    fn the_shipped_update_files_params_are_what_update_reads() {
        use rredcot::engine::context::parse_params;
        for kind in ["update", "update_rredcot", "update_progress"] {
            let p: UpdateParams = parse_params(kind, &shipped(kind)).unwrap();
            assert_eq!(p.progress_coef.is_some(), kind == "update_progress", "{kind}");
        }
        let mut typo = shipped("update");
        typo.insert("micro_batchsize".into(), 4.into());
        let e = parse_params::<UpdateParams>("update", &typo).unwrap_err().to_string();
        assert!(e.contains("unknown field `micro_batchsize`"), "{e}");
    }

    #[test]
    fn micro_batch_masks_exactly_the_completion_and_carries_its_credit() {
        let a = Sequence { ids: vec![5, 6, 7, 8], prompt_len: 2, credit: vec![0.25, 0.75], advantage: vec![1.0, 2.0], reward: 1.0, sigma_entropy: None };
        let b = Sequence { ids: vec![5, 9, 9], prompt_len: 1, credit: vec![0.5, 0.5], advantage: vec![-1.0, -1.0], reward: 0.0, sigma_entropy: None };
        let (ids, mask, credit, adv) = micro_tensors(&[&a, &b], Device::Cpu);
        assert_eq!(ids.size(), vec![2, 4]);
        let mask: Vec<f32> = Vec::try_from(mask.flatten(0, -1)).unwrap();
        let credit: Vec<f32> = Vec::try_from(credit.flatten(0, -1)).unwrap();
        // Targets of a: 6 7 8 (completion 7 8 at target positions 1, 2); of b: 9 9 pad.
        assert_eq!(mask, vec![0., 1., 1., 1., 1., 0.]);
        assert_eq!(credit, vec![0., 0.25, 0.75, 0.5, 0.5, 0.]);
        let adv: Vec<f32> = Vec::try_from(adv.flatten(0, -1)).unwrap();
        assert_eq!(adv, vec![0., 1., 2., -1., -1., 0.]);
    }

    #[test]
    fn sigma_proportional_to_segment_length_is_the_grpo_loss_and_gradient() {
        use crate::train::loss::{policy_loss, sequence_factors, IsLevel, LossConfig, LossType};
        let (n, ends, sig) = (10usize, vec![3usize, 4, 10], vec![0.3, 0.1, 0.6]);
        let make = |credit: Vec<f64>, adv: f64| Sequence { ids: (1..=12).collect(), prompt_len: 2, credit, advantage: vec![adv; 10], reward: 0.0, sigma_entropy: None };
        let grpo = [make(token_weights(n, None, 0.0), 1.0), make(token_weights(n, None, 0.0), -1.0)];
        let rred = [make(token_weights(n, Some((&sig, &ends)), 1.0), 1.0), make(token_weights(n, Some((&sig, &ends)), 1.0), -1.0)];
        let cfg = LossConfig { loss_type: LossType::Grpo, importance_sampling: IsLevel::Token, epsilon_low: 0.2, epsilon_high: 0.2, beta: 0.0, kl_bias_correction: false };
        let loss_and_grad = |seqs: &[Sequence]| {
            let (_, mask, credit, adv) = micro_tensors(&seqs.iter().collect::<Vec<_>>(), Device::Cpu);
            tch::manual_seed(0);
            let mut logp = (Tensor::rand([2, 11], (Kind::Float, Device::Cpu)) * -2.0).set_requires_grad(true);
            logp.zero_grad();
            let f = Tensor::from_slice(&sequence_factors(LossType::Grpo, &[vec![n, n]], n, None)[0].iter().map(|&x| x as f32).collect::<Vec<_>>());
            let parts = policy_loss(&cfg, &logp, &logp.detach(), None, &adv, &credit, &f, &mask);
            parts.loss.backward();
            (parts.loss.double_value(&[]), logp.grad())
        };
        let (lg, gg) = loss_and_grad(&grpo);
        let (lr, gr) = loss_and_grad(&rred);
        assert!((lg - lr).abs() < 1e-7, "{lg} vs {lr}");
        assert!((gg - gr).abs().max().double_value(&[]) < 1e-7);
    }

    #[test]
    fn progress_advantages_reduce_to_grpo_and_flip_the_gradient_of_a_regressing_step() {
        use crate::train::loss::{policy_loss, sequence_factors, IsLevel, LossConfig, LossType};
        let (n, ends) = (6usize, vec![2usize, 6]);
        let entropies = [0.5f32, 1.5, 1.0, 1.0, 2.0, 0.0];
        let cfg = LossConfig { loss_type: LossType::Grpo, importance_sampling: IsLevel::Token, epsilon_low: 0.2, epsilon_high: 0.2, beta: 0.0, kl_bias_correction: false };
        let grad_of = |advantage: Vec<f64>| {
            let s = Sequence { ids: (1..=8).collect(), prompt_len: 2, credit: token_weights(n, None, 0.0), advantage, reward: 1.0, sigma_entropy: None };
            let (_, mask, credit, adv) = micro_tensors(&[&s], Device::Cpu);
            let logp = (Tensor::ones([1, 7], (Kind::Float, Device::Cpu)) * -1.0).set_requires_grad(true);
            let f = Tensor::from_slice(&sequence_factors(LossType::Grpo, &[vec![n]], n, None)[0].iter().map(|&x| x as f32).collect::<Vec<_>>());
            policy_loss(&cfg, &logp, &logp.detach(), None, &adv, &credit, &f, &mask).loss.backward();
            Vec::<f32>::try_from(logp.grad().flatten(0, -1)).unwrap()
        };
        let values = [0.5, 0.9, 0.2]; // step 1 helps, step 2 undoes it
        let progress = progress::step_progress(&values);
        // No progress term, no entropy weighting: every token gets the outcome advantage (GRPO).
        let w0 = progress::entropy_weights(&entropies, &ends, 0.0);
        assert_eq!(grad_of(progress::token_advantages(1.0, &progress, 0.0, &ends, &w0)), grad_of(vec![1.0; n]));
        // With progress 2x: step 2 (Δ = −0.7) gets 1 − 1.4 < 0, so its tokens are pushed down even
        // though the trace was correct; step 1 tokens are pushed up, scaled by their entropy.
        let w1 = progress::entropy_weights(&entropies, &ends, 1.0);
        let g = grad_of(progress::token_advantages(1.0, &progress, 2.0, &ends, &w1));
        assert!(g[1] < 0.0 && g[2] < g[1], "step 1 raised, the higher-entropy token more: {g:?}");
        assert!(g[3..6].iter().all(|&x| x > 0.0), "step 2 lowered: {g:?}");
        assert_eq!(g[6], 0.0, "a zero-entropy token gets no credit");
    }
}
