//! Correlation coefficients of paired samples: Pearson's r and Spearman's ρ (Pearson's r of the
//! ranks, ties given their average rank). Both are `None` where undefined: fewer than two pairs,
//! or a side without variation. And their p-values, as scipy's `pearsonr` / `spearmanr` give them.

use statrs::distribution::{ContinuousCDF, StudentsT};

/// Ranks 1..n of `x`, tied values sharing the mean of their ranks.
pub fn ranks(x: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let mut r = vec![0.0; x.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && x[order[j + 1]] == x[order[i]] {
            j += 1;
        }
        for &o in &order[i..=j] {
            r[o] = (i + j) as f64 / 2.0 + 1.0;
        }
        i = j + 1;
    }
    r
}

/// Pearson's correlation of `a` and `b` (equal lengths).
pub fn pearson(a: &[f64], b: &[f64]) -> Option<f64> {
    assert_eq!(a.len(), b.len(), "pearson: samples of different lengths");
    let n = a.len();
    if n < 2 {
        return None;
    }
    let (ma, mb) = (a.iter().sum::<f64>() / n as f64, b.iter().sum::<f64>() / n as f64);
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for (x, y) in a.iter().zip(b) {
        sab += (x - ma) * (y - mb);
        saa += (x - ma) * (x - ma);
        sbb += (y - mb) * (y - mb);
    }
    if saa <= 0.0 || sbb <= 0.0 {
        return None;
    }
    // One square root of the product, not a product of two: a perfect correlation of small
    // integers (ranks) comes out as exactly ±1, which a p-value with few degrees of freedom needs.
    let norm = (saa * sbb).sqrt();
    let norm = if norm.is_finite() && norm > 0.0 { norm } else { saa.sqrt() * sbb.sqrt() };
    Some((sab / norm).clamp(-1.0, 1.0))
}

/// Spearman's rank correlation of `a` and `b`.
pub fn spearman(a: &[f64], b: &[f64]) -> Option<f64> {
    pearson(&ranks(a), &ranks(b))
}

/// Two-sided p-value of a correlation `r` of `n` pairs against no correlation: Student's t with
/// n − 2 degrees of freedom, t = |r| √((n − 2) / (1 − r²)), as scipy's `pearsonr` (its exact beta
/// distribution is this t) and `spearmanr` (for ρ) compute it. It assumes independent pairs.
/// NaN for an undefined `r` or fewer than 3 pairs; 0 at |r| = 1.
pub fn correlation_p_value(r: f64, n: usize) -> f64 {
    if !r.is_finite() || n < 3 {
        return f64::NAN;
    }
    let df = (n - 2) as f64;
    let rest = 1.0 - r * r;
    if rest <= 0.0 {
        return 0.0;
    }
    let t = r.abs() * (df / rest).sqrt();
    let dist = StudentsT::new(0.0, 1.0, df).expect("n - 2 > 0 degrees of freedom");
    (2.0 * dist.sf(t)).min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_average_ties() {
        assert_eq!(ranks(&[10.0, 30.0, 20.0, 20.0]), vec![1.0, 4.0, 2.5, 2.5]);
        assert_eq!(ranks(&[]), Vec::<f64>::new());
    }

    #[test]
    fn hand_computed_coefficients() {
        // means 2 and 7/3; Σdxdy = 3, Σdx² = 2, Σdy² = 42/9: r = 9 / √84.
        let r = pearson(&[1.0, 2.0, 3.0], &[1.0, 2.0, 4.0]).unwrap();
        assert!((r - 9.0 / 84f64.sqrt()).abs() < 1e-12, "{r}");
        let close = |x: Option<f64>, want: f64| x.is_some_and(|x| (x - want).abs() < 1e-12);
        assert!(close(spearman(&[1.0, 2.0, 3.0], &[1.0, 2.0, 4.0]), 1.0));
        assert!(close(spearman(&[1.0, 2.0, 3.0], &[9.0, 5.0, 1.0]), -1.0));
        // d = (0, −1, 1) on ranks 1..3 of ρ = 1 − 6Σd²/(n(n²−1)) = 1 − 12/24.
        assert!(close(spearman(&[1.0, 2.0, 3.0], &[1.0, 3.0, 2.0]), 0.5));
        assert_eq!(pearson(&[1.0, 1.0, 1.0], &[1.0, 2.0, 3.0]), None);
        assert_eq!(spearman(&[1.0], &[2.0]), None);
    }

    #[test]
    fn p_values_of_hand_checked_coefficients() {
        // n = 4, r = 0.5: t = 0.5·√(2/0.75) = √(2/3); with 2 degrees of freedom the two-sided
        // p-value is 1 − t/√(t² + 2) = 1 − 1/√4 = 0.5.
        assert!((correlation_p_value(0.5, 4) - 0.5).abs() < 1e-12);
        assert!((correlation_p_value(-0.5, 4) - 0.5).abs() < 1e-12, "two-sided");
        assert_eq!(correlation_p_value(0.0, 10), 1.0);
        assert_eq!(correlation_p_value(1.0, 10), 0.0);
        assert!(correlation_p_value(0.9, 2).is_nan() && correlation_p_value(f64::NAN, 10).is_nan());
        // Stronger and more pairs: smaller.
        assert!(correlation_p_value(0.6, 30) < correlation_p_value(0.6, 10));
        assert!(correlation_p_value(0.8, 10) < correlation_p_value(0.6, 10));
    }
}
