//! Correlation coefficients of paired samples: Pearson's r and Spearman's ρ (Pearson's r of the
//! ranks, ties given their average rank). Both are `None` where undefined: fewer than two pairs,
//! or a side without variation.

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
    Some((sab / (saa.sqrt() * sbb.sqrt())).clamp(-1.0, 1.0))
}

/// Spearman's rank correlation of `a` and `b`.
pub fn spearman(a: &[f64], b: &[f64]) -> Option<f64> {
    pearson(&ranks(a), &ranks(b))
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
}
