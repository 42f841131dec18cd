//! Outcome advantages and per-token credit weights for the policy update (paper Eq. 11–12).
//!
//! GRPO gives every token of completion o the weight 1/|o|; RREDCoT gives each token of segment t
//! the weight σ_t/|u_t|, so a segment's tokens share its σ and (with Σσ = 1) the weights of a
//! sequence still sum to 1 (return equivalence). `sigma_mix = λ` blends λ·σ-weights + (1−λ)/|o|.

use serde::{Deserialize, Serialize};

/// How outcome rewards are scaled into advantages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScaleRewards {
    /// (r − group mean) / (group std + ε) (GRPO).
    Group,
    /// (r − group mean) / (batch std + ε).
    Batch,
    /// r − group mean (Dr. GRPO).
    None,
}

/// Group-relative advantages. `groups[i]` is the group id of row i (rows of a group need not be
/// adjacent). Returns the advantages and the number of groups whose rewards were all equal
/// (advantage 0 for their rows, never NaN).
pub fn advantages(rewards: &[f64], groups: &[usize], scale: ScaleRewards, eps: f64) -> (Vec<f64>, usize) {
    assert_eq!(rewards.len(), groups.len());
    let n_groups = groups.iter().copied().max().map_or(0, |g| g + 1);
    let mut sum = vec![0.0; n_groups];
    let mut count = vec![0usize; n_groups];
    for (&r, &g) in rewards.iter().zip(groups) {
        sum[g] += r;
        count[g] += 1;
    }
    let mean: Vec<f64> = sum.iter().zip(&count).map(|(s, &c)| s / c.max(1) as f64).collect();
    let mut sq = vec![0.0; n_groups];
    for (&r, &g) in rewards.iter().zip(groups) {
        sq[g] += (r - mean[g]).powi(2);
    }
    // Unbiased std, as torch.std (TRL's default).
    let std: Vec<f64> = sq.iter().zip(&count).map(|(s, &c)| if c > 1 { (s / (c - 1) as f64).sqrt() } else { 0.0 }).collect();
    let batch_std = {
        let n = rewards.len();
        let m = rewards.iter().sum::<f64>() / n.max(1) as f64;
        if n > 1 {
            (rewards.iter().map(|r| (r - m).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
        } else {
            0.0
        }
    };
    let flat = (0..n_groups).filter(|&g| count[g] > 0 && sq[g] == 0.0).count();
    let adv = rewards
        .iter()
        .zip(groups)
        .map(|(&r, &g)| {
            let centered = r - mean[g];
            match scale {
                ScaleRewards::Group => centered / (std[g] + eps),
                ScaleRewards::Batch => centered / (batch_std + eps),
                ScaleRewards::None => centered,
            }
        })
        .collect();
    (adv, flat)
}

/// Per-token weights of one completion of `n` tokens.
/// - `sigma = None`: uniform 1/n (GRPO).
/// - `sigma = Some((σ, ends))`: σ_t / |u_t| for the tokens of segment t (`ends` exclusive,
///   tiling the chain of thought `0..c`, `c = ends.last() ≤ n`), scaled by c/n, mixed with
///   uniform by `mix` (1 = pure σ). The answer tokens after the chain of thought (`c..n`) have no
///   segment and keep GRPO's 1/n, so the weights still sum to 1 and c = n is the plain σ / |u_t|.
pub fn token_weights(n: usize, sigma: Option<(&[f64], &[usize])>, mix: f64) -> Vec<f64> {
    let uniform = 1.0 / n.max(1) as f64;
    let Some((sig, ends)) = sigma else {
        return vec![uniform; n];
    };
    assert_eq!(sig.len(), ends.len(), "one σ per segment");
    let cot = ends.last().copied().unwrap_or(0);
    assert!(cot <= n, "segments end at {cot}, past the completion's {n} tokens");
    let cot_mass = cot as f64 / n.max(1) as f64;
    let mut w = Vec::with_capacity(n);
    let mut start = 0;
    for (&s, &end) in sig.iter().zip(ends) {
        let len = end - start;
        for _ in 0..len {
            w.push(mix * cot_mass * s / len as f64 + (1.0 - mix) * uniform);
        }
        start = end;
    }
    assert_eq!(w.len(), cot, "segments must tile the chain of thought");
    w.resize(n, uniform);
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advantages_are_group_normalized_and_flat_groups_are_zero() {
        let r = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0];
        let g = [0, 0, 0, 0, 1, 1, 1, 1];
        let (a, flat) = advantages(&r, &g, ScaleRewards::Group, 1e-4);
        assert_eq!(flat, 1);
        // Group 0: mean 0.25, unbiased std 0.5.
        assert!((a[0] - 0.75 / 0.5001).abs() < 1e-12);
        assert!((a[1] + 0.25 / 0.5001).abs() < 1e-12);
        assert!(a[4..].iter().all(|&x| x == 0.0));
        assert!((a[..4].iter().sum::<f64>()).abs() < 1e-12);
        let (a, _) = advantages(&r, &g, ScaleRewards::None, 1e-4);
        assert_eq!(a[..4], [0.75, -0.25, -0.25, -0.25]);
    }

    #[test]
    fn sigma_weights_keep_the_grpo_weight_sum_and_uniform_sigma_is_grpo() {
        let ends = [3usize, 4, 10];
        let sig = [0.5, 0.2, 0.3];
        for mix in [0.0, 0.3, 1.0] {
            let w = token_weights(10, Some((&sig, &ends)), mix);
            assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-12, "mix {mix}");
        }
        let w = token_weights(10, Some((&sig, &ends)), 1.0);
        assert!((w[0] - 0.5 / 3.0).abs() < 1e-12 && (w[3] - 0.2).abs() < 1e-12 && (w[9] - 0.05).abs() < 1e-12);
        // σ proportional to segment length is exactly GRPO's 1/|o|.
        let sig = [0.3, 0.1, 0.6];
        assert_eq!(token_weights(10, Some((&sig, &ends)), 1.0).iter().map(|x| (x * 1e12).round()).collect::<Vec<_>>(),
                   token_weights(10, None, 1.0).iter().map(|x| (x * 1e12).round()).collect::<Vec<_>>());
    }

    #[test]
    fn answer_tokens_after_the_chain_of_thought_keep_the_grpo_weight() {
        // Chain of thought 0..6 in two segments, then 4 answer tokens.
        let (ends, sig) = ([2usize, 6], [0.75, 0.25]);
        let w = token_weights(10, Some((&sig, &ends)), 1.0);
        assert_eq!(w.len(), 10);
        assert!(w[6..].iter().all(|&x| (x - 0.1).abs() < 1e-12), "{w:?}");
        // The chain of thought keeps its uniform share 6/10, redistributed by σ.
        assert!((w[0] - 0.75 * 0.6 / 2.0).abs() < 1e-12 && (w[5] - 0.25 * 0.6 / 4.0).abs() < 1e-12, "{w:?}");
        for mix in [0.0, 0.5, 1.0] {
            assert!((token_weights(10, Some((&sig, &ends)), mix).iter().sum::<f64>() - 1.0).abs() < 1e-12);
        }
        assert_eq!(token_weights(10, Some((&sig, &ends)), 0.0), token_weights(10, None, 0.0));
    }
}
