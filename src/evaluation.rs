//! avg@k summaries of an `eval` artifact: per benchmark, the mean over problems of the fraction
//! of a problem's k samples judged correct, with its standard error over problems. The eval stage
//! reports these as metrics and the report stage recomputes them from the artifact.

use std::collections::BTreeMap;

use crate::artifact::rows::EvalRow;

/// Which per-sample verdict a summary counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grader {
    Verifier,
    /// The LLM judge's majority vote (`correct_judge`; rows without a verdict are skipped).
    Judge,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BenchmarkSummary {
    pub benchmark: String,
    pub problems: usize,
    pub samples: usize,
    /// Samples per problem (the largest seen; avg@k with this k).
    pub k: usize,
    pub mean: f64,
    /// Standard error of `mean` over problems (sample SD / √n; 0 for one problem).
    pub stderr: f64,
    /// Samples whose answer the verifier could not extract (counted wrong).
    pub unparseable: usize,
}

/// One summary per benchmark, in benchmark order. Rows without a verdict from `grader` are left
/// out (a problem with none is not counted).
pub fn summarize(rows: &[EvalRow], grader: Grader) -> Vec<BenchmarkSummary> {
    // benchmark -> problem -> (correct, graded)
    let mut per: BTreeMap<&str, BTreeMap<&str, (usize, usize)>> = BTreeMap::new();
    let mut unparseable: BTreeMap<&str, usize> = BTreeMap::new();
    for r in rows {
        *unparseable.entry(&r.benchmark).or_default() += r.answer.is_none() as usize;
        let verdict = match grader {
            Grader::Verifier => Some(r.correct_verifier),
            Grader::Judge => r.correct_judge,
        };
        let e = per.entry(&r.benchmark).or_default().entry(&r.prompt_id).or_default();
        if let Some(ok) = verdict {
            e.0 += ok as usize;
            e.1 += 1;
        }
    }
    per.into_iter()
        .map(|(b, problems)| {
            let fracs: Vec<f64> = problems.values().filter(|(_, n)| *n > 0).map(|(c, n)| *c as f64 / *n as f64).collect();
            let n = fracs.len();
            let mean = if n == 0 { f64::NAN } else { fracs.iter().sum::<f64>() / n as f64 };
            let stderr = if n < 2 {
                0.0
            } else {
                (fracs.iter().map(|f| (f - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt() / (n as f64).sqrt()
            };
            BenchmarkSummary {
                benchmark: b.to_string(),
                problems: n,
                samples: problems.values().map(|(_, g)| g).sum(),
                k: problems.values().map(|(_, g)| *g).max().unwrap_or(0),
                mean,
                stderr,
                unparseable: unparseable[b],
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(b: &str, p: &str, i: i32, ok: bool, judge: Option<bool>) -> EvalRow {
        EvalRow {
            prompt_id: p.into(),
            benchmark: b.into(),
            sample_idx: i,
            question: String::new(),
            reference: Some("1".into()),
            text: String::new(),
            answer: if ok { Some("1".into()) } else { None },
            correct_verifier: ok,
            correct_judge: judge,
        }
    }

    #[test]
    fn avg_at_k_is_the_mean_of_per_problem_fractions_with_its_standard_error() {
        // Problem a: 2/2, b: 1/2, c: 0/2 -> fractions 1, .5, 0: mean .5, SD .5, stderr .5/√3.
        let rows = vec![
            row("x", "a", 0, true, Some(true)),
            row("x", "a", 1, true, Some(false)),
            row("x", "b", 0, true, None),
            row("x", "b", 1, false, Some(true)),
            row("x", "c", 0, false, Some(false)),
            row("x", "c", 1, false, Some(false)),
            row("y", "a", 0, true, None),
        ];
        let s = summarize(&rows, Grader::Verifier);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].benchmark.as_str(), s[0].problems, s[0].samples, s[0].k, s[0].unparseable), ("x", 3, 6, 2, 3));
        assert!((s[0].mean - 0.5).abs() < 1e-12 && (s[0].stderr - 0.5 / 3f64.sqrt()).abs() < 1e-12, "{s:?}");
        assert_eq!((s[1].mean, s[1].stderr), (1.0, 0.0));
        // Judge verdicts: a .5, b 1 (one graded), c 0; y has none.
        let j = summarize(&rows, Grader::Judge);
        assert!((j[0].mean - 0.5).abs() < 1e-12 && j[0].samples == 5, "{j:?}");
        assert!(j[1].mean.is_nan() && j[1].problems == 0);
    }
}
