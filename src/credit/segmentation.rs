//! Splitting a completion's tokens into contiguous segments u_1..u_T (paper §3.1, Fig. 2 left).
//!
//! A segmentation is a list of cut positions `0 < c_1 < … < c_{T-1} < n`: token `c` starts a new
//! segment. Segments therefore exactly tile the `n` completion tokens and are never empty.
//!
//! - `keyword`: cut after every token that ends a line (contains `\n`) and before every token in
//!   which a keyword word ("Wait", "But", …) starts. If that gives more than `max_segments`,
//!   adjacent segments with the fewest tokens are merged.
//! - `entropy`: cut before the `max_segments − 1` tokens with the highest sampling entropy (the
//!   "exit points": the prefix ends just before a high-plurality choice).
//! - `hybrid`: keyword cuts, then repeatedly merge the adjacent pair with the lowest combined
//!   entropy (sum of their tokens' entropies) until ≤ `max_segments` (Fig. 2b–c), then
//!   homogenize (Fig. 2d): each remaining boundary may slide to another keyword cut between its
//!   two neighbours' outer edges so that their total entropies are as equal as possible.
//!
//! Every cut of `keyword` and `hybrid` is a keyword cut. Knows nothing of tokenizers or models:
//! callers pass the decoded text of each token and its entropy.

use serde::{Deserialize, Serialize};

/// Segmentation method (stage param `method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    Keyword,
    Entropy,
    Hybrid,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Keyword => "keyword",
            Method::Entropy => "entropy",
            Method::Hybrid => "hybrid",
        }
    }
}

