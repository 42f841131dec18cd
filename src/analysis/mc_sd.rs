//! Paper Fig. 7: the standard deviation of the Monte Carlo value estimate against the number of
//! completions k' it averages, as `score_mc` writes it (`mc_sd`: bootstrapped from the k drawn and
//! binomial, averaged over exit points), and the first k' where the bootstrap SD falls below a
//! threshold (the paper: 0.1 after about 5 samples).

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// One row of `score_mc`'s `mc_sd` table (`score_mc` writes this type).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SdIn {
    pub k: i32,
    pub sd_bootstrap: f64,
    pub sd_binomial: f64,
    pub exit_points: i32,
}

pub const COLUMNS: &[&str] = &["k", "sd_bootstrap", "sd_binomial", "exit_points"];

/// One row of the `mc_sd` table: an input row labelled with its member.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SdRow {
    pub label: String,
    pub k: i32,
    pub sd_bootstrap: f64,
    pub sd_binomial: f64,
    pub exit_points: i32,
}

/// The rows of input `member` (label `label`) in order of k; k must be distinct.
pub fn rows(member: &str, label: &str, input: &[SdIn]) -> Result<Vec<SdRow>> {
    if input.is_empty() {
        bail!("input `{member}`: no rows");
    }
    let mut out: Vec<SdRow> = input
        .iter()
        .map(|r| SdRow { label: label.into(), k: r.k, sd_bootstrap: r.sd_bootstrap, sd_binomial: r.sd_binomial, exit_points: r.exit_points })
        .collect();
    out.sort_by_key(|r| r.k);
    if let Some(w) = out.windows(2).find(|w| w[0].k == w[1].k) {
        bail!("input `{member}`: k = {} appears twice", w[0].k);
    }
    Ok(out)
}

/// The smallest k whose bootstrap SD is below `threshold` (rows in order of k).
pub fn first_below(rows: &[SdRow], threshold: f64) -> Option<i32> {
    rows.iter().find(|r| r.sd_bootstrap < threshold).map(|r| r.k)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sd(k: i32, boot: f64) -> SdIn {
        SdIn { k, sd_bootstrap: boot, sd_binomial: 0.5 / (k as f64).sqrt(), exit_points: 7 }
    }

    #[test]
    fn rows_pass_through_sorted_and_the_threshold_is_crossed_once() {
        let r = rows("mc_sd.k20", "k20", &[sd(3, 0.09), sd(1, 0.4), sd(2, 0.12), sd(4, 0.11)]).unwrap();
        assert_eq!(r.iter().map(|r| r.k).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
        assert_eq!((r[0].label.as_str(), r[0].sd_bootstrap, r[0].sd_binomial, r[0].exit_points), ("k20", 0.4, 0.5, 7));
        assert_eq!(first_below(&r, 0.1), Some(3), "the first k below, even if a later one rises again");
        assert_eq!(first_below(&r, 0.05), None);
        assert!(rows("mc_sd.k20", "k20", &[]).unwrap_err().to_string().contains("mc_sd.k20"));
        assert!(rows("mc_sd.k20", "k20", &[sd(1, 0.4), sd(1, 0.3)]).unwrap_err().to_string().contains("k = 1 appears twice"));
    }
}
