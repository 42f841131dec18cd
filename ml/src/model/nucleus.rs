//! Top-p (nucleus) filtering: which tokens a sampling step drops.
//!
//! The definition is [`drop_by_sort`]'s: sort each row, drop a token once the probability mass
//! before it reaches `top_p`. A full sort of a row per decode step is costly on the CPU (a
//! `[8, 49152]` sort 29 ms on one thread, beside a 114 ms SmolLM2-135M decode step; `[8, 151936]`
//! 90 ms), while a sampled reasoning trace mostly sits where a few tokens hold the mass. So on the
//! CPU each row first tries [`threshold_from_top`]: its largest [`CANDIDATES`] logits settle the
//! nucleus when its edge is clear of `top_p` by [`margin`] (more than the two ways of summing the
//! mass can differ by) and falls between two different logits. Such a row drops exactly the
//! tokens the sort would; every other row is sorted. On a GPU every row is sorted: the per-row
//! decision would read back to the host each step, which a captured decode step cannot.

use tch::{Device, Kind, Tensor};

/// The largest logits of a row the fast path looks at: a nucleus of more tokens is sorted.
const CANDIDATES: i64 = 32;

/// How far (in probability mass) the nucleus' edge must be from `top_p` for the fast path to
/// decide a row of `v` logits. Both ways of computing the mass before a token round: the sort's
/// float32 softmax sums `v` terms in some order, which is off by at most `(v - 1) * 2^-24` of the
/// sum whatever the order, and this path's float32 `logsumexp` by as much; the rest (a few
/// roundings of the exponentials, the log, the cumulative sum of at most [`CANDIDATES`] terms, the
/// float64 sums here) stays below 1e-5, taken as 1e-4. So 0.0060 for SmolLM2's 49,152 tokens,
/// 0.0182 for Qwen's 151,936.
fn margin(v: i64) -> f64 {
    // Twice (v - 1) * 2^-24, float32's epsilon being 2^-23.
    (v - 1) as f64 * f64::from(f32::EPSILON) + 1e-4
}

/// Whether the fast path is off (`RREDCOT_TOP_P_SORT=1`): every row sorted, the reference the
/// benchmark measures against (bench/top_p.sh). Read once.
fn sort_always() -> bool {
    static SORT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SORT.get_or_init(|| std::env::var("RREDCOT_TOP_P_SORT").is_ok_and(|v| v == "1"))
}

/// The tokens of `scaled: [.., V]` (float32 logits / T, filtered tokens -inf) that top-p drops:
/// a bool tensor of the same shape.
pub fn top_p_drop(scaled: &Tensor, top_p: f64) -> Tensor {
    let size = scaled.size();
    let v = *size.last().expect("logits have a vocabulary dimension");
    // host: the fast path runs where its per-row decision costs no device synchronisation.
    if scaled.device() != Device::Cpu || sort_always() || scaled.numel() == 0 {
        return drop_by_sort(scaled, top_p);
    }
    let rows = scaled.reshape([-1, v]);
    let thresholds = thresholds_from_top(&rows, top_p);
    let sorted: Vec<i64> = (0..thresholds.len() as i64).filter(|&r| thresholds[r as usize].is_none()).collect();
    if sorted.len() == thresholds.len() {
        return drop_by_sort(scaled, top_p);
    }
    // A row that is sorted gets +inf here (drops all) and its sorted mask below.
    let limits: Vec<f32> = thresholds.iter().map(|t| t.unwrap_or(f32::INFINITY)).collect();
    let mut drop = rows.lt_tensor(&Tensor::from_slice(&limits).to_device(rows.device()).view([-1, 1]));
    if !sorted.is_empty() {
        let idx = Tensor::from_slice(&sorted).to_device(rows.device());
        drop = drop.index_copy(0, &idx, &drop_by_sort(&rows.index_select(0, &idx), top_p));
    }
    drop.view(size.as_slice())
}

/// The definition: per row, sort the logits and drop a token when the mass before it already
/// reaches `top_p` (so at least one token is kept).
pub fn drop_by_sort(scaled: &Tensor, top_p: f64) -> Tensor {
    let (sorted, idx) = scaled.sort(-1, true);
    let probs = sorted.softmax(-1, Kind::Float);
    let before = probs.cumsum(-1, Kind::Float) - &probs;
    let drop_sorted = before.ge(top_p);
    drop_sorted.scatter(-1, &idx, &drop_sorted)
}

