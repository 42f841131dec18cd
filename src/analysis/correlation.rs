//! Paper Fig. 4: how well each credit method's per-segment σ agrees with a reference method's
//! (the Monte Carlo values) along the trace. Segment t (0-based) of a trace of T segments sits at
//! position (t + ½) / T, its centre as a fraction of the trace's segments ([`by_segment`]), or at
//! its middle token as a fraction of the trace's tokens ([`by_token`]). The pairs
//! (σ_method, σ_reference) of all traces are pooled per position window and correlated:
//! - `bin`: `bins` equal windows [i/bins, (i+1)/bins);
//! - `from_right`: the last fraction f = j/bins of every trace (the paper's x-axis: "percent of
//!   the trace used from the right"), j = 1..bins;
//! - `per_trace`: Spearman/Pearson within each trace over its T segments, averaged over the
//!   traces where it is defined (`n` counts them).
//!
//! Window membership is decided in integers, so no segment lands in a window by rounding. σ sums to 1
//! within a trace, so a pooled window mixes the scales of traces of different T; `per_trace` does
//! not. A pooled window's coefficients carry their p-values (the paper plots log p beside ρ); these
//! treat the pairs as independent, which segments of one trace are not, so they overstate the
//! evidence. A mean over traces has none.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Result};
use serde::Serialize;

use super::stats::{correlation_p_value, pearson, spearman};
use crate::artifact::rows::{ScoreRow, SegmentRow};
use crate::credit::segmentation::checked_ends;

/// One row of the `correlations` table. Undefined coefficients (a window with < 2 pairs, or one
/// side constant) are NaN.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CorrelationRow {
    pub method: String,
    pub reference: String,
    /// `bin`, `from_right` or `per_trace`.
    pub view: String,
    pub pos_lo: f64,
    pub pos_hi: f64,
    pub spearman: f64,
    pub pearson: f64,
    /// Two-sided p-values of `spearman` and `pearson` ([`correlation_p_value`]); NaN for
    /// `per_trace` and where the coefficient is undefined.
    pub spearman_p: f64,
    pub pearson_p: f64,
    /// Pairs (segments) pooled, or traces averaged for `per_trace`.
    pub n: i64,
}

/// Rows by their trace (prompt, sample), each with its row number.
type ByTrace<'a, R> = BTreeMap<(&'a str, i32), (usize, &'a R)>;

/// `rows` (input `member`) by their trace; a trace met twice is an error (`what`: "scored",
/// "segmented").
fn by_trace<'a, R>(member: &str, rows: &'a [R], trace: impl Fn(&'a R) -> (&'a str, i32), what: &str) -> Result<ByTrace<'a, R>> {
    let mut by_key = BTreeMap::new();
    for (i, r) in rows.iter().enumerate() {
        let (prompt, sample) = trace(r);
        if let Some((j, _)) = by_key.insert((prompt, sample), (i, r)) {
            bail!("input `{member}` rows {j} and {i}: trace prompt {prompt} sample {sample} {what} twice");
        }
    }
    Ok(by_key)
}

/// Checks that `rows` (input `member`) scores exactly the reference's traces with the same
/// segment counts, and returns its σ in the reference's trace order.
pub fn align<'a>(member: &str, rows: &'a [ScoreRow], reference: &str, refs: &[ScoreRow]) -> Result<Vec<&'a [f64]>> {
    let mut by_key = by_trace(member, rows, |r| (r.prompt_id.as_str(), r.sample_idx), "scored")?;
    let mut out = Vec::with_capacity(refs.len());
    for (i, want) in refs.iter().enumerate() {
        let Some((j, got)) = by_key.remove(&(want.prompt_id.as_str(), want.sample_idx)) else {
            bail!("input `{member}`: no row for trace prompt {} sample {} (row {i} of reference `{reference}`): the methods must score the same traces", want.prompt_id, want.sample_idx);
        };
        if got.sigma.len() != want.sigma.len() {
            bail!(
                "input `{member}` row {j} (prompt {} sample {}): {} segments, but reference `{reference}` row {i} has {}: the methods must share one segmentation",
                got.prompt_id,
                got.sample_idx,
                got.sigma.len(),
                want.sigma.len()
            );
        }
        out.push(got.sigma.as_slice());
    }
    if let Some((_, (j, extra))) = by_key.into_iter().min_by_key(|(_, (j, _))| *j) {
        bail!("input `{member}` row {j}: trace prompt {} sample {} is not scored by reference `{reference}`", extra.prompt_id, extra.sample_idx);
    }
    Ok(out)
}

