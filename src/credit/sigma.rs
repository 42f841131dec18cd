//! RREDCoT's redistribution σ from the value curves (paper Algorithm 1, DESIGN §5).
//!
//! Given R_t = log p(y* | x, u_1..u_t) and v_t = log p(u* | x, u_1..u_t) for t = 0..T,
//! σ_t^unnorm = (R_t − R_{t−1}) + (v_t − v_{t−1}) for t = 1..T, so Σ_t σ_t^unnorm telescopes to
//! (R_T − R_0) + (v_T − v_0) (return equivalence). Normalization:
//! - `l1`: σ_t = |σ_t^unnorm| / Σ|σ^unnorm| — the paper's L1 normalization applied to the
//!   magnitudes, so σ is a distribution over segments (≥ 0, Σσ = 1) that replaces GRPO's uniform
//!   1/|o| while the outcome advantage keeps the sign.
//! - `signed_l1`: σ_t = σ_t^unnorm / Σ|σ^unnorm| (Σ|σ| = 1, signs kept; for analysis).
//! - `softmax`: σ = softmax(σ^unnorm) (paper §3.3 when bootstrapping on the model's own answer).
//! - `none`: σ = σ^unnorm.
//!
//! When Σ|σ^unnorm| = 0 (or is not finite) `l1`/`signed_l1` cannot normalize: σ falls back to
//! uniform 1/T and the caller counts it.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Normalize {
    L1,
    SignedL1,
    Softmax,
    None,
}

/// Which value terms enter σ^unnorm (the paper's full method, or the ablations).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Terms {
    /// ΔR + Δv.
    Both,
    /// ΔR only (answer probability).
    Answer,
    /// Δv only (reference-solution probability).
    Solution,
}

impl Terms {
    pub fn uses_answer(self) -> bool {
        matches!(self, Terms::Both | Terms::Answer)
    }

    pub fn uses_solution(self) -> bool {
        matches!(self, Terms::Both | Terms::Solution)
    }
}

/// σ^unnorm from the value curves (each of length T + 1, or empty when the term is unused).
pub fn unnormalized(r: &[f64], v: &[f64], terms: Terms) -> Vec<f64> {
    let diffs = |x: &[f64]| x.windows(2).map(|w| w[1] - w[0]).collect::<Vec<f64>>();
    let (dr, dv) = (diffs(r), diffs(v));
    let t = dr.len().max(dv.len());
    (0..t)
        .map(|i| {
            let a = if terms.uses_answer() { dr[i] } else { 0.0 };
            let s = if terms.uses_solution() { dv[i] } else { 0.0 };
            a + s
        })
        .collect()
}

/// Normalized σ and whether the uniform fallback was used.
pub fn normalize(unnorm: &[f64], how: Normalize) -> (Vec<f64>, bool) {
    let t = unnorm.len();
    let uniform = || (vec![1.0 / t as f64; t], true);
    match how {
        Normalize::None => (unnorm.to_vec(), false),
        Normalize::L1 | Normalize::SignedL1 => {
            let mass: f64 = unnorm.iter().map(|x| x.abs()).sum();
            if !(mass.is_finite() && mass > 0.0) {
                return uniform();
            }
            let f = |x: f64| if how == Normalize::L1 { x.abs() } else { x };
            (unnorm.iter().map(|&x| f(x) / mass).collect(), false)
        }
        Normalize::Softmax => {
            if unnorm.iter().any(|x| !x.is_finite()) {
                return uniform();
            }
            let m = unnorm.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = unnorm.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            (e.iter().map(|x| x / z).collect(), false)
        }
    }
}

/// Shannon entropy (nats) of a normalized σ (how concentrated the credit is).
pub fn entropy(sigma: &[f64]) -> f64 {
    -sigma.iter().filter(|&&p| p > 0.0).map(|p| p * p.ln()).sum::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn curve(rng: &mut ChaCha8Rng, n: usize) -> Vec<f64> {
        (0..n).map(|_| rng.random_range(-30.0..0.0)).collect()
    }

    #[test]
    fn unnormalized_sigma_telescopes_to_the_end_to_end_change() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..200 {
            let n = rng.random_range(2..60);
            let (r, v) = (curve(&mut rng, n), curve(&mut rng, n));
            let s: f64 = unnormalized(&r, &v, Terms::Both).iter().sum();
            let want = (r[n - 1] - r[0]) + (v[n - 1] - v[0]);
            assert!((s - want).abs() < 1e-9, "{s} vs {want}");
            let s: f64 = unnormalized(&r, &v, Terms::Answer).iter().sum();
            assert!((s - (r[n - 1] - r[0])).abs() < 1e-9);
            let s: f64 = unnormalized(&r, &[], Terms::Answer).iter().sum();
            assert!((s - (r[n - 1] - r[0])).abs() < 1e-9, "the v curve may be absent when unused");
            let s: f64 = unnormalized(&[], &v, Terms::Solution).iter().sum();
            assert!((s - (v[n - 1] - v[0])).abs() < 1e-9);
        }
    }

    #[test]
    fn l1_and_softmax_give_a_distribution_per_trace() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        for _ in 0..200 {
            let n = rng.random_range(2..60);
            let u = unnormalized(&curve(&mut rng, n), &curve(&mut rng, n), Terms::Both);
            for how in [Normalize::L1, Normalize::Softmax] {
                let (s, fell_back) = normalize(&u, how);
                assert!(!fell_back);
                assert!((s.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{how:?}");
                assert!(s.iter().all(|&x| x >= 0.0));
            }
            let (s, _) = normalize(&u, Normalize::SignedL1);
            assert!((s.iter().map(|x| x.abs()).sum::<f64>() - 1.0).abs() < 1e-9);
            assert!(s.iter().zip(&u).all(|(a, b)| a.signum() == b.signum() || *b == 0.0));
            // L1 is proportional to the magnitudes.
            let (l1, _) = normalize(&u, Normalize::L1);
            let ratio = l1[0] / u[0].abs();
            assert!(l1.iter().zip(&u).all(|(a, b)| (a - ratio * b.abs()).abs() < 1e-9));
        }
    }

    #[test]
    fn flat_curves_fall_back_to_uniform() {
        let r = vec![-2.0; 5];
        let u = unnormalized(&r, &r, Terms::Both);
        let (s, fell_back) = normalize(&u, Normalize::L1);
        assert!(fell_back);
        assert_eq!(s, vec![0.25; 4]);
        let (s, fell_back) = normalize(&[f64::NAN, 1.0], Normalize::L1);
        assert!(fell_back);
        assert_eq!(s, vec![0.5; 2]);
        // Softmax of a flat curve is uniform without needing a fallback.
        let (s, fell_back) = normalize(&u, Normalize::Softmax);
        assert!(!fell_back);
        assert_eq!(s, vec![0.25; 4]);
        assert!((entropy(&s) - 4f64.ln()).abs() < 1e-12);
    }
}
