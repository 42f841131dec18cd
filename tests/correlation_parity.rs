//! The analysis stage's correlation statistics (paper Fig. 4: Spearman ρ, Pearson r and their
//! two-sided p-values) against scipy 1.17's `spearmanr` / `pearsonr` on the same samples: small
//! and large samples, weak, strong, negative and perfect correlations, ties, constant sides.
//! Skips (printing SKIP) where scipy is not installed (`make test-deps` installs it).

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use rand::{Rng, SeedableRng};
use rredcot::analysis::stats::{correlation_p_value, pearson, spearman};

/// Samples (a, b) of n pairs where b = slope·a + noise, values rounded to `digits` decimals
/// (few digits: many ties).
fn sample(rng: &mut rand_chacha::ChaCha8Rng, n: usize, slope: f64, digits: i32) -> (Vec<f64>, Vec<f64>) {
    let scale = 10f64.powi(digits);
    let round = |x: f64| (x * scale).round() / scale;
    let a: Vec<f64> = (0..n).map(|_| round(rng.random::<f64>())).collect();
    let b: Vec<f64> = a.iter().map(|x| round(slope * x + rng.random::<f64>() - 0.5)).collect();
    (a, b)
}

#[test]
fn coefficients_and_p_values_equal_scipys() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
    let mut cases: Vec<(Vec<f64>, Vec<f64>)> = Vec::new();
    for n in [3, 4, 5, 8, 20, 50, 200, 1000] {
        for slope in [0.0, 0.3, 2.0, -1.0, 25.0] {
            for digits in [1, 6] {
                cases.push(sample(&mut rng, n, slope, digits));
            }
        }
    }
    // Perfect, reversed and constant sides.
    let up: Vec<f64> = (0..10).map(f64::from).collect();
    cases.push((up.clone(), up.iter().map(|x| 3.0 * x + 1.0).collect()));
    cases.push((up.clone(), up.iter().map(|x| -x).collect()));
    cases.push((up.clone(), vec![0.5; 10]));

    let mut child = match Command::new(common::python())
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/correlation_parity.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => panic!("python: {e}"),
    };
    child.stdin.take().unwrap().write_all(serde_json::to_string(&cases).unwrap().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("No module named 'scipy'") {
        println!("SKIP correlation_parity: scipy is not installed (run `make test-deps`)");
        return;
    }
    assert!(out.status.success(), "scipy reference failed: {stderr}");
    let scipy: Vec<[Option<f64>; 4]> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(scipy.len(), cases.len());

    let (mut compared, mut worst_coef, mut worst_log_p) = (0, 0.0f64, 0.0f64);
    for (i, ((a, b), want)) in cases.iter().zip(&scipy).enumerate() {
        let n = a.len();
        let (rho, r) = (spearman(a, b), pearson(a, b));
        let ours = [rho, rho.map(|x| correlation_p_value(x, n)), r, r.map(|x| correlation_p_value(x, n))];
        for (k, (o, w)) in ours.iter().zip(want).enumerate() {
            let what = ["spearman", "spearman p", "pearson", "pearson p"][k];
            match (o, w) {
                (None, None) => {}
                (Some(o), Some(w)) if k % 2 == 0 => {
                    worst_coef = worst_coef.max((o - w).abs());
                    assert!((o - w).abs() <= 1e-12, "case {i} (n = {n}) {what}: ours {o}, scipy {w}");
                }
                (Some(o), Some(w)) => {
                    // Relative agreement; below 1e-12 a p-value is set by the last bits of a
                    // coefficient within round-off of ±1 (0 on one side, 1e-24 on the other), so
                    // both must only be that small.
                    if o.min(*w) < 1e-12 {
                        assert!(o.max(*w) < 1e-12, "case {i} (n = {n}) {what}: ours {o}, scipy {w}");
                        compared += 1;
                        continue;
                    }
                    let gap = (o.ln() - w.ln()).abs();
                    worst_log_p = worst_log_p.max(gap);
                    assert!(gap <= 1e-8, "case {i} (n = {n}) {what}: ours {o}, scipy {w}");
                }
                _ => panic!("case {i} (n = {n}) {what}: ours {o:?}, scipy {w:?}: one side undefined"),
            }
            compared += 1;
        }
    }
    println!("{compared} statistics of {} samples: max |Δcoefficient| {worst_coef:.1e}, max |Δ ln p| {worst_log_p:.1e}", cases.len());
    assert!(compared >= 4 * (cases.len() - 1), "every defined statistic compared");
}