/// Where the segments of one trace sit: each one's centre and the trace's length, both doubled so
/// that they are integers (in segments or in tokens).
#[derive(Debug, Clone, PartialEq)]
pub struct TracePositions {
    centres2: Vec<u64>,
    total2: u64,
}

/// Each trace's segments by index (trace i has `sigma[i].len()` segments): segment t of T at
/// (t + ½)/T.
pub fn by_segment(sigma: &[&[f64]]) -> Vec<TracePositions> {
    sigma.iter().map(|s| of_segments(s.len())).collect()
}

fn of_segments(total: usize) -> TracePositions {
    TracePositions { centres2: (0..total as u64).map(|t| 2 * t + 1).collect(), total2: 2 * total as u64 }
}

/// Each trace's segments at their middle token: segment [s, e) of a trace of n tokens (what its
/// segments tile: the chain of thought) sits at
/// ((s + e)/2)/n, so a long segment takes the room it has in the text. `rows` (input `member`)
/// must give the reference's traces segments that tile them ([`checked_ends`]), as many as their
/// σ has.
pub fn by_token(member: &str, rows: &[SegmentRow], reference: &str, refs: &[ScoreRow]) -> Result<Vec<TracePositions>> {
    let by_key = by_trace(member, rows, |r| (r.prompt_id.as_str(), r.sample_idx), "segmented")?;
    let mut out = Vec::with_capacity(refs.len());
    for (i, want) in refs.iter().enumerate() {
        let Some(&(j, got)) = by_key.get(&(want.prompt_id.as_str(), want.sample_idx)) else {
            bail!("input `{member}`: no segments for trace prompt {} sample {} (row {i} of reference `{reference}`)", want.prompt_id, want.sample_idx);
        };
        let at = format!("input `{member}` row {j} (prompt {} sample {})", got.prompt_id, got.sample_idx);
        let n = got.seg_ends.last().map_or(0, |&e| e.max(0) as usize);
        let ends = checked_ends(&got.seg_starts, &got.seg_ends, n).map_err(|e| anyhow!("{at}: {e}"))?;
        if ends.len() != want.sigma.len() {
            bail!("{at}: {} segments, but reference `{reference}` row {i} scores {}: wire the segmentation the methods scored", ends.len(), want.sigma.len());
        }
        out.push(TracePositions { centres2: got.seg_starts.iter().zip(&ends).map(|(&s, &e)| (s as usize + e) as u64).collect(), total2: 2 * n as u64 });
    }
    Ok(out)
}

/// The bin (0..bins) of a segment centred at c of a trace of length L: ⌊c/L · bins⌋.
fn bin_of(centre2: u64, total2: u64, bins: usize) -> usize {
    ((centre2 * bins as u64 / total2) as usize).min(bins - 1)
}

/// Whether a segment centred at c of a trace of length L lies in its last j/bins: c/L ≥ 1 − j/bins.
fn in_last(centre2: u64, total2: u64, j: usize, bins: usize) -> bool {
    centre2 * bins as u64 >= total2 * (bins - j) as u64
}

