//! Paper Fig. 3: the share of Monte Carlo completions lost to truncation, against the truncation
//! length. Each `completions` artifact (from `score_mc`) gives one point: its `max_new_tokens`
//! column (the limit the completions were sampled under; one value per artifact), the fraction
//! truncated (hit the limit) and the fraction lost (truncated without an explicit final answer).

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// The columns of a `score_mc` completion this analysis reads.
#[derive(Debug, Clone, Deserialize)]
pub struct Completion {
    pub tokens: i32,
    pub correct: bool,
    pub truncated: bool,
    pub lost: bool,
    pub max_new_tokens: i32,
}

pub const COLUMNS: &[&str] = &["tokens", "correct", "truncated", "lost", "max_new_tokens"];

/// One row of the `truncation` table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TruncationRow {
    pub label: String,
    pub max_new_tokens: i32,
    pub completions: i64,
    pub truncated_fraction: f64,
    pub lost_fraction: f64,
    /// Completions the verifier finds correct (lost ones included, with their verdict).
    pub correct_fraction: f64,
    pub mean_tokens: f64,
}

/// The row of input `member` (label `label`) from its completions.
pub fn summarize(member: &str, label: &str, rows: &[Completion]) -> Result<TruncationRow> {
    let Some(first) = rows.first() else {
        bail!("input `{member}`: no completions");
    };
    if let Some((i, c)) = rows.iter().enumerate().find(|(_, c)| c.max_new_tokens != first.max_new_tokens) {
        bail!("input `{member}` row {i}: max_new_tokens {} but row 0 has {}: one truncation length per artifact", c.max_new_tokens, first.max_new_tokens);
    }
    let n = rows.len() as f64;
    let frac = |f: fn(&Completion) -> bool| rows.iter().filter(|c| f(c)).count() as f64 / n;
    Ok(TruncationRow {
        label: label.into(),
        max_new_tokens: first.max_new_tokens,
        completions: rows.len() as i64,
        truncated_fraction: frac(|c| c.truncated),
        lost_fraction: frac(|c| c.lost),
        correct_fraction: frac(|c| c.correct),
        mean_tokens: rows.iter().map(|c| c.tokens as f64).sum::<f64>() / n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(tokens: i32, correct: bool, truncated: bool, lost: bool) -> Completion {
        Completion { tokens, correct, truncated, lost, max_new_tokens: 8 }
    }

    #[test]
    fn fractions_of_a_hand_made_table() {
        let rows = [c(8, false, true, true), c(8, true, true, false), c(3, true, false, false), c(5, false, false, false)];
        let r = summarize("completions.t8", "t8", &rows).unwrap();
        assert_eq!(
            r,
            TruncationRow {
                label: "t8".into(),
                max_new_tokens: 8,
                completions: 4,
                truncated_fraction: 0.5,
                lost_fraction: 0.25,
                correct_fraction: 0.5,
                mean_tokens: 6.0
            }
        );
        let e = summarize("completions.t8", "t8", &[]).unwrap_err().to_string();
        assert!(e.contains("completions.t8") && e.contains("no completions"), "{e}");
        let mixed = [c(8, false, true, true), Completion { max_new_tokens: 16, ..c(3, true, false, false) }];
        let e = summarize("completions.t8", "t8", &mixed).unwrap_err().to_string();
        assert!(e.contains("row 1") && e.contains("16"), "{e}");
    }
}
