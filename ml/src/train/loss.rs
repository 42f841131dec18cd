//! The clipped policy-gradient loss of GRPO and its variants, with per-token credit (paper Eq.
//! 11–12). Formulas follow TRL's `GRPOTrainer._compute_loss`:
//!
//! - ratio ρ = exp(log π − log π_old) per token (`importance_sampling = token`) or
//!   exp(mean over the sequence of the log-ratio) (`sequence`, GSPO);
//! - per-token loss ℓ = −min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A) + β·k3, with
//!   k3 = exp(log π_ref − log π) − (log π_ref − log π) − 1;
//! - aggregation: each sequence i contributes f_i · Σ_k d_ik ℓ_ik, where d_ik is the token's share
//!   of the sequence's credit (Σ_k d_ik = 1: 1/|o| for GRPO, σ_t/|u_t| for RREDCoT) and f_i the
//!   sequence's weight under `loss_type` (see [`sequence_factors`]). With d = 1/|o| this is
//!   exactly TRL's `grpo`, `bnpo`, `dr_grpo` and `dapo`, also when one rollout batch is split
//!   into several optimizer steps (`dapo` then divides by the batch's mean tokens per step).
//! - The KL term is a regularizer, not credit: it is always aggregated with the uniform 1/|o|,
//!   whatever credit the policy term gets. The paper redistributes the gradient coefficient of
//!   the policy term (Eq. 11–12); weighting k3 by σ would make the pull towards the reference
//!   depend on σ as well.
//! - `kl_bias_correction` (TRL's `use_bias_correction_kl`, its default since 1.x; DeepSeek-V3.2):
//!   k3 is multiplied by the importance ratio ρ (differentiably, so the KL gradient changes even
//!   on-policy where ρ = 1), which makes it the unbiased reverse-KL gradient. Off by default: the
//!   paper's GRPO is DeepSeekMath's plain k3.
//! - σ (or any non-uniform credit) has no effect under sequence-level importance sampling: the
//!   ratio is one number per sequence and the credit sums to 1, so every token's gradient is the
//!   same. [`check_credit_with_is`] refuses that combination.

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossType {
    /// Mean over sequences of each sequence's token mean.
    Grpo,
    /// Token mean over each micro-batch, averaged over the micro-batches of a step.
    Bnpo,
    /// Token sum over (sequences × max completion length).
    DrGrpo,
    /// Token mean over the whole optimizer step's minibatch.
    Dapo,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IsLevel {
    Token,
    Sequence,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LossConfig {
    pub loss_type: LossType,
    pub importance_sampling: IsLevel,
    pub epsilon_low: f64,
    pub epsilon_high: f64,
    /// KL coefficient; 0 = no reference policy.
    pub beta: f64,
    /// Multiply k3 by the importance ratio (TRL's `use_bias_correction_kl`).
    #[serde(default)]
    pub kl_bias_correction: bool,
}

/// Errors of a loss configuration that would silently not do what it says.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LossConfigError {
    #[error("{credit} credit has no effect under sequence-level importance sampling (GSPO): the ratio is one number per sequence and credit sums to 1 per sequence, so every token gets the same gradient; use importance_sampling = \"token\"")]
    CreditIgnoredBySequenceIs { credit: &'static str },
}

/// Refuses non-uniform credit (σ, per-token progress advantages) under sequence-level importance
/// sampling, where it would be a no-op (measured: σ and uniform losses differ by 6e-17).
pub fn check_credit_with_is(is: IsLevel, credit: &'static str, uniform: bool) -> Result<(), LossConfigError> {
    match (is, uniform) {
        (IsLevel::Sequence, false) => Err(LossConfigError::CreditIgnoredBySequenceIs { credit }),
        _ => Ok(()),
    }
}

/// `dapo`'s token normalizer for each optimizer step, as TRL's `num_items_in_batch` ×
/// gradient_accumulation_steps / steps_per_generation: the rollout batch's completion tokens over
/// the optimizer steps it is split into (per pass over the batch).
pub fn dapo_tokens_per_step(batch_tokens: usize, optimizer_steps: usize) -> f64 {
    batch_tokens as f64 / optimizer_steps.max(1) as f64
}

/// f_i for the sequences of one optimizer step. `lens[m][i]` = completion tokens of sequence i
/// of micro-batch m; `max_len` = the configured maximum completion length (dr_grpo);
/// `dapo_tokens` = the token normalizer of `dapo`: as in TRL, the rollout batch's completion
/// tokens divided by the optimizer steps it is split into (`None`: this step's own tokens, the
/// same when the batch is one step).
pub fn sequence_factors(loss_type: LossType, lens: &[Vec<usize>], max_len: usize, dapo_tokens: Option<f64>) -> Vec<Vec<f64>> {
    let n_seq: usize = lens.iter().map(Vec::len).sum();
    let all_tokens = dapo_tokens.unwrap_or(lens.iter().flatten().sum::<usize>() as f64);
    let micro = lens.len() as f64;
    lens.iter()
        .map(|mb| {
            let mb_tokens: usize = mb.iter().sum();
            mb.iter()
                .map(|&l| match loss_type {
                    LossType::Grpo => 1.0 / n_seq as f64,
                    LossType::Bnpo => l as f64 / (mb_tokens.max(1) as f64 * micro),
                    LossType::DrGrpo => l as f64 / (n_seq as f64 * max_len.max(1) as f64),
                    LossType::Dapo => l as f64 / all_tokens.max(1.0),
                })
                .collect()
        })
        .collect()
}

/// Loss of one micro-batch and its diagnostics.
pub struct LossParts {
    /// Scalar to backpropagate (its sum over the step's micro-batches is the step's loss).
    pub loss: Tensor,
    /// Mean k3 KL over completion tokens (× ρ under `kl_bias_correction`, as TRL logs it; 0
    /// without a reference).
    pub kl: f64,
    /// Fraction of completion tokens whose ratio was clipped.
    pub clip_fraction: f64,
}

/// `logp`, `old_logp`, `ref_logp`, `credit`, `mask`: `[B, T]` over completion positions;
/// `adv`: `[B]` (per sequence) or `[B, T]` (per token); `factor`: `[B]`. `credit` rows sum to 1 over the mask.
// `x = x * y`, not `x *= y`: on a tch tensor the latter runs in place, on values autograd may
// have saved for the backward.
#[allow(clippy::too_many_arguments, clippy::assign_op_pattern)]
pub fn policy_loss(
    cfg: &LossConfig,
    logp: &Tensor,
    old_logp: &Tensor,
    ref_logp: Option<&Tensor>,
    adv: &Tensor,
    credit: &Tensor,
    factor: &Tensor,
    mask: &Tensor,
) -> LossParts {
    let log_ratio = (logp - old_logp) * mask;
    let log_w = match cfg.importance_sampling {
        IsLevel::Token => log_ratio.shallow_clone(),
        IsLevel::Sequence => {
            (log_ratio.sum_dim_intlist(-1, true, None::<Kind>) / mask.sum_dim_intlist(-1, true, None::<Kind>).clamp_min(1.0))
                .expand_as(logp)
        }
    };
    let coef1 = log_w.exp();
    let coef2 = coef1.clamp(1.0 - cfg.epsilon_low, 1.0 + cfg.epsilon_high);
    // One advantage per sequence `[B]`, or per token `[B, T]` (progress credit).
    let a = if adv.dim() == 1 { adv.unsqueeze(-1) } else { adv.shallow_clone() };
    let per_token = -(&coef1 * &a).minimum(&(&coef2 * &a));
    // The policy term takes the credit (σ_t/|u_t| for RREDCoT, 1/|o| for GRPO: Eq. 11–12).
    let mut per_seq = (per_token * credit * mask).sum_dim_intlist(-1, false, None::<Kind>);
    let mut kl = 0.0;
    if let (Some(r), true) = (ref_logp, cfg.beta > 0.0) {
        let d = r - logp;
        let mut k3 = d.exp() - &d - 1.0;
        if cfg.kl_bias_correction {
            k3 = k3 * &coef1;
        }
        kl = (&k3 * mask).sum(None::<Kind>).double_value(&[]) / mask.sum(None::<Kind>).double_value(&[]).max(1.0);
        // The KL term stays uniform (1/|o|) whatever the credit: see the module doc.
        let len = mask.sum_dim_intlist(-1, false, None::<Kind>).clamp_min(1.0);
        per_seq = per_seq + (k3 * mask).sum_dim_intlist(-1, false, None::<Kind>) / len * cfg.beta;
    }
    let clipped = coef1.lt(1.0 - cfg.epsilon_low).logical_and(&a.lt(0.0)).logical_or(&coef1.gt(1.0 + cfg.epsilon_high).logical_and(&a.gt(0.0)));
    let clip_fraction = (clipped.to_kind(mask.kind()) * mask).sum(None::<Kind>).double_value(&[])
        / mask.sum(None::<Kind>).double_value(&[]).max(1.0);
    LossParts { loss: (per_seq * factor).sum(None::<Kind>), kl, clip_fraction }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch of 3 sequences (lengths 4, 2, 3 in a [3, 4] mask) with random log-probs.
    fn batch() -> (Tensor, Tensor, Tensor, Vec<usize>) {
        tch::manual_seed(3);
        let logp = (Tensor::rand([3, 4], (Kind::Double, tch::Device::Cpu)) * -3.0).set_requires_grad(true);
        let old = (&logp.detach() + Tensor::randn([3, 4], (Kind::Double, tch::Device::Cpu)) * 0.3).detach();
        let mask = Tensor::from_slice(&[1., 1., 1., 1., 1., 1., 0., 0., 1., 1., 1., 0.]).view([3, 4]).to_kind(Kind::Double);
        (logp, old, mask, vec![4, 2, 3])
    }

    fn cfg(loss_type: LossType) -> LossConfig {
        LossConfig { loss_type, importance_sampling: IsLevel::Token, epsilon_low: 0.2, epsilon_high: 0.28, beta: 0.0, kl_bias_correction: false }
    }

    fn uniform_credit(lens: &[usize], t: i64) -> Tensor {
        let mut v = Vec::new();
        for &l in lens {
            for k in 0..t as usize {
                v.push(if k < l { 1.0 / l as f64 } else { 0.0 });
            }
        }
        Tensor::from_slice(&v).view([lens.len() as i64, t])
    }

    /// TRL's formulas written out with plain loops over f64 (one micro-batch).
    fn trl_reference(c: &LossConfig, logp: &Tensor, old: &Tensor, adv: &[f64], lens: &[usize], max_len: usize) -> f64 {
        let lp: Vec<Vec<f64>> = Vec::try_from(logp.detach()).unwrap();
        let ol: Vec<Vec<f64>> = Vec::try_from(old.shallow_clone()).unwrap();
        let mut per_seq_sum = vec![0.0; lens.len()];
        for (i, &l) in lens.iter().enumerate() {
            for k in 0..l {
                let r = (lp[i][k] - ol[i][k]).exp();
                let rc = r.clamp(1.0 - c.epsilon_low, 1.0 + c.epsilon_high);
                per_seq_sum[i] += -(r * adv[i]).min(rc * adv[i]);
            }
        }
        let tokens: usize = lens.iter().sum();
        match c.loss_type {
            LossType::Grpo => per_seq_sum.iter().zip(lens).map(|(s, &l)| s / l as f64).sum::<f64>() / lens.len() as f64,
            LossType::Bnpo | LossType::Dapo => per_seq_sum.iter().sum::<f64>() / tokens as f64,
            LossType::DrGrpo => per_seq_sum.iter().sum::<f64>() / (lens.len() * max_len) as f64,
        }
    }

    #[test]
    fn uniform_credit_matches_trl_for_every_loss_type() {
        let (logp, old, mask, lens) = batch();
        let adv = [1.5, -0.5, -1.0];
        let adv_t = Tensor::from_slice(&adv);
        for lt in [LossType::Grpo, LossType::Bnpo, LossType::DrGrpo, LossType::Dapo] {
            let c = cfg(lt);
            let f = Tensor::from_slice(&sequence_factors(lt, std::slice::from_ref(&lens), 4, None)[0]);
            let ours = policy_loss(&c, &logp, &old, None, &adv_t, &uniform_credit(&lens, 4), &f, &mask);
            let want = trl_reference(&c, &logp, &old, &adv, &lens, 4);
            let got = ours.loss.double_value(&[]);
            assert!((got - want).abs() < 1e-12, "{lt:?}: {got} vs TRL {want}");
        }
    }

    #[test]
    fn on_policy_gradient_is_minus_advantage_times_token_weight() {
        let (mut logp, _, mask, lens) = batch();
        let old = logp.detach();
        let adv = Tensor::from_slice(&[1.5, -0.5, -1.0]);
        // A non-uniform credit (as σ gives) that sums to 1 per sequence.
        let credit = Tensor::from_slice(&[0.1, 0.2, 0.3, 0.4, 0.5, 0.5, 0., 0., 0.6, 0.3, 0.1, 0.])
            .view([3, 4])
            .to_kind(Kind::Double);
        for lt in [LossType::Grpo, LossType::DrGrpo, LossType::Dapo] {
            let f = Tensor::from_slice(&sequence_factors(lt, std::slice::from_ref(&lens), 4, None)[0]);
            logp.zero_grad();
            let parts = policy_loss(&cfg(lt), &logp, &old, None, &adv, &credit, &f, &mask);
            parts.loss.backward();
            let want = -(adv.unsqueeze(-1) * f.unsqueeze(-1) * &credit * &mask);
            let diff = (logp.grad() - want).abs().max().double_value(&[]);
            assert!(diff < 1e-12, "{lt:?}: gradient off by {diff}");
            assert_eq!(parts.clip_fraction, 0.0);
        }
    }

    #[test]
    fn sequence_level_ratio_and_kl_follow_their_formulas() {
        let (logp, old, mask, lens) = batch();
        let adv = Tensor::from_slice(&[1.0, 1.0, 1.0]);
        let mut c = cfg(LossType::Grpo);
        c.importance_sampling = IsLevel::Sequence;
        c.epsilon_low = 10.0;
        c.epsilon_high = 10.0;
        let f = Tensor::from_slice(&sequence_factors(LossType::Grpo, std::slice::from_ref(&lens), 4, None)[0]);
        let got = policy_loss(&c, &logp, &old, None, &adv, &uniform_credit(&lens, 4), &f, &mask).loss.double_value(&[]);
        // No clipping: each sequence's loss is −exp(mean log-ratio).
        let lp: Vec<Vec<f64>> = Vec::try_from(logp.detach()).unwrap();
        let ol: Vec<Vec<f64>> = Vec::try_from(old.shallow_clone()).unwrap();
        let want: f64 = lens
            .iter()
            .enumerate()
            .map(|(i, &l)| -((0..l).map(|k| lp[i][k] - ol[i][k]).sum::<f64>() / l as f64).exp())
            .sum::<f64>()
            / 3.0;
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        // KL: the k3 estimator, zero when the reference equals the policy.
        let mut c = cfg(LossType::Grpo);
        c.beta = 0.5;
        let same = policy_loss(&c, &logp, &logp.detach(), Some(&logp.detach()), &adv, &uniform_credit(&lens, 4), &f, &mask);
        assert_eq!(same.kl, 0.0);
        let other = policy_loss(&c, &logp, &logp.detach(), Some(&old), &adv, &uniform_credit(&lens, 4), &f, &mask);
        assert!(other.kl > 0.0);
    }

    /// A non-uniform credit over `batch()`'s mask (as σ gives), summing to 1 per sequence.
    fn sigma_credit() -> Tensor {
        Tensor::from_slice(&[0.7, 0.1, 0.1, 0.1, 0.9, 0.1, 0., 0., 0.2, 0.2, 0.6, 0.]).view([3, 4]).to_kind(Kind::Double)
    }

    #[test]
    fn dapo_split_into_optimizer_steps_divides_by_the_batch_mean_tokens_per_step_as_trl() {
        // TRL: loss of each micro-batch = Σ tokens ℓ / (num_items_in_batch), where
        // num_items_in_batch is the generation batch's tokens over the optimizer steps it feeds.
        let (step1, step2) = (vec![vec![4usize, 2]], vec![vec![3usize, 5]]);
        let per_step = (4 + 2 + 3 + 5) as f64 / 2.0;
        let f1 = sequence_factors(LossType::Dapo, &step1, 10, Some(per_step));
        let f2 = sequence_factors(LossType::Dapo, &step2, 10, Some(per_step));
        assert_eq!(f1, vec![vec![4.0 / 7.0, 2.0 / 7.0]]);
        assert_eq!(f2, vec![vec![3.0 / 7.0, 5.0 / 7.0]]);
        // Each step's own token count (what we did before) weighs the short step's tokens more.
        assert_eq!(sequence_factors(LossType::Dapo, &step1, 10, None), vec![vec![4.0 / 6.0, 2.0 / 6.0]]);
        // Other loss types ignore the normalizer.
        assert_eq!(sequence_factors(LossType::Grpo, &step1, 10, Some(per_step)), sequence_factors(LossType::Grpo, &step1, 10, None));
    }

    #[test]
    fn nonuniform_credit_is_refused_under_sequence_level_is_because_it_changes_nothing() {
        let (logp, old, mask, lens) = batch();
        let (adv, sigma) = (Tensor::from_slice(&[1.5, -0.5, -1.0]), sigma_credit());
        let mut seq = cfg(LossType::Grpo);
        seq.importance_sampling = IsLevel::Sequence;
        let f = Tensor::from_slice(&sequence_factors(LossType::Grpo, std::slice::from_ref(&lens), 4, None)[0]);
        let grad_under = |c: &LossConfig, credit: &Tensor| {
            let mut lp = logp.detach().set_requires_grad(true);
            lp.zero_grad();
            let l = policy_loss(c, &lp, &old, None, &adv, credit, &f, &mask).loss;
            l.backward();
            (l.double_value(&[]), lp.grad())
        };
        let (lu, gu) = grad_under(&seq, &uniform_credit(&lens, 4));
        let (ls, gs) = grad_under(&seq, &sigma);
        assert!((lu - ls).abs() < 1e-12 && (gu - gs).abs().max().double_value(&[]) < 1e-12, "σ is a no-op under GSPO");
        assert!(check_credit_with_is(IsLevel::Sequence, "sigma", false).is_err());
        assert!(check_credit_with_is(IsLevel::Sequence, "uniform", true).is_ok());
        assert!(check_credit_with_is(IsLevel::Token, "sigma", false).is_ok());
        // Under token-level IS the same σ does change the gradient.
        let token = cfg(LossType::Grpo);
        let (_, gu) = grad_under(&token, &uniform_credit(&lens, 4));
        let (_, gs) = grad_under(&token, &sigma);
        assert!((gu - gs).abs().max().double_value(&[]) > 1e-3);
    }

    #[test]
    fn kl_term_is_uniform_whatever_the_credit() {
        let (logp, old, mask, lens) = batch();
        let (adv, sigma) = (Tensor::from_slice(&[1.5, -0.5, -1.0]), sigma_credit());
        let reference = (&logp.detach() + 0.5).detach();
        let f = Tensor::from_slice(&sequence_factors(LossType::Grpo, std::slice::from_ref(&lens), 4, None)[0]);
        let kl_part = |credit: &Tensor| {
            let mut with = cfg(LossType::Grpo);
            with.beta = 0.04;
            let a = policy_loss(&with, &logp, &old, Some(&reference), &adv, credit, &f, &mask).loss.double_value(&[]);
            let b = policy_loss(&cfg(LossType::Grpo), &logp, &old, Some(&reference), &adv, credit, &f, &mask).loss.double_value(&[]);
            a - b
        };
        let (ku, ks) = (kl_part(&uniform_credit(&lens, 4)), kl_part(&sigma));
        assert!(ku > 0.0);
        assert!((ku - ks).abs() < 1e-12, "KL contribution {ku} (uniform) vs {ks} (σ)");
        // And it is β × the mean over sequences of each sequence's mean k3 (TRL's grpo aggregation).
        let lp: Vec<Vec<f64>> = Vec::try_from(logp.detach()).unwrap();
        let rf: Vec<Vec<f64>> = Vec::try_from(reference.shallow_clone()).unwrap();
        let want = 0.04
            * lens
                .iter()
                .enumerate()
                .map(|(i, &l)| (0..l).map(|k| { let d = rf[i][k] - lp[i][k]; d.exp() - d - 1.0 }).sum::<f64>() / l as f64)
                .sum::<f64>()
            / 3.0;
        assert!((ku - want).abs() < 1e-12, "{ku} vs {want}");
    }

    #[test]
    fn factors_follow_each_aggregation() {
        let lens = vec![vec![4, 2], vec![3]];
        let f = sequence_factors(LossType::Grpo, &lens, 10, None);
        assert_eq!(f, vec![vec![1.0 / 3.0; 2], vec![1.0 / 3.0]]);
        let f = sequence_factors(LossType::Dapo, &lens, 10, None);
        assert_eq!(f, vec![vec![4.0 / 9.0, 2.0 / 9.0], vec![3.0 / 9.0]]);
        let f = sequence_factors(LossType::Bnpo, &lens, 10, None);
        assert_eq!(f, vec![vec![4.0 / 12.0, 2.0 / 12.0], vec![3.0 / 6.0]]);
        let f = sequence_factors(LossType::DrGrpo, &lens, 10, None);
        assert_eq!(f, vec![vec![4.0 / 30.0, 2.0 / 30.0], vec![3.0 / 30.0]]);
    }

    #[test]
    fn bias_corrected_kl_keeps_the_on_policy_value_and_changes_its_gradient() {
        let (logp, _, mask, lens) = batch();
        let (adv, old) = (Tensor::from_slice(&[0.0, 0.0, 0.0]), logp.detach());
        let reference = (&logp.detach() + 0.5).detach();
        let f = Tensor::from_slice(&sequence_factors(LossType::Grpo, std::slice::from_ref(&lens), 4, None)[0]);
        let run = |correct: bool| {
            let mut c = cfg(LossType::Grpo);
            (c.beta, c.kl_bias_correction) = (0.04, correct);
            let mut lp = logp.detach().set_requires_grad(true);
            lp.zero_grad();
            let parts = policy_loss(&c, &lp, &old, Some(&reference), &adv, &uniform_credit(&lens, 4), &f, &mask);
            parts.loss.backward();
            (parts.loss.double_value(&[]), parts.kl, lp.grad())
        };
        let ((lp, kp, gp), (lc, kc, gc)) = (run(false), run(true));
        // On-policy ρ = 1: same loss and logged KL ...
        assert!((lp - lc).abs() < 1e-15 && (kp - kc).abs() < 1e-15, "{lp} vs {lc}, KL {kp} vs {kc}");
        // ... but dρ/dlogπ = ρ adds k3 to each token's gradient: d/dlogπ (k3·ρ) = (1 − e^d) + k3.
        let d = &reference - &logp.detach();
        let k3 = d.exp() - &d - 1.0;
        let want_extra = k3 * 0.04 * f.unsqueeze(-1) * uniform_credit(&lens, 4) * &mask;
        let diff = (gc - gp - want_extra).abs().max().double_value(&[]);
        assert!(diff < 1e-12, "bias-corrected KL gradient off by {diff}");
    }
}