/// Keywords of the paper and Hammoud et al. (2025); `\n` means "after a line break".
pub fn default_keywords() -> Vec<String> {
    ["\n", "Wait", "But", "However", "Alternatively", "Hmm", "So", "Therefore", "Let me", "Step"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Params {
    pub method: Method,
    pub keywords: Vec<String>,
    pub max_segments: usize,
    /// Hybrid only: run the homogenization pass.
    pub homogenize: bool,
}

/// Candidate cuts from keywords (sorted, in `1..n`).
pub fn keyword_cuts(token_texts: &[String], keywords: &[String]) -> Vec<usize> {
    let n = token_texts.len();
    // Char offset of each token's first byte in the concatenated text.
    let mut starts = Vec::with_capacity(n);
    let mut text = String::new();
    for t in token_texts {
        starts.push(text.len());
        text.push_str(t);
    }
    let token_at = |byte: usize| starts.partition_point(|&s| s <= byte) - 1;
    let mut cuts = Vec::new();
    for kw in keywords {
        if kw.is_empty() {
            continue;
        }
        if kw.chars().all(char::is_whitespace) {
            // A separator: the segment ends with the token that holds the separator's last byte.
            for (at, _) in text.match_indices(kw.as_str()) {
                cuts.push(token_at(at + kw.len() - 1) + 1);
            }
            continue;
        }
        // A word: only at a word start and a word end (so "But" does not match "Butter").
        for (at, _) in text.match_indices(kw.as_str()) {
            let before = text[..at].chars().next_back();
            let after = text[at + kw.len()..].chars().next();
            let boundary = |c: Option<char>| c.is_none_or(|c| !c.is_alphanumeric());
            if boundary(before) && boundary(after) {
                cuts.push(token_at(at));
            }
        }
    }
    // Whitespace joins the segment it follows: a cut before a token of only whitespace moves
    // past it, so a tokenizer that writes a blank line as two "\n" tokens (SmolLM2, Qwen) gives
    // one cut after both, not a segment of one "\n" (on SmolLM2 σ put up to 0.98 of a trace's
    // credit on such a token).
    let blank = |t: &String| t.chars().all(char::is_whitespace);
    for c in cuts.iter_mut() {
        while *c < n && blank(&token_texts[*c]) {
            *c += 1;
        }
    }
    cuts.retain(|&c| c > 0 && c < n);
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}

/// Sum of `weights` over each segment defined by `cuts` (tiling `0..weights.len()`).
fn segment_sums(cuts: &[usize], weights: &[f64]) -> Vec<f64> {
    bounds(cuts, weights.len()).iter().map(|&(s, e)| weights[s..e].iter().sum()).collect()
}

/// Merges adjacent segments with the lowest combined weight until at most `max_segments` remain
/// (ties: the leftmost pair).
fn merge_lowest(mut cuts: Vec<usize>, weights: &[f64], max_segments: usize) -> Vec<usize> {
    let max_cuts = max_segments.max(1) - 1;
    let mut sums = segment_sums(&cuts, weights);
    while cuts.len() > max_cuts {
        let (mut best, mut best_w) = (0, f64::INFINITY);
        for i in 0..sums.len() - 1 {
            let w = sums[i] + sums[i + 1];
            if w < best_w {
                (best, best_w) = (i, w);
            }
        }
        cuts.remove(best);
        sums[best] = best_w;
        sums.remove(best + 1);
    }
    cuts
}

/// Slides each cut to the keyword cut between its neighbours that best equalizes the two adjacent
/// segments' weights; sweeps until nothing moves (bounded).
fn homogenize(mut cuts: Vec<usize>, candidates: &[usize], weights: &[f64]) -> Vec<usize> {
    let n = weights.len();
    let mut prefix = vec![0.0; n + 1];
    for (i, w) in weights.iter().enumerate() {
        prefix[i + 1] = prefix[i] + w;
    }
    let imbalance = |lo: usize, c: usize, hi: usize| ((prefix[c] - prefix[lo]) - (prefix[hi] - prefix[c])).abs();
    for _sweep in 0..16 {
        let mut moved = false;
        for i in 0..cuts.len() {
            let lo = if i == 0 { 0 } else { cuts[i - 1] };
            let hi = if i + 1 == cuts.len() { n } else { cuts[i + 1] };
            let mut best = cuts[i];
            let mut best_gap = imbalance(lo, best, hi);
            let from = candidates.partition_point(|&c| c <= lo);
            for &c in candidates[from..].iter().take_while(|&&c| c < hi) {
                let gap = imbalance(lo, c, hi);
                // Strict improvement (beyond rounding) keeps the sweep from oscillating.
                if gap < best_gap - 1e-9 {
                    (best, best_gap) = (c, gap);
                }
            }
            if best != cuts[i] {
                cuts[i] = best;
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    cuts
}

/// The cuts of one completion. `entropies` must be finite for `entropy` and `hybrid`.
pub fn segment(token_texts: &[String], entropies: &[f32], p: &Params) -> Vec<usize> {
    let n = token_texts.len();
    let weights: Vec<f64> = entropies.iter().map(|&e| e as f64).collect();
    match p.method {
        Method::Keyword => {
            let ones = vec![1.0; n];
            merge_lowest(keyword_cuts(token_texts, &p.keywords), &ones, p.max_segments)
        }
        Method::Entropy => {
            let mut order: Vec<usize> = (1..n).collect();
            // Highest entropy first; ties go to the earlier position (stable sort).
            order.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]));
            let mut cuts: Vec<usize> = order.into_iter().take(p.max_segments.max(1) - 1).collect();
            cuts.sort_unstable();
            cuts
        }
        Method::Hybrid => {
            let candidates = keyword_cuts(token_texts, &p.keywords);
            let merged = merge_lowest(candidates.clone(), &weights, p.max_segments);
            if p.homogenize {
                homogenize(merged, &candidates, &weights)
            } else {
                merged
            }
        }
    }
}

/// `[start, end)` token ranges of the segments defined by `cuts` over `n` tokens.
pub fn bounds(cuts: &[usize], n: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(cuts.len() + 1);
    let mut start = 0;
    for &c in cuts.iter().chain(std::iter::once(&n)) {
        out.push((start, c));
        start = c;
    }
    out
}

/// The ends of a `segments` row (`starts`/`ends`, end exclusive), checked to tile a completion of
/// `n` tokens with non-empty segments: what every consumer of segments relies on.
pub fn checked_ends(starts: &[i32], ends: &[i32], n: usize) -> Result<Vec<usize>, String> {
    if starts.len() != ends.len() || starts.is_empty() {
        return Err(format!("{} starts and {} ends", starts.len(), ends.len()));
    }
    let mut expect = 0usize;
    for (&s, &e) in starts.iter().zip(ends) {
        if s as usize != expect || e <= s {
            return Err(format!("segments do not tile the completion (segment {s}..{e}, expected a start at {expect})"));
        }
        expect = e as usize;
    }
    if expect != n {
        return Err(format!("segments end at token {expect}, the completion has {n} tokens"));
    }
    Ok(ends.iter().map(|&e| e as usize).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn texts(s: &[&str]) -> Vec<String> {
        s.iter().map(|t| t.to_string()).collect()
    }

    fn params(method: Method, max: usize) -> Params {
        Params { method, keywords: default_keywords(), max_segments: max, homogenize: true }
    }

    /// Tiling, count and non-emptiness: the properties every method must keep.
    fn check_tiling(cuts: &[usize], n: usize, max: usize) {
        let b = bounds(cuts, n);
        assert!(b.len() <= max.max(1), "{} segments > max {max}", b.len());
        assert_eq!(b.first().unwrap().0, 0);
        assert_eq!(b.last().unwrap().1, n);
        for w in b.windows(2) {
            assert_eq!(w[0].1, w[1].0, "segments must touch");
        }
        for (s, e) in b {
            assert!(s < e, "empty segment {s}..{e} in {cuts:?}");
        }
    }

    #[test]
    fn segment_rows_must_tile_the_completion() {
        assert_eq!(checked_ends(&[0, 3], &[3, 5], 5), Ok(vec![3, 5]));
        assert!(checked_ends(&[0, 4], &[3, 5], 5).unwrap_err().contains("tile"));
        assert!(checked_ends(&[0], &[4], 5).unwrap_err().contains("5 tokens"));
        assert!(checked_ends(&[0, 3], &[3, 3], 3).is_err(), "empty segment");
        assert!(checked_ends(&[], &[], 0).is_err());
    }

    #[test]
    fn keyword_cuts_follow_lines_and_whole_words() {
        let t = texts(&["Start", " with", " 5", ".\n", "Add", " 3", ":", " 8", ".", " Wait", ",", " Butter", " But", " no"]);
        // After ".\n" (index 3) -> cut 4; before " Wait" (9); " Butter" is not "But"; before " But" (12).
        assert_eq!(keyword_cuts(&t, &default_keywords()), vec![4, 9, 12]);
        // A newline inside a token ends the segment with that token.
        let t = texts(&["a", "b\nc", "d"]);
        assert_eq!(keyword_cuts(&t, &texts(&["\n"])), vec![2]);
        // No keyword: one segment.
        let t = texts(&["x", "y"]);
        assert!(segment(&t, &[0.1, 0.2], &params(Method::Hybrid, 40)).is_empty());
    }

    #[test]
    fn whitespace_joins_the_segment_it_follows() {
        // A blank line written as two "\n" tokens: one cut, after both.
        let t = texts(&["Step", " 1", ".", "\n", "\n", "Step", " 2", "\n", "  ", "x", "\n", "\n"]);
        assert_eq!(keyword_cuts(&t, &texts(&["\n"])), vec![5, 9]);
        // With words too: "Step" still cuts before itself, the blank line stays with step 1.
        assert_eq!(keyword_cuts(&t, &texts(&["\n", "Step"])), vec![5, 9]);
        // No segment of only whitespace, whatever the method.
        for method in [Method::Keyword, Method::Hybrid] {
            let cuts = segment(&t, &[0.5; 12], &params(method, 40));
            for (s, e) in bounds(&cuts, t.len()) {
                assert!(t[s..e].iter().any(|x| !x.trim().is_empty()), "{method:?}: blank segment {s}..{e} of {cuts:?}");
            }
        }
    }

    #[test]
    fn a_keyword_spanning_tokens_cuts_before_its_first_token() {
        let t = texts(&["1", " W", "ait", " 2"]);
        assert_eq!(keyword_cuts(&t, &texts(&["Wait"])), vec![1]);
    }

    #[test]
    fn entropy_method_cuts_before_the_highest_entropy_tokens() {
        let t = texts(&["a"; 6]);
        let e = [9.0, 0.1, 5.0, 0.2, 3.0, 0.3];
        // Token 0 cannot start a new segment; the top two of 1..6 are 2 (5.0) and 4 (3.0).
        assert_eq!(segment(&t, &e, &params(Method::Entropy, 3)), vec![2, 4]);
    }

    #[test]
    fn hybrid_merges_the_lowest_entropy_pair_first() {
        // Four lines; entropies per line sum to 1, 1, 10, 10.
        let t = texts(&["a\n", "b\n", "c\n", "d"]);
        let e = [1.0, 1.0, 10.0, 10.0];
        let p = Params { homogenize: false, ..params(Method::Hybrid, 3) };
        assert_eq!(segment(&t, &e, &p), vec![2, 3]);
        // Down to two: merge (a b)=2 with c=10 -> 12 is lower than c+d=20.
        let p = Params { homogenize: false, ..params(Method::Hybrid, 2) };
        assert_eq!(segment(&t, &e, &p), vec![3]);
    }

    #[test]
    fn homogenization_never_increases_the_imbalance() {
        let t = texts(&["a\n", "b\n", "c\n", "d\n", "e\n", "f"]);
        let e = [4.0, 0.5, 0.5, 0.5, 0.5, 4.0];
        let candidates = keyword_cuts(&t, &default_keywords());
        let weights: Vec<f64> = e.to_vec();
        let before = vec![1];
        let after = homogenize(before.clone(), &candidates, &weights);
        let spread = |c: &[usize]| {
            let s = segment_sums(c, &weights);
            s.iter().cloned().fold(f64::MIN, f64::max) - s.iter().cloned().fold(f64::MAX, f64::min)
        };
        assert!(spread(&after) < spread(&before), "{after:?}");
        assert_eq!(after, vec![3]);
    }

    #[test]
    fn every_method_tiles_random_traces_and_keeps_keyword_boundaries() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let pieces = [" 3", " +", "\n", " Wait", ",", " But", " x", "=", " 12", ".\n", "So", " ok", "But", "ter"];
        for case in 0..300 {
            let n = rng.random_range(1..200);
            let t: Vec<String> = (0..n).map(|_| pieces[rng.random_range(0..pieces.len())].to_string()).collect();
            let e: Vec<f32> = (0..n).map(|_| rng.random_range(0.0..3.0)).collect();
            let max = rng.random_range(1..50);
            let kw = keyword_cuts(&t, &default_keywords());
            for method in [Method::Keyword, Method::Entropy, Method::Hybrid] {
                let cuts = segment(&t, &e, &params(method, max));
                check_tiling(&cuts, n, max);
                if method != Method::Entropy {
                    assert!(cuts.iter().all(|c| kw.contains(c)), "case {case} {method:?}: {cuts:?} not within {kw:?}");
                }
                if method == Method::Keyword && kw.len() < max {
                    assert_eq!(cuts, kw, "case {case}: under the limit, keyword keeps every keyword cut");
                }
            }
        }
    }
}
