//! One GRPO policy update over a batch of scored completions: TRL's `training_step` around
//! `_compute_loss`. The batch is split into minibatches (one optimizer step each, `inner_epochs`
//! times over) and each minibatch into micro-batches whose gradients accumulate (so a batch larger
//! than memory works); every micro-batch's loss is [`policy_loss`] with per-token credit and
//! advantages; then the gradient is clipped and the resumable AdamW steps at the scheduled rate
//! ([`lr_at`]: warmup + cosine over the whole run).

use anyhow::{bail, Result};
use serde::Serialize;
use tch::{Device, Kind, Tensor};

use super::adamw::{clip_grads, grad_norm, AdamW};
use super::loss::{dapo_tokens_per_step, policy_loss, sequence_factors, LossConfig};
use super::lr_at;
use super::step::{token_logprobs, TrainModel};
use crate::model::DecoderLm;

/// One completion ready for the loss.
pub struct Sequence {
    /// Prompt + completion token ids.
    pub ids: Vec<i64>,
    pub prompt_len: usize,
    /// Per completion token share of the sequence's credit (sums to 1).
    pub credit: Vec<f64>,
    /// Per completion token advantage (the sequence's outcome advantage unless `progress`).
    pub advantage: Vec<f64>,
    pub reward: f64,
    pub sigma_entropy: Option<f64>,
}

impl Sequence {
    pub fn completion_len(&self) -> usize {
        self.ids.len() - self.prompt_len
    }
}

/// One optimizer step's figures (a row of `update`'s `metrics` output).
#[derive(Debug, Serialize)]
pub struct MetricsRow {
    pub train_step: i64,
    pub opt_step: i64,
    pub epoch: i64,
    pub minibatch: i64,
    pub loss: f64,
    pub kl: f64,
    pub clip_fraction: f64,
    pub grad_norm: f64,
    pub lr: f64,
    pub mean_reward: f64,
    pub mean_sigma_entropy: f64,
    pub sequences: i64,
    pub tokens: i64,
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

/// How [`update`] trains (the `update` stage's params of the same names).
pub struct UpdateConfig {
    pub loss: LossConfig,
    pub temperature: f64,
    /// `max_completion_length`: dr_grpo's constant normalizer.
    pub max_completion: usize,
    pub inner_epochs: usize,
    /// Sequences per optimizer step (0: the whole batch).
    pub minibatch: usize,
    pub micro: usize,
    /// This update's index in the run and the run's length, for the schedule.
    pub train_step: usize,
    pub total_steps: usize,
    pub lr: f64,
    pub warmup: usize,
    pub min_ratio: f64,
    pub clip: f64,
}

impl UpdateConfig {
    /// Sequences per minibatch of an update over `batch` sequences (at least 1).
    fn minibatch_len(&self, batch: usize) -> usize {
        (if self.minibatch == 0 { batch } else { self.minibatch }).max(1)
    }