fn row(method: &str, reference: &str, view: &str, lo: f64, hi: f64, a: &[f64], b: &[f64]) -> CorrelationRow {
    let (rho, r) = (spearman(a, b).unwrap_or(f64::NAN), pearson(a, b).unwrap_or(f64::NAN));
    CorrelationRow {
        method: method.into(),
        reference: reference.into(),
        view: view.into(),
        pos_lo: lo,
        pos_hi: hi,
        spearman: rho,
        pearson: r,
        spearman_p: correlation_p_value(rho, a.len()),
        pearson_p: correlation_p_value(r, a.len()),
        n: a.len() as i64,
    }
}

/// The rows of one method against the reference: `sigma[i]` and `reference_sigma[i]` are trace
/// i's σ (equal lengths, as `align` checked), its segments at `positions[i]`.
pub fn correlate(method: &str, reference: &str, sigma: &[&[f64]], reference_sigma: &[&[f64]], positions: &[TracePositions], bins: usize) -> Vec<CorrelationRow> {
    assert!(bins > 0, "bins must be positive");
    let mut binned = vec![(Vec::new(), Vec::new()); bins];
    let mut right = vec![(Vec::new(), Vec::new()); bins];
    let (mut rho, mut r) = (Vec::new(), Vec::new());
    for ((m, rf), at) in sigma.iter().zip(reference_sigma).zip(positions) {
        for (t, &c) in at.centres2.iter().enumerate() {
            let b = &mut binned[bin_of(c, at.total2, bins)];
            b.0.push(m[t]);
            b.1.push(rf[t]);
            for (j, w) in right.iter_mut().enumerate() {
                if in_last(c, at.total2, j + 1, bins) {
                    w.0.push(m[t]);
                    w.1.push(rf[t]);
                }
            }
        }
        rho.extend(spearman(m, rf));
        r.extend(pearson(m, rf));
    }
    let f = |i: usize| i as f64 / bins as f64;
    let mut out: Vec<CorrelationRow> = binned.iter().enumerate().map(|(i, (a, b))| row(method, reference, "bin", f(i), f(i + 1), a, b)).collect();
    out.extend(right.iter().enumerate().map(|(j, (a, b))| row(method, reference, "from_right", 1.0 - f(j + 1), 1.0, a, b)));
    let mean = |v: &[f64]| if v.is_empty() { f64::NAN } else { v.iter().sum::<f64>() / v.len() as f64 };
    out.push(CorrelationRow {
        method: method.into(),
        reference: reference.into(),
        view: "per_trace".into(),
        pos_lo: 0.0,
        pos_hi: 1.0,
        spearman: mean(&rho),
        pearson: mean(&r),
        spearman_p: f64::NAN,
        pearson_p: f64::NAN,
        n: rho.len() as i64,
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn score(id: &str, sample: i32, sigma: &[f64]) -> ScoreRow {
        ScoreRow { prompt_id: id.into(), sample_idx: sample, r: vec![], v: vec![], sigma: sigma.to_vec(), method: "m".into() }
    }

    fn view<'a>(rows: &'a [CorrelationRow], v: &str) -> Vec<&'a CorrelationRow> {
        rows.iter().filter(|r| r.view == v).collect()
    }

    #[test]
    fn segments_fall_in_the_bin_of_their_centre() {
        let bins = |total: usize, bins: usize| of_segments(total).centres2.iter().map(|&c| bin_of(c, 2 * total as u64, bins)).collect::<Vec<_>>();
        let last = |total: usize, j: usize, bins: usize| of_segments(total).centres2.iter().filter(|&&c| in_last(c, 2 * total as u64, j, bins)).count();
        // T = 4, 2 bins: centres 1/8, 3/8 | 5/8, 7/8.
        assert_eq!(bins(4, 2), vec![0, 0, 1, 1]);
        // T = 3, 3 bins: one segment each; T = 1: the middle bin.
        assert_eq!(bins(3, 3), vec![0, 1, 2]);
        assert_eq!(bins(1, 4), vec![2]);
        // The last quarter of a trace of 4 is its last segment; the last half, two.
        assert_eq!((last(4, 1, 4), last(4, 2, 4), last(4, 4, 4)), (1, 2, 4));
    }

    fn segs(id: &str, sample: i32, ends: &[i32]) -> SegmentRow {
        let starts = std::iter::once(0).chain(ends.iter().copied()).take(ends.len()).collect();
        SegmentRow { prompt_id: id.into(), sample_idx: sample, seg_starts: starts, seg_ends: ends.to_vec(), method: "m".into() }
    }

    #[test]
    fn by_tokens_a_long_segment_takes_its_room() {
        // Segments of 1, 1 and 8 tokens: by index at 1/6, 1/2, 5/6 (bins 0, 1, 1 of 2); by tokens
        // at 0.05, 0.15, 0.6 (bins 0, 0, 1): only the long one is in the last half.
        let refs = vec![score("p", 0, &[0.2, 0.3, 0.5])];
        let at = by_token("segments.s", &[segs("p", 0, &[1, 2, 10])], "scores.mc", &refs).unwrap();
        assert_eq!(at, vec![TracePositions { centres2: vec![1, 3, 12], total2: 20 }]);
        assert_eq!(at[0].centres2.iter().map(|&c| bin_of(c, 20, 2)).collect::<Vec<_>>(), vec![0, 0, 1]);
        let m = [vec![1.0, 2.0, 3.0]];
        let m: Vec<&[f64]> = m.iter().map(|v| v.as_slice()).collect();
        let rf: Vec<&[f64]> = refs.iter().map(|r| r.sigma.as_slice()).collect();
        let n_last_half = |p: &[TracePositions]| view(&correlate("x", "mc", &m, &rf, p, 2), "from_right")[0].n;
        assert_eq!((n_last_half(&by_segment(&rf)), n_last_half(&at)), (2, 1));

        let err = |rows: &[SegmentRow]| by_token("segments.s", rows, "scores.mc", &refs).unwrap_err().to_string();
        let e = err(&[segs("p", 0, &[1, 10])]);
        assert!(e.contains("`segments.s` row 0 (prompt p sample 0): 2 segments") && e.contains("scores 3"), "{e}");
        let e = err(&[segs("q", 0, &[1, 2, 10])]);
        assert!(e.contains("no segments for trace prompt p sample 0"), "{e}");
        let mut gap = segs("p", 0, &[1, 2, 10]);
        gap.seg_starts[2] = 3;
        let e = err(&[gap]);
        assert!(e.contains("row 0") && e.contains("do not tile"), "{e}");
        let e = err(&[segs("p", 0, &[1, 2, 10]), segs("p", 0, &[1, 2, 10])]);
        assert!(e.contains("segmented twice"), "{e}");
    }

    #[test]
    fn identical_reversed_and_constant_sigma() {
        let reference = [vec![0.1, 0.2, 0.3, 0.4], vec![0.4, 0.1, 0.3, 0.2]];
        let refs: Vec<&[f64]> = reference.iter().map(|v| v.as_slice()).collect();
        let same = correlate("same", "mc", &refs, &refs, &by_segment(&refs), 2);
        assert_eq!(same.len(), 2 + 2 + 1);
        for r in &same {
            assert!((r.spearman - 1.0).abs() < 1e-12 && (r.pearson - 1.0).abs() < 1e-12, "{r:?}");
        }
        assert_eq!(view(&same, "bin").iter().map(|r| r.n).collect::<Vec<_>>(), vec![4, 4]);
        assert_eq!(view(&same, "from_right").iter().map(|r| (r.pos_lo, r.n)).collect::<Vec<_>>(), vec![(0.5, 4), (0.0, 8)]);
        assert_eq!(view(&same, "per_trace")[0].n, 2);

        let negated: Vec<Vec<f64>> = reference.iter().map(|v| v.iter().map(|x| -x).collect()).collect();
        let neg: Vec<&[f64]> = negated.iter().map(|v| v.as_slice()).collect();
        for r in correlate("rev", "mc", &neg, &refs, &by_segment(&refs), 2) {
            assert!((r.spearman + 1.0).abs() < 1e-12 && (r.pearson + 1.0).abs() < 1e-12, "{r:?}");
        }

        let flat = [vec![0.25; 4], vec![0.25; 4]];
        let flat: Vec<&[f64]> = flat.iter().map(|v| v.as_slice()).collect();
        let rows = correlate("uniform", "mc", &flat, &refs, &by_segment(&refs), 2);
        assert!(rows.iter().all(|r| r.spearman.is_nan() && r.pearson.is_nan()), "{rows:?}");
        assert_eq!(view(&rows, "per_trace")[0].n, 0, "no trace has a defined correlation");
        assert_eq!(view(&rows, "bin")[1].n, 4, "undefined windows still count their pairs");
    }

    #[test]
    fn pooled_bins_by_hand() {
        // 2 traces × 4 segments, 2 bins. First halves: method (1,2,3,4) vs reference (1,2,4,3):
        // ρ = 1 − 6·2/(4·15) = 0.8. Second halves: (1,2,3,4) vs (4,3,2,1): ρ = −1.
        let m = [vec![1.0, 2.0, 1.0, 2.0], vec![3.0, 4.0, 3.0, 4.0]];
        let rf = [vec![1.0, 2.0, 2.0, 1.0], vec![4.0, 3.0, 0.0, -1.0]];
        let m: Vec<&[f64]> = m.iter().map(|v| v.as_slice()).collect();
        let rf: Vec<&[f64]> = rf.iter().map(|v| v.as_slice()).collect();
        let rows = correlate("x", "mc", &m, &rf, &by_segment(&rf), 2);
        let bins = view(&rows, "bin");
        assert!((bins[0].spearman - 0.8).abs() < 1e-12, "{:?}", bins[0]);
        assert!((bins[1].spearman + 1.0).abs() < 1e-12, "{:?}", bins[1]);
        // ρ = 0.8 of 4 pairs: p = 0.2 (t = 0.8·√(2/0.36), 2 degrees of freedom); ρ = −1: p ≈ 0.
        assert!((bins[0].spearman_p - 0.2).abs() < 1e-9 && bins[1].spearman_p < 1e-12, "{bins:?}");
        assert!(view(&rows, "per_trace")[0].spearman_p.is_nan(), "a mean over traces has no p-value");
        let last_half = view(&rows, "from_right")[0];
        assert_eq!((last_half.pos_lo, last_half.spearman, last_half.n), (0.5, bins[1].spearman, 4), "the last half is the second bin");
    }

    #[test]
    fn traces_must_match_the_reference() {
        let refs = vec![score("p1", 0, &[0.5, 0.5]), score("p2", 1, &[1.0])];
        let ok = vec![score("p2", 1, &[0.7]), score("p1", 0, &[0.2, 0.8])];
        assert_eq!(align("scores.loo", &ok, "scores.mc20", &refs).unwrap(), vec![&[0.2, 0.8][..], &[0.7][..]], "reordered to the reference");
        let err = |rows: Vec<ScoreRow>| align("scores.loo", &rows, "scores.mc20", &refs).unwrap_err().to_string();
        let e = err(vec![score("p1", 0, &[0.5, 0.5])]);
        assert!(e.contains("scores.loo") && e.contains("prompt p2 sample 1"), "{e}");
        let e = err(vec![score("p1", 0, &[1.0]), score("p2", 1, &[1.0])]);
        assert!(e.contains("`scores.loo` row 0") && e.contains("1 segments") && e.contains("has 2"), "{e}");
        let e = err(vec![score("p1", 0, &[0.5, 0.5]), score("p2", 1, &[1.0]), score("p3", 0, &[1.0])]);
        assert!(e.contains("row 2") && e.contains("p3"), "{e}");
        let e = err(vec![score("p1", 0, &[0.5, 0.5]), score("p1", 0, &[0.5, 0.5])]);
        assert!(e.contains("scored twice"), "{e}");
    }
}
