//! Per-token credit of one completion for the policy loss, for every credit kind the update
//! knows: the share of the sequence's gradient each token gets (`weights`, summing to 1) and each
//! token's advantage.
//!
//! - uniform: GRPO's 1/|o| and the outcome advantage on every token;
//! - σ: RREDCoT's σ_t/|u_t| over the chain of thought's segments, mixed with uniform by `mix`
//!   (paper Eq. 11–12; [`token_weights`]), the outcome advantage on every token;
//! - progress (seed 002): uniform weights, and per token the outcome advantage plus `coef` × the
//!   prover's progress Δ_t of the token's step, times the token's entropy normalized over its
//!   step ([`progress`]); the answer after the chain of thought keeps the outcome advantage.
//!
//! Plain arithmetic on one row: the update stage reads the rows and composes this with the loss.

use super::progress;
use super::sigma;
use super::weights::token_weights;

/// Where a completion's credit comes from, with what that kind needs.
#[derive(Debug, Clone, Copy)]
pub enum CreditSource<'a> {
    Uniform,
    /// σ per segment and the segments' end offsets over the chain of thought.
    Sigma { sigma: &'a [f64], ends: &'a [usize], mix: f64 },
    /// The prover's values V_0..V_T, the segments' ends, the completion's token entropies.
    Progress { values: &'a [f64], ends: &'a [usize], entropies: &'a [f32], coef: f64, entropy_mix: f64 },
}

/// One completion's credit, `n` tokens long.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenCredit {
    pub weights: Vec<f64>,
    pub advantages: Vec<f64>,
    /// Entropy of σ over the segments (σ credit only), a training metric.
    pub sigma_entropy: Option<f64>,
}

/// The credit of an `n`-token completion whose outcome advantage is `advantage`; an error says
/// what in the row is malformed (the caller names the row).
pub fn token_credit(n: usize, advantage: f64, source: CreditSource) -> Result<TokenCredit, String> {
    let uniform = || token_weights(n, None, 0.0);
    match source {
        CreditSource::Uniform => Ok(TokenCredit { weights: uniform(), advantages: vec![advantage; n], sigma_entropy: None }),
        CreditSource::Sigma { sigma: s, ends, mix } => {
            if s.len() != ends.len() {
                return Err(format!("{} σ values for {} segments", s.len(), ends.len()));
            }
            if let Some(x) = s.iter().find(|x| !x.is_finite()) {
                return Err(format!("σ value {x}"));
            }
            Ok(TokenCredit {
                weights: token_weights(n, Some((s, ends)), mix),
                advantages: vec![advantage; n],
                sigma_entropy: Some(sigma::entropy(s)),
            })
        }
        CreditSource::Progress { values, ends, entropies, coef, entropy_mix } => {
            if values.len() != ends.len() + 1 {
                return Err(format!(
                    "{} prover values (R) for {} segments; expected V_0..V_T from score_progress",
                    values.len(),
                    ends.len()
                ));
            }
            if let Some(x) = values.iter().find(|x| !x.is_finite()) {
                return Err(format!("prover value {x}"));
            }
            if entropies.len() != n {
                return Err(format!("{} token entropies for {n} completion tokens", entropies.len()));
            }
            if entropy_mix > 0.0 && entropies.iter().any(|e| !e.is_finite()) {
                return Err(format!(
                    "entropy-weighted progress advantages (entropy_mix = {entropy_mix}) need finite token entropies; the rollout has none (an engine rollout with entropies = \"none\"? use \"prefill\" or \"topk\", or entropy_mix = 0)"
                ));
            }
            let w = progress::entropy_weights(entropies, ends, entropy_mix);
            let mut a = progress::token_advantages(advantage, &progress::step_progress(values), coef, ends, &w);
            // The answer after the chain of thought is no step: it keeps the outcome advantage.
            a.resize(n, advantage);
            Ok(TokenCredit { weights: uniform(), advantages: a, sigma_entropy: None })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12)
    }

    #[test]
    fn uniform_and_sigma_credit_sum_to_one_with_the_outcome_advantage_everywhere() {
        let u = token_credit(4, 0.5, CreditSource::Uniform).unwrap();
        assert!(close(&u.weights, &[0.25; 4]) && close(&u.advantages, &[0.5; 4]) && u.sigma_entropy.is_none());
        // Two segments over the first 4 tokens (σ 0.75 / 0.25), then 2 answer tokens.
        let s = token_credit(6, -1.0, CreditSource::Sigma { sigma: &[0.75, 0.25], ends: &[2, 4], mix: 1.0 }).unwrap();
        assert!((s.weights.iter().sum::<f64>() - 1.0).abs() < 1e-12, "{:?}", s.weights);
        assert!(s.weights[0] > s.weights[2], "{:?}", s.weights);
        assert!(close(&s.advantages, &[-1.0; 6]));
        assert!(s.sigma_entropy.unwrap() > 0.0);
        // mix = 0 is GRPO's uniform credit.
        let s0 = token_credit(6, -1.0, CreditSource::Sigma { sigma: &[0.75, 0.25], ends: &[2, 4], mix: 0.0 }).unwrap();
        assert!(close(&s0.weights, &[1.0 / 6.0; 6]));
    }

    #[test]
    fn progress_credit_moves_the_steps_advantages_and_leaves_the_answer_alone() {
        let c = token_credit(
            5,
            1.0,
            CreditSource::Progress { values: &[0.0, 0.5, 0.25], ends: &[2, 4], entropies: &[1.0; 5], coef: 1.0, entropy_mix: 0.0 },
        )
        .unwrap();
        assert!(close(&c.weights, &[0.2; 5]));
        // Step 1 progressed (+0.5), step 2 regressed (−0.25); the answer token keeps 1.0.
        assert!(c.advantages[0] > 1.0 && c.advantages[2] < 1.0, "{:?}", c.advantages);
        assert_eq!(c.advantages[4], 1.0);
    }

    #[test]
    fn malformed_rows_are_errors_saying_what_is_wrong() {
        let e = token_credit(4, 0.0, CreditSource::Sigma { sigma: &[1.0], ends: &[2, 4], mix: 1.0 }).unwrap_err();
        assert_eq!(e, "1 σ values for 2 segments");
        let e = token_credit(4, 0.0, CreditSource::Sigma { sigma: &[f64::NAN, 1.0], ends: &[2, 4], mix: 1.0 }).unwrap_err();
        assert_eq!(e, "σ value NaN");
        let p = |values: &'static [f64], entropies: &'static [f32], entropy_mix| CreditSource::Progress { values, ends: &[2, 4], entropies, coef: 1.0, entropy_mix };
        assert!(token_credit(4, 0.0, p(&[0.0, 1.0], &[1.0; 4], 0.0)).unwrap_err().contains("2 prover values (R) for 2 segments"));
        assert_eq!(token_credit(4, 0.0, p(&[0.0, f64::INFINITY, 1.0], &[1.0; 4], 0.0)).unwrap_err(), "prover value inf");
        assert_eq!(token_credit(4, 0.0, p(&[0.0, 1.0, 1.0], &[1.0; 3], 0.0)).unwrap_err(), "3 token entropies for 4 completion tokens");
        assert!(token_credit(4, 0.0, p(&[0.0, 1.0, 1.0], &[f32::NAN; 4], 0.5)).unwrap_err().contains("need finite token entropies"));
        // Without entropy weighting, missing entropies are fine.
        assert!(token_credit(4, 0.0, p(&[0.0, 1.0, 1.0], &[f32::NAN; 4], 0.0)).is_ok());
    }
}