    /// Optimizer steps of an update over `batch` sequences.
    pub fn optimizer_steps(&self, batch: usize) -> usize {
        self.inner_epochs * batch.div_ceil(self.minibatch_len(batch))
    }
}

/// Trains `train` on `seqs`: `inner_epochs` × minibatches optimizer steps of `opt`, with the KL
/// term against `reference` when the loss has one. Returns one [`MetricsRow`] per optimizer step;
/// `progress(done, loss, grad_norm)` after each. A non-finite loss or gradient is an error
/// (nothing to save).
pub fn update(
    train: &TrainModel,
    opt: &mut AdamW,
    reference: Option<&DecoderLm>,
    seqs: &[Sequence],
    cfg: &UpdateConfig,
    mut progress: impl FnMut(usize, f64, f64),
) -> Result<Vec<MetricsRow>> {
    let minibatches: Vec<&[Sequence]> = seqs.chunks(cfg.minibatch_len(seqs.len())).collect();
    let steps = cfg.optimizer_steps(seqs.len());
    // dapo's normalizer as in TRL: the batch's completion tokens over its optimizer steps per epoch.
    let dapo_tokens = dapo_tokens_per_step(seqs.iter().map(|s| s.completion_len()).sum(), minibatches.len());
    // Old log-probs (π_old = the policy before this update) are only needed when the policy moves
    // within the update; with one step, π_old = π detached (ratio 1), as in TRL.
    let fixed: Vec<Vec<FixedLogprobs>> =
        minibatches.iter().map(|mb| fixed_logprobs(train, reference, mb, cfg, steps > 1)).collect::<Result<_>>()?;
    let mut metrics = Vec::with_capacity(steps);
    for epoch in 0..cfg.inner_epochs {
        for (mbi, mb) in minibatches.iter().enumerate() {
            let at = StepAt { epoch, minibatch: mbi, opt_step: epoch * minibatches.len() + mbi, steps };
            let row = training_step(train, opt, mb, &fixed[mbi], at, dapo_tokens, cfg)?;
            progress(at.opt_step + 1, row.loss, row.grad_norm);
            metrics.push(row);
        }
    }
    Ok(metrics)
}

/// Log-probs of one micro-batch that do not move during the update: π_old's (`None`: π detached
/// stands in) and the reference policy's (`None`: no KL term).
struct FixedLogprobs {
    old: Option<Tensor>,
    reference: Option<Tensor>,
}

/// The micro-batches of a minibatch: `micro_batch_size` sequences each, in order.
fn micro_batches(mb: &[Sequence], micro: usize) -> Vec<Vec<&Sequence>> {
    mb.chunks(micro).map(|c| c.iter().collect()).collect()
}

fn fixed_logprobs(train: &TrainModel, reference: Option<&DecoderLm>, mb: &[Sequence], cfg: &UpdateConfig, needs_old: bool) -> Result<Vec<FixedLogprobs>> {
    let device = train.master().device();
    micro_batches(mb, cfg.micro)
        .iter()
        .map(|picked| {
            let (ids, _, _, _) = micro_tensors(picked, device);
            Ok(FixedLogprobs {
                old: if needs_old { Some(tch::no_grad(|| train.token_logprobs(&ids, cfg.temperature))?) } else { None },
                reference: match reference {
                    Some(r) => Some(tch::no_grad(|| token_logprobs(r, &ids, cfg.temperature))?),
                    None => None,
                },
            })
        })
        .collect()
}

/// Where an optimizer step is in the update: its epoch, minibatch and index among `steps`.
#[derive(Clone, Copy)]
struct StepAt {
    epoch: usize,
    minibatch: usize,
    opt_step: usize,
    steps: usize,
}

/// One optimizer step on minibatch `mb` (TRL's `training_step`): every micro-batch's loss
/// ([`policy_loss`], TRL's `_compute_loss`) backpropagated into the accumulated gradient, which
/// is clipped before AdamW steps at the scheduled rate.
fn training_step(train: &TrainModel, opt: &mut AdamW, mb: &[Sequence], fixed: &[FixedLogprobs], at: StepAt, dapo_tokens: f64, cfg: &UpdateConfig) -> Result<MetricsRow> {
    let (train_step, opt_step) = (cfg.train_step, at.opt_step);
    let params = train.params();
    let device = train.master().device();
    let global = train_step * at.steps + opt_step;
    let step_lr = lr_at(global, cfg.total_steps * at.steps, cfg.warmup, cfg.lr, cfg.min_ratio);
    let parts = micro_batches(mb, cfg.micro);
    let lens: Vec<Vec<usize>> = parts.iter().map(|p| p.iter().map(|s| s.completion_len()).collect()).collect();
    let factors = sequence_factors(cfg.loss.loss_type, &lens, cfg.max_completion, Some(dapo_tokens));
    train.zero_grad();
    let (mut loss_sum, mut kl_sum, mut clip_sum, mut tokens) = (0.0, 0.0, 0.0, 0i64);
    for (k, picked) in parts.iter().enumerate() {
        let (ids, mask, credit, adv_t) = micro_tensors(picked, device);
        let f_t = Tensor::from_slice(&factors[k].iter().map(|&f| f as f32).collect::<Vec<_>>()).to_device(device);
        let (l, kl, clip_fraction) = train.backward(&ids, cfg.temperature, |logp| {
            let old = match &fixed[k].old {
                Some(t) => t.shallow_clone(),
                None => logp.detach(),
            };
            let parts = policy_loss(&cfg.loss, logp, &old, fixed[k].reference.as_ref(), &adv_t, &credit, &f_t, &mask);
            let l = parts.loss.double_value(&[]);
            if !l.is_finite() {
                bail!("update step {train_step}: loss is {l} in optimizer step {opt_step}, micro-batch {k} (lr {step_lr:.3e}); nothing was saved");
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
    clip_grads(params, norm, cfg.clip);
    opt.step(params, step_lr)?;
    train.weights_changed();
    let sig: Vec<f64> = mb.iter().filter_map(|s| s.sigma_entropy).collect();
    Ok(MetricsRow {
        train_step: train_step as i64,
        opt_step: opt_step as i64,
        epoch: at.epoch as i64,
        minibatch: at.minibatch as i64,
        loss: loss_sum,
        kl: kl_sum / tokens.max(1) as f64,
        clip_fraction: clip_sum / tokens.max(1) as f64,
        grad_norm: norm,
        lr: step_lr,
        mean_reward: mb.iter().map(|s| s.reward).sum::<f64>() / mb.len() as f64,
        mean_sigma_entropy: if sig.is_empty() { f64::NAN } else { sig.iter().sum::<f64>() / sig.len() as f64 },
        sequences: mb.len() as i64,
        tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rredcot::credit::progress;
    use rredcot::credit::weights::token_weights;

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
