//! Progress rewards and entropy-weighted token advantages (seed 002, hierarchical credit).
//!
//! A prover policy's success probability V_t after the first t steps (t = 0..T, from
//! `score_progress`: Monte Carlo or prefill estimate) gives each step the *progress reward*
//! Δ_t = V_t − V_{t−1}: how much the step made the problem more solvable. The step advantage is
//! the group-normalized outcome advantage plus `coef`·Δ_t (the unified effective reward: outcome +
//! progress), and each token of step t gets it scaled by its normalized decision entropy
//! H_i / mean_{j ∈ step t} H_j, so tokens where the policy made a real choice carry more credit
//! while the step's total stays |u_t| × its advantage. `mix = λ` blends λ·entropy weight + (1−λ).

/// Δ_t = V_t − V_{t−1} for t = 1..T from V_0..V_T.
pub fn step_progress(values: &[f64]) -> Vec<f64> {
    values.windows(2).map(|w| w[1] - w[0]).collect()
}

/// Per-token multipliers: H_i / mean of H over the token's step (`ends` exclusive, tiling the
/// completion), mixed with 1 by `mix`. A step whose entropies are all 0 gets 1 for each token.
pub fn entropy_weights(entropies: &[f32], ends: &[usize], mix: f64) -> Vec<f64> {
    let mut w = Vec::with_capacity(entropies.len());
    let mut start = 0;
    for &end in ends {
        let step = &entropies[start..end];
        let mean = step.iter().map(|&h| h as f64).sum::<f64>() / step.len().max(1) as f64;
        for &h in step {
            let norm = if mean > 0.0 { h as f64 / mean } else { 1.0 };
            w.push(mix * norm + (1.0 - mix));
        }
        start = end;
    }
    w
}

/// Token advantages of one completion: (outcome advantage + `coef`·Δ_t) × entropy weight for
/// every token of step t.
pub fn token_advantages(outcome: f64, progress: &[f64], coef: f64, ends: &[usize], entropy_w: &[f64]) -> Vec<f64> {
    assert_eq!(progress.len(), ends.len(), "one progress value per step");
    let mut adv = Vec::with_capacity(entropy_w.len());
    let mut start = 0;
    for (&p, &end) in progress.iter().zip(ends) {
        let step = outcome + coef * p;
        adv.extend(entropy_w[start..end].iter().map(|w| step * w));
        start = end;
    }
    adv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_sums_to_the_final_minus_the_initial_value() {
        let d = step_progress(&[0.25, 0.5, 0.5, 1.0]);
        assert_eq!(d, vec![0.25, 0.0, 0.5]);
        assert_eq!(d.iter().sum::<f64>(), 0.75);
        assert!(step_progress(&[0.3]).is_empty());
    }

    #[test]
    fn entropy_weights_average_one_per_step_and_mix_toward_uniform() {
        let h = [1.0f32, 3.0, 0.5, 0.5, 0.0, 0.0];
        let ends = [2usize, 4, 6];
        let w = entropy_weights(&h, &ends, 1.0);
        assert_eq!(w, vec![0.5, 1.5, 1.0, 1.0, 1.0, 1.0]);
        let half = entropy_weights(&h, &ends, 0.5);
        assert_eq!(half[..2], [0.75, 1.25]);
        assert!(entropy_weights(&h, &ends, 0.0).iter().all(|&x| x == 1.0));
    }

    #[test]
    fn token_advantages_add_progress_per_step_and_keep_each_steps_total() {
        let ends = [2usize, 5];
        let w = entropy_weights(&[1.0, 3.0, 2.0, 2.0, 2.0], &ends, 1.0);
        let a = token_advantages(0.5, &[0.2, -1.0], 1.0, &ends, &w);
        assert!(a[..2].iter().zip([0.35, 1.05]).all(|(x, y)| (x - y).abs() < 1e-12), "{a:?}");
        assert!(a[2..].iter().all(|x| (x + 0.5).abs() < 1e-12), "{a:?}");
        // A failing step inside a correct trace gets a negative advantage: the sign can differ
        // from the outcome's, which is why advantages are per token and not a weight.
        assert!(a[2] < 0.0 && a[0] > 0.0);
        // coef = 0 and no entropy weighting is GRPO's per-sequence advantage.
        let flat = token_advantages(0.5, &[0.2, -1.0], 0.0, &ends, &[1.0; 5]);
        assert!(flat.iter().all(|&x| x == 0.5));
    }
}