/// Per row of `rows: [R, V]` (float32, on the CPU): the smallest logit the nucleus keeps, where
/// the row's [`CANDIDATES`] largest logits decide it beyond rounding, else `None` (sort the row).
fn thresholds_from_top(rows: &Tensor, top_p: f64) -> Vec<Option<f32>> {
    let (r, v) = (rows.size()[0], rows.size()[1]);
    let k = CANDIDATES.min(v);
    let (top, _) = rows.topk(k, -1, true, true);
    let lse = rows.logsumexp(-1, false);
    let (top, lse) = match (Vec::<f32>::try_from(top.contiguous().view([-1])), Vec::<f32>::try_from(lse)) {
        (Ok(top), Ok(lse)) => (top, lse),
        _ => return vec![None; r as usize],
    };
    let margin = margin(v);
    top.chunks(k as usize).zip(lse).map(|(top, lse)| threshold_from_top(top, lse, top_p, margin)).collect()
}

/// One row: `top` its largest logits in descending order, `lse` the log of its softmax's
/// denominator. The nucleus is the first `m` tokens where the mass before token `m` is the first
/// to reach `top_p`; the row is decided when that mass is at least `top_p + margin`, the mass
/// before token `m - 1` below `top_p - margin`, and token `m - 1`'s logit above token `m`'s (else
/// which of two equal logits the sort keeps depends on its order). Returns token `m - 1`'s logit:
/// the row keeps exactly the logits at or above it.
fn threshold_from_top(top: &[f32], lse: f32, top_p: f64, margin: f64) -> Option<f32> {
    if !lse.is_finite() {
        return None;
    }
    let mut before = 0.0f64;
    for m in 1..top.len() {
        let last = top[m - 1];
        if !last.is_finite() {
            return None;
        }
        let prev = before;
        before += (f64::from(last) - f64::from(lse)).exp();
        if before >= top_p - margin {
            let clear = prev < top_p - margin && before >= top_p + margin && last > top[m];
            return clear.then_some(last);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Rows that put the nucleus' edge everywhere: peaked and flat rows, edges next to top_p,
    /// equal logits on both sides of the edge (bf16-rounded logits, repeated values), -inf
    /// (top-k filtered) tokens, and rows that are not finite.
    fn hard_rows(rng: &mut ChaCha8Rng, v: i64) -> Tensor {
        let n = 96;
        let mut rows = Vec::with_capacity((n * v) as usize);
        for i in 0..n {
            let spread = [0.5f64, 2.0, 5.0, 12.0][(i % 4) as usize];
            let mut row: Vec<f32> = (0..v).map(|_| (rng.random::<f64>() * spread) as f32).collect();
            // A few leading tokens with a gap to the rest, so the nucleus is short.
            let lead = 1 + (i / 4) % 5;
            for t in 0..lead as usize {
                row[(t * 7) % v as usize] += (8.0 + 2.0 * rng.random::<f64>()) as f32;
            }
            match i % 6 {
                // Logits rounded to bfloat16 (8 bits): many equal values.
                1 => row.iter_mut().for_each(|x| *x = f32::from_bits(x.to_bits() & 0xffff_0000)),
                // The second and third largest equal.
                2 => {
                    let third = (2 * 7) % v as usize;
                    row[7 % v as usize] = row[0] - 1.0;
                    row[third] = row[0] - 1.0;
                }
                // top-k: most tokens filtered.
                3 => row.iter_mut().skip(5).for_each(|x| *x = f32::NEG_INFINITY),
                _ => {}
            }
            if i == n - 1 {
                row[3] = f32::NAN;
            }
            if i == n - 2 {
                row[1] = f32::INFINITY;
            }
            rows.extend(row);
        }
        Tensor::from_slice(&rows).view([n, v])
    }

    /// A row of `v` logits whose first tokens have the probabilities `masses`, the rest of the mass
    /// spread evenly over the other tokens.
    fn row_of(masses: &[f64], v: i64) -> Vec<f32> {
        let rest = (1.0 - masses.iter().sum::<f64>()) / (v - masses.len() as i64) as f64;
        let mut row = vec![rest.ln() as f32; v as usize];
        for (x, m) in row.iter_mut().zip(masses) {
            *x = m.ln() as f32;
        }
        row
    }

    #[test]
    fn top_p_drops_what_the_sort_drops() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut decided = 0;
        let mut total = 0;
        for v in [5i64, 40, 49_152] {
            let rows = hard_rows(&mut rng, v);
            for top_p in [0.05, 0.3, 0.5, 0.8, 0.9, 0.95, 0.99] {
                let fast = top_p_drop(&rows, top_p);
                let sorted = drop_by_sort(&rows, top_p);
                assert!(fast.equal(&sorted), "V = {v}, top_p = {top_p}: masks differ");
                decided += thresholds_from_top(&rows, top_p).iter().filter(|t| t.is_some()).count();
                total += rows.size()[0] as usize;
            }
        }
        // The fast path decides most of these rows (the test would pass vacuously otherwise).
        assert!(decided * 2 > total, "fast path took {decided} of {total} rows");
    }

    #[test]
    fn rows_at_the_edge_of_top_p_are_sorted() {
        // The mass of the first tokens a few float32 roundings either side of top_p: the two ways
        // of summing the mass may disagree on which side it falls, so these rows must be sorted.
        for v in [100i64, 49_152, 151_936] {
            for top_p in [0.5, 0.9, 0.95] {
                let mut rows = Vec::new();
                for k in -40..=40 {
                    let a = top_p + f64::from(k) * 3e-8;
                    rows.extend(row_of(&[a * 0.7, a * 0.3, (1.0 - a) * 0.9], v));
                }
                let rows = Tensor::from_slice(&rows).view([-1, v]);
                let fast = top_p_drop(&rows, top_p);
                let sorted = drop_by_sort(&rows, top_p);
                let differ = fast.ne_tensor(&sorted).any_dim(-1, false).sum(Kind::Int64).int64_value(&[]);
                assert_eq!(differ, 0, "V = {v}, top_p = {top_p}: {differ} rows differ");
            }
        }
    }

    #[test]
    fn the_fast_path_leaves_unclear_rows_to_the_sort() {
        // Qwen's vocabulary: a margin of 0.018.
        let v = 151_936;
        assert!((margin(v) - 0.0182).abs() < 1e-4 && (margin(49_152) - 0.0060).abs() < 1e-4);
        let decide = |masses: &[f64], p: f64| {
            let row = row_of(masses, v);
            let lse = Tensor::from_slice(&row).logsumexp(-1, false).double_value(&[]) as f32;
            let mut top = row;
            top.sort_by(|x, y| y.total_cmp(x));
            threshold_from_top(&top[..CANDIDATES as usize], lse, p, margin(v))
        };
        let logit = |m: f64| Some(m.ln() as f32);
        // Clear: the first token alone reaches 0.9 with room to spare; 0.6 + 0.38 needs both.
        assert_eq!(decide(&[0.97, 0.02], 0.9), logit(0.97));
        assert_eq!(decide(&[0.6, 0.38], 0.9), logit(0.38));
        assert_eq!(decide(&[0.5, 0.2, 0.19], 0.6), logit(0.2));
        // The edge within the margin of top_p, either side: sorted.
        assert_eq!(decide(&[0.91, 0.05], 0.9), None);
        assert_eq!(decide(&[0.89, 0.1], 0.9), None);
        // Equal logits across the edge: which one the sort keeps depends on its order.
        assert_eq!(decide(&[0.5, 0.2, 0.2], 0.6), None);
        // top_p within the margin of 0: sorted.
        assert_eq!(decide(&[0.97, 0.02], 0.01), None);
        // Not finite: sorted.
        assert_eq!(threshold_from_top(&[1.0, 0.5], f32::NAN, 0.9, margin(v)), None);
        // A nucleus that does not end within the candidates: sorted.
        assert_eq!(threshold_from_top(&[0.0; CANDIDATES as usize], (v as f32).ln(), 0.9, margin(v)), None);
    }

    #[test]
    fn rows_of_a_batch_get_their_own_path() {
        // One clear row and one that must be sorted (its edge 0.005 from top_p, within the
        // margin of Qwen's vocabulary), in one batch and in another shape.
        let v = 151_936;
        let mut rows = row_of(&[0.97, 0.02], v);
        rows.extend(row_of(&[0.905, 0.05], v));
        let rows = Tensor::from_slice(&rows).view([2, 1, v]);
        let decided = thresholds_from_top(&rows.view([2, v]), 0.9);
        assert!(decided[0].is_some() && decided[1].is_none());
        let fast = top_p_drop(&rows, 0.9);
        assert_eq!(fast.size(), vec![2, 1, v]);
        assert!(fast.equal(&drop_by_sort(&rows, 0.9)));
    }
}
