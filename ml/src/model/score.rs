//! Teacher-forced scoring: log-probabilities of continuations given prefixes.
//!
//! - [`logprob`]: many independent (prefix, continuation) pairs, right-padded into batches.
//! - [`score_cuts`]: the RREDCoT special case (DESIGN §5). One trace `x, u_1..u_T`, cut points
//!   `c_0 < … < c_T` and targets (y*, u*): every `log p(target | trace[..c])`. The trace is run
//!   **once**; its per-layer keys/values are then shared by all (cut, target) rows, each row
//!   attending to the trace keys before its cut (a block mask) and causally to its own target.
//! - [`score_cuts_batch`]: many traces at once, rows shared between them scored once, the rest
//!   in packed passes (what `score_sigma` runs).
//! - [`score_cuts_naive`]: the test oracle, one full prefill per (cut, target).

use std::collections::HashMap;

use tch::{Device, Kind, Tensor};

use super::decoder::{causal_bias, DecoderLm, MASKED};
use super::error::{check_finite, ModelError, Result};
use super::head::{head_logprobs, logprobs_at};
use super::layers::{AttnMask, KvCache};

/// Most (row × token) positions whose logits are materialised at once.
const LOGIT_ROWS: i64 = 1024;

/// Padding cells a chunk of target rows may carry beyond a quarter of its real ones (a few
/// padded cells cost less than another forward call).
const PAD_SLACK: i64 = 8;

/// Per-token `log p(continuation_i | prefix_i)` for every pair, in batches of `batch_size`.
pub fn logprob(
    model: &DecoderLm,
    pairs: &[(Vec<i64>, Vec<i64>)],
    batch_size: usize,
) -> Result<Vec<Vec<f32>>> {
    let dev = model.device();
    let mut out = Vec::with_capacity(pairs.len());
    for (chunk_i, chunk) in pairs.chunks(batch_size.max(1)).enumerate() {
        let base = chunk_i * batch_size.max(1);
        for (i, (pre, cont)) in chunk.iter().enumerate() {
            if pre.is_empty() {
                return Err(ModelError::Request(format!(
                    "row {}: empty prefix",
                    base + i
                )));
            }
            model.check_ids(pre, base + i, cont.len())?;
            model.check_ids(cont, base + i, pre.len())?;
        }
        let b = chunk.len() as i64;
        let len = chunk
            .iter()
            .map(|(p, c)| p.len() + c.len())
            .max()
            .unwrap_or(1) as i64;
        let mut ids = vec![0i64; (b * len) as usize];
        let mut mask = vec![0i64; (b * len) as usize];
        for (r, (p, c)) in chunk.iter().enumerate() {
            for (j, t) in p.iter().chain(c.iter()).enumerate() {
                ids[r * len as usize + j] = *t;
                mask[r * len as usize + j] = 1;
            }
        }
        let ids = Tensor::from_slice(&ids).view([b, len]).to_device(dev);
        let mask = Tensor::from_slice(&mask).view([b, len]).to_device(dev);
        let pos = Tensor::arange(len, (Kind::Int64, dev))
            .unsqueeze(0)
            .expand([b, len], false);
        let rows = tch::no_grad(|| {
            let bias = causal_bias(b, len, 0, Some(&mask), model.kind(), dev);
            let h = model.hidden(&ids, &pos, &AttnMask::Bias(bias), None);
            let mut rows = Vec::with_capacity(chunk.len());
            for (r, (p, c)) in chunk.iter().enumerate() {
                if c.is_empty() {
                    rows.push(Ok(vec![]));
                    continue;
                }
                let hr = h
                    .get(r as i64)
                    .narrow(0, p.len() as i64 - 1, c.len() as i64);
                let tgt = Tensor::from_slice(c).to_device(dev);
                let lp = match head_logprobs(model, &hr, &tgt.unsqueeze(1), base + r) {
                    Ok(lp) => lp.view([-1]),
                    Err(e) => {
                        rows.push(Err(e));
                        continue;
                    }
                };
                rows.push(Ok(
                    Vec::<f32>::try_from(lp.to_device(Device::Cpu)).unwrap_or_default()
                ));
            }
            rows
        });
        for r in rows {
            out.push(r?);
        }
    }
    Ok(out)
}

fn validate_cuts(model: &DecoderLm, q: &CutRequest) -> Result<()> {
    let CutRequest { trace, cuts, targets, picks } = *q;
    let longest = targets.iter().map(Vec::len).max().unwrap_or(0);
    model.check_ids(trace, 0, longest)?;
    for (i, t) in targets.iter().enumerate() {
        if t.is_empty() {
            return Err(ModelError::Request(format!("target {i} is empty")));
        }
        model.check_ids(t, i, trace.len())?;
    }
    if let Some(bad) = cuts.iter().find(|&&c| c == 0 || c > trace.len()) {
        return Err(ModelError::Request(format!(
            "cut point {bad} outside 1..={} (the trace length)",
            trace.len()
        )));
    }
    if let Some(picks) = picks {
        if picks.len() != cuts.len() {
            return Err(ModelError::Request(format!("{} target picks for {} cuts", picks.len(), cuts.len())));
        }
        if let Some((i, &bad)) = picks.iter().enumerate().find_map(|(i, p)| Some((i, p.iter().find(|&&j| j >= targets.len())?))) {
            return Err(ModelError::Request(format!("cut {i} picks target {bad} of {}", targets.len())));
        }
    }
    Ok(())
}

/// `out[i][j] = log p(targets[j] | trace[..cuts[i]])` (summed over the target's tokens), with the
/// trace prefix computed once and shared (see the module docs).
pub fn score_cuts(
    model: &DecoderLm,
    trace: &[i64],
    cuts: &[usize],
    targets: &[Vec<i64>],
) -> Result<Vec<Vec<f64>>> {
    let mut out = score_cuts_many(model, &[CutRequest::every_target(trace, cuts, targets)])?;
    Ok(out.pop().unwrap_or_default())
}

/// Per request, per cut, per target the cut scores: the summed log-probability of the target
/// after the cut.
pub type CutScores = Vec<Vec<Vec<f64>>>;

/// One trace to score at its cut points (the arguments of [`score_cuts`]), every target at every
/// cut or, with `picks`, each cut its own targets.
#[derive(Debug, Clone, Copy)]
pub struct CutRequest<'a> {
    pub trace: &'a [i64],
    pub cuts: &'a [usize],
    pub targets: &'a [Vec<i64>],
    /// Per cut, the indices into `targets` it scores, in the order of its values (`None`: every
    /// target). RREDCoT's y* and u* are written one way after a cut that ends a line and another
    /// after one that does not: a cut asks for one form of each, and scoring the others too
    /// costs positions and gives values nobody reads.
    pub picks: Option<&'a [Vec<usize>]>,
}

impl<'a> CutRequest<'a> {
    /// Every target scored at every cut.
    pub fn every_target(trace: &'a [i64], cuts: &'a [usize], targets: &'a [Vec<i64>]) -> Self {
        CutRequest { trace, cuts, targets, picks: None }
    }

    /// How many targets cut `i` scores.
    pub fn targets_at(&self, i: usize) -> usize {
        self.picks.map_or(self.targets.len(), |p| p[i].len())
    }

    /// The `s`-th target cut `i` scores.
    pub fn target(&self, i: usize, s: usize) -> &'a [i64] {
        &self.targets[self.picks.map_or(s, |p| p[i][s])]
    }

    /// Every (cut index, target slot) row, cut by cut.
    fn rows(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.cuts.len()).flat_map(move |i| (0..self.targets_at(i)).map(move |s| (i, s)))
    }
}

/// (request, index into its `own_cuts`, target slot) that scores a row.
type RowSource = (usize, usize, usize);

/// Rows that several requests share. A row is (prefix `trace[..cut]`, target); two rows with the
/// same prefix tokens and target tokens have the same log-probability, so only the first is
/// scored. In a GRPO group every trace's cut at the prompt end is the same row, and samples that
/// begin alike share their early cuts too (exact token equality, no hashing).
#[derive(Debug)]
pub struct SharedRows {
    /// Per request, the cut positions it scores itself (the first occurrence of at least one of
    /// its rows), ascending; empty when all its rows were scored by earlier requests.
    own_cuts: Vec<Vec<usize>>,
    /// Per request with picks, those of its own cuts.
    own_picks: Vec<Option<Vec<Vec<usize>>>>,
    /// Per request, cut index and target slot: (request, index into its `own_cuts`, target slot)
    /// that scores the row.
    source: Vec<Vec<Vec<RowSource>>>,
    reused: usize,
}

impl SharedRows {
    /// Finds the first occurrence of every row, in request order (cuts within their traces:
    /// [`score_cuts_batch`] checks them first).
    pub fn find(reqs: &[CutRequest]) -> Self {
        // (prefix, target) -> (request, index into its own cuts, target) that scores it.
        let mut first: HashMap<(&[i64], &[i64]), RowSource> = HashMap::new();
        let mut owner = Vec::with_capacity(reqs.len());
        let mut reused = 0;
        for (r, q) in reqs.iter().enumerate() {
            let rows: Vec<Vec<RowSource>> = (0..q.cuts.len())
                .map(|i| {
                    (0..q.targets_at(i))
                        .map(|s| {
                            let at = *first.entry((&q.trace[..q.cuts[i]], q.target(i, s))).or_insert((r, i, s));
                            reused += (at.0 != r || at.1 != i) as usize;
                            at
                        })
                        .collect()
                })
                .collect();
            owner.push(rows);
        }
        // Cut indices → positions among the owning request's own cuts.
        let own_idx: Vec<Vec<usize>> = owner
            .iter()
            .enumerate()
            .map(|(r, rows)| (0..rows.len()).filter(|&i| rows[i].iter().any(|&(sr, si, _)| (sr, si) == (r, i))).collect())
            .collect();
        let source = owner
            .iter()
            .map(|rows| {
                rows.iter()
                    .map(|row| {
                        row.iter()
                            .map(|&(sr, si, sj)| (sr, own_idx[sr].binary_search(&si).expect("an owned cut"), sj))
                            .collect()
                    })
                    .collect()
            })
            .collect();
        let own_cuts = own_idx.iter().zip(reqs).map(|(idx, q)| idx.iter().map(|&i| q.cuts[i]).collect()).collect();
        let own_picks = own_idx.iter().zip(reqs).map(|(idx, q)| q.picks.map(|p| idx.iter().map(|&i| p[i].clone()).collect())).collect();
        SharedRows { own_cuts, own_picks, source, reused }
    }

    /// No sharing: every request scores all its rows.
    pub fn none(reqs: &[CutRequest]) -> Self {
        SharedRows {
            own_cuts: reqs.iter().map(|q| q.cuts.to_vec()).collect(),
            own_picks: reqs.iter().map(|q| q.picks.map(<[_]>::to_vec)).collect(),
            source: reqs
                .iter()
                .enumerate()
                .map(|(r, q)| (0..q.cuts.len()).map(|i| (0..q.targets_at(i)).map(|s| (r, i, s)).collect()).collect())
                .collect(),
            reused: 0,
        }
    }

    /// What request `r` still has to score: its own cuts, on its trace up to the last of them
    /// (later tokens are seen by no row). `None` when every row of it is scored elsewhere.
    pub fn request<'a>(&'a self, r: usize, q: &CutRequest<'a>) -> Option<CutRequest<'a>> {
        let cuts = &self.own_cuts[r];
        let last = *cuts.last()?;
        Some(CutRequest { trace: &q.trace[..last], cuts, targets: q.targets, picks: self.own_picks[r].as_deref() })
    }

    /// Rows not scored because an earlier row equals them.
    pub fn reused_rows(&self) -> usize {
        self.reused
    }

    /// Every request's `values[cut][target]` from the scores of the reduced requests
    /// (`scored[r]` for [`Self::request`]`(r)`, `None` where that was `None`).
    pub fn expand(&self, scored: &[Option<Vec<Vec<f64>>>]) -> CutScores {
        self.source
            .iter()
            .map(|rows| {
                rows.iter()
                    .map(|row| {
                        row.iter()
                            .map(|&(r, i, j)| scored[r].as_ref().expect("the owning request was scored")[i][j])
                            .collect()
                    })
                    .collect()
            })
            .collect()
    }
}

/// [`score_cuts`] for several traces in one pass (`out[r][i][j]` for request r): the traces are
/// prefilled as one right-padded batch, their keys/values packed end to end into one shared
/// prefix, and every (trace, cut, target) row masks all keys but its own trace's before its cut.
/// Fewer, larger forward calls: what makes scoring cheap for small models, where per-call
/// overhead dominates. Callers bound the packed length (attention to the prefix grows with it).
pub fn score_cuts_many(model: &DecoderLm, reqs: &[CutRequest]) -> Result<CutScores> {
    score_cuts_reusing(model, reqs, &mut None)
}

/// The last single trace [`score_cuts_reusing`] scored: its tokens, keys/values and final hidden
/// states. The next trace (in row order, the next sample of the same group) runs only the tokens
/// after the prefix the two share: the prompt at least.
pub struct PrefixReuse {
    tokens: Vec<i64>,
    cache: KvCache,
    hidden: Tensor,
}

impl PrefixReuse {
    /// Leading tokens of `trace` whose keys/values are reused (all but at least its last token).
    fn shared_with(&self, trace: &[i64]) -> usize {
        self.tokens.iter().zip(trace).take_while(|(a, b)| a == b).count().min(trace.len().saturating_sub(1))
    }

    /// Trace tokens [`score_cuts_reusing`]`(model, reqs, reuse)` does not run because `reuse`
    /// holds them: the shared prefix when `reqs` is one trace, else 0.
    pub fn tokens_saved(reuse: &Option<PrefixReuse>, reqs: &[CutRequest]) -> usize {
        match (reqs, reuse) {
            ([q], Some(prev)) => prev.shared_with(q.trace),
            _ => 0,
        }
    }
}

/// [`score_cuts_many`], reusing `reuse` (see [`PrefixReuse`]) when `reqs` is one trace and
/// leaving that trace in it for the next call. Several traces in one call are prefilled as a
/// batch, without reuse.
pub fn score_cuts_reusing(
    model: &DecoderLm,
    reqs: &[CutRequest],
    reuse: &mut Option<PrefixReuse>,
) -> Result<CutScores> {
    for q in reqs {
        validate_cuts(model, q)?;
    }
    if reqs.is_empty() {
        return Ok(vec![]);
    }
    let dev = model.device();
    let kind = model.kind();
    let b = reqs.len() as i64;
    let lens: Vec<i64> = reqs.iter().map(|r| r.trace.len() as i64).collect();
    let n_max = *lens.iter().max().unwrap_or(&1);
    let offsets: Vec<i64> = lens.iter().scan(0, |acc, &n| { let o = *acc; *acc += n; Some(o) }).collect();
    let total: i64 = lens.iter().sum();
    tch::no_grad(|| -> Result<CutScores> {
        // 1. All traces once (right padding: a real token never attends to a later pad); one
        //    trace after the last one only from where the two differ.
        let (h, cache) = match (reqs, reuse.take()) {
            ([q], Some(prev)) => prefill_after_shared_prefix(model, q.trace, prev),
            _ => {
                let mut cache = model.new_cache(b, n_max);
                let mut ids = vec![0i64; (b * n_max) as usize];
                for (r, q) in reqs.iter().enumerate() {
                    ids[r * n_max as usize..][..q.trace.len()].copy_from_slice(q.trace);
                }
                let ids = Tensor::from_slice(&ids).view([b, n_max]).to_device(dev);
                let pos = Tensor::arange(n_max, (Kind::Int64, dev)).view([1, n_max]).repeat([b, 1]);
                (model.hidden(&ids, &pos, &AttnMask::Causal, Some(&mut cache)), cache)
            }
        };
        let d = h.size()[2];
        // 2. First target token of every (trace, cut, target slot) from the hidden state at cut - 1.
        let last: Vec<i64> = reqs
            .iter()
            .enumerate()
            .flat_map(|(r, q)| q.cuts.iter().map(move |&c| r as i64 * n_max + c as i64 - 1))
            .collect();
        let h_cut = h.view([b * n_max, d]).index_select(0, &Tensor::from_slice(&last).to_device(dev));
        // Every (cut, target)'s first-token logprob: a [ΣC, K] matrix of first tokens (K = the
        // most targets of a cut, the rest padding) scored on the device and read back at once:
        // one synchronisation, not one per value (11,520 cuts × 2 targets in Table 2).
        let k_max = reqs.iter().flat_map(|q| (0..q.cuts.len()).map(|i| q.targets_at(i))).max().unwrap_or(0).max(1);
        let mut first_tokens = Vec::with_capacity(last.len() * k_max);
        for q in reqs {
            for i in 0..q.cuts.len() {
                first_tokens.extend((0..q.targets_at(i)).map(|s| q.target(i, s)[0]));
                first_tokens.extend(std::iter::repeat_n(0, k_max - q.targets_at(i)));
            }
        }
        let first_tokens = Tensor::from_slice(&first_tokens).view([last.len() as i64, k_max as i64]).to_device(dev);
        let firsts = head_logprobs(model, &h_cut, &first_tokens, 0)?;
        let firsts = Vec::<f64>::try_from(firsts.to_kind(Kind::Double).to_device(Device::Cpu).view([-1]))
            .map_err(|e| ModelError::Request(format!("reading scores: {e}")))?;
        let mut firsts = firsts.chunks(k_max);
        let mut out: CutScores = reqs
            .iter()
            .map(|q| {
                (0..q.cuts.len())
                    .map(|i| firsts.next().expect("one row per cut")[..q.targets_at(i)].to_vec())
                    .collect()
            })
            .collect();
        // 3. The remaining target tokens. Rows (trace, cut, target slot) sorted by target length,
        //    so a chunk is padded only to about its own length.
        let prefix = cache.packed(&lens);
        let mut rows: Vec<(usize, usize, usize)> = reqs
            .iter()
            .enumerate()
            .flat_map(|(r, q)| q.rows().map(move |(i, s)| (r, i, s)))
            .filter(|&(r, i, s)| reqs[r].target(i, s).len() > 1)
            .collect();
        rows.sort_by_key(|&(r, i, s)| reqs[r].target(i, s).len());
        let keys = Tensor::arange(total, (Kind::Int64, dev)).view([1, 1, 1, total]);
        let own_len = |&(r, i, s): &(usize, usize, usize)| reqs[r].target(i, s).len() as i64 - 1;
        let mut start = 0;
        while start < rows.len() {
            // Rows sorted by length: the chunk's last row is its longest and every row is padded
            // to it. A chunk ends at LOGIT_ROWS cells, or before padding would pass a quarter of
            // its real cells (short y* rows are not padded to the length of u* rows).
            let mut end = start + 1;
            let mut real = own_len(&rows[start]);
            while end < rows.len() {
                let own = own_len(&rows[end]);
                let cells = (end - start + 1) as i64 * own;
                if cells > LOGIT_ROWS || cells > (real + own) + (real + own) / 4 + PAD_SLACK {
                    break;
                }
                real += own;
                end += 1;
            }
            let chunk = &rows[start..end];
            start = end;
            let own = own_len(&chunk[chunk.len() - 1]);
            let m = chunk.len() as i64;
            let cells = (m * own) as usize;
            let (mut inp, mut tgt, mut valid, mut positions) = (vec![0i64; cells], vec![0i64; cells], vec![0f64; cells], vec![0i64; cells]);
            let (mut lo, mut hi) = (vec![0i64; m as usize], vec![0i64; m as usize]);
            for (row, &(r, i, s)) in chunk.iter().enumerate() {
                let t = reqs[r].target(i, s);
                let cut = reqs[r].cuts[i] as i64;
                lo[row] = offsets[r];
                hi[row] = offsets[r] + cut;
                for k in 0..own as usize {
                    let a = row * own as usize + k;
                    positions[a] = cut + k as i64;
                    if k + 1 < t.len() {
                        inp[a] = t[k];
                        tgt[a] = t[k + 1];
                        valid[a] = 1.0;
                    }
                }
            }
            let inp = Tensor::from_slice(&inp).view([m, own]).to_device(dev);
            let tgt = Tensor::from_slice(&tgt).view([m, own]).to_device(dev);
            let positions = Tensor::from_slice(&positions).view([m, own]).to_device(dev);
            let lo = Tensor::from_slice(&lo).view([m, 1, 1, 1]).to_device(dev);
            let hi = Tensor::from_slice(&hi).view([m, 1, 1, 1]).to_device(dev);
            // Each row sees only its own trace's keys before its cut.
            let outside = keys.lt_tensor(&lo).logical_or(&keys.ge_tensor(&hi));
            let prefix_bias = Tensor::zeros([m, 1, 1, total], (kind, dev)).masked_fill(&outside, MASKED);
            let own_bias = causal_bias(1, own, 0, None, kind, dev);
            let hid = model.hidden_shared_prefix(&inp, &positions, &prefix, &prefix_bias, &own_bias);
            let lp = head_logprobs(model, &hid.reshape([m * own, -1]), &tgt.view([m * own, 1]), 0)?.view([m, own])
                * Tensor::from_slice(&valid).view([m, own]).to_device(dev);
            let sums = Vec::<f64>::try_from(lp.sum_dim_intlist(-1, false, Kind::Double).to_device(Device::Cpu))
                .map_err(|e| ModelError::Request(format!("reading scores: {e}")))?;
            for (row, &(r, i, s)) in chunk.iter().enumerate() {
                out[r][i][s] += sums[row];
            }
        }
        if let [q] = reqs {
            *reuse = Some(PrefixReuse { tokens: q.trace.to_vec(), cache, hidden: h });
        }
        Ok(out)
    })
}

/// Hidden states `[1, n, D]` and keys/values of `trace`, computing only the tokens after the
/// prefix it shares with `prev` (at least one token is run, so the result is never stale).
fn prefill_after_shared_prefix(model: &DecoderLm, trace: &[i64], prev: PrefixReuse) -> (Tensor, KvCache) {
    let dev = model.device();
    let n = trace.len() as i64;
    let shared = prev.shared_with(trace) as i64;
    let PrefixReuse { mut cache, hidden, .. } = prev;
    cache.truncate(shared);
    let new = n - shared;
    let ids = Tensor::from_slice(&trace[shared as usize..]).view([1, new]).to_device(dev);
    let pos = Tensor::arange_start(shared, n, (Kind::Int64, dev)).view([1, new]);
    let mask = if shared == 0 {
        AttnMask::Causal
    } else {
        AttnMask::Bias(causal_bias(1, new, shared, None, model.kind(), dev))
    };
    let h_new = model.hidden(&ids, &pos, &mask, Some(&mut cache));
    let h = Tensor::cat(&[&hidden.narrow(1, 0, shared), &h_new], 1);
    (h, cache)
}

/// How [`score_cuts_batch`] scores each pack of traces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CutScorer {
    /// [`score_cuts_reusing`]: one pass per pack, keys/values shared by all cuts (the point).
    KvShared,
    /// [`score_cuts_naive`]: one prefill per (cut, target); the oracle, for checks.
    Naive,
}

/// What [`score_cuts_batch`] ran: sequences and token positions through the model, and the rows
/// it did not score because an earlier request scored the same row.
#[derive(Debug, Clone, Copy, Default)]
pub struct CutCost {
    pub sequences: usize,
    pub positions: usize,
    pub reused_rows: usize,
}

/// A pack of [`score_cuts_batch`] that failed: its first and last request and the model's error.
#[derive(Debug, thiserror::Error)]
#[error("scoring requests {first} .. {last}: {error}")]
pub struct PackError {
    pub first: usize,
    pub last: usize,
    pub error: ModelError,
}

/// Every request's `values[cut][target]`, scored as cheaply as the requests allow: rows shared
/// between requests are scored once (`dedupe`, [`SharedRows`]), the rest in packs of traces up to
/// `pack_tokens` tokens, one pass per pack (a pack of one trace reuses the previous trace's
/// keys/values, [`PrefixReuse`]). `progress(done)` is called after each pack with the number of
/// requests finished (those whose every row was shared count from the start).
pub fn score_cuts_batch(
    model: &DecoderLm,
    reqs: &[CutRequest],
    scorer: CutScorer,
    pack_tokens: usize,
    dedupe: bool,
    mut progress: impl FnMut(usize),
) -> std::result::Result<(CutScores, CutCost), PackError> {
    // Before sharing rows, which slices every trace at its cuts.
    for (r, q) in reqs.iter().enumerate() {
        validate_cuts(model, q).map_err(|error| PackError { first: r, last: r, error })?;
    }
    let shared = if dedupe { SharedRows::find(reqs) } else { SharedRows::none(reqs) };
    let reduced: Vec<Option<CutRequest>> = reqs.iter().enumerate().map(|(r, q)| shared.request(r, q)).collect();
    let mut packs: Vec<Vec<usize>> = Vec::new();
    let mut in_pack = 0usize;
    for (r, q) in reduced.iter().enumerate() {
        if let Some(q) = q {
            if packs.is_empty() || (in_pack + q.trace.len() > pack_tokens && in_pack > 0) {
                packs.push(Vec::new());
                in_pack = 0;
            }
            packs.last_mut().expect("a pack").push(r);
            in_pack += q.trace.len();
        }
    }
    let mut scored: Vec<Option<Vec<Vec<f64>>>> = vec![None; reduced.len()];
    let mut reuse: Option<PrefixReuse> = None;
    let mut cost = CutCost { reused_rows: shared.reused_rows(), ..CutCost::default() };
    let mut done = reduced.iter().filter(|q| q.is_none()).count();
    for pack in &packs {
        let reqs: Vec<CutRequest> = pack.iter().map(|&r| reduced[r].expect("packs hold traces to score")).collect();
        for q in &reqs {
            let (n, p) = pass_cost(q, scorer);
            cost.sequences += n;
            cost.positions += p;
        }
        if scorer == CutScorer::KvShared {
            cost.positions -= PrefixReuse::tokens_saved(&reuse, &reqs);
        }
        let values = match scorer {
            CutScorer::KvShared => score_cuts_reusing(model, &reqs, &mut reuse),
            CutScorer::Naive => reqs.iter().map(|q| score_request_naive(model, q)).collect(),
        }
        .map_err(|error| PackError { first: pack[0], last: pack[pack.len() - 1], error })?;
        for (&r, v) in pack.iter().zip(values) {
            scored[r] = Some(v);
        }
        done += pack.len();
        progress(done);
    }
    Ok((shared.expand(&scored), cost))
}

/// Model cost of scoring `q`: (sequences, token positions) run. kv_shared: the trace once, then
/// every (cut, target) row on its shared prefix; naive: one prefill per (cut, target).
fn pass_cost(q: &CutRequest, scorer: CutScorer) -> (usize, usize) {
    let rows = q.rows().count();
    let target_tokens: usize = q.rows().map(|(i, s)| q.target(i, s).len()).sum();
    match scorer {
        CutScorer::KvShared => (1 + rows, q.trace.len() + target_tokens),
        CutScorer::Naive => (rows, q.rows().map(|(i, _)| q.cuts[i]).sum::<usize>() + target_tokens),
    }
}

/// Test oracle for [`score_cuts`]: one independent full prefill of `trace[..c] ++ target` per
/// (cut, target), logits only where the target is predicted.
pub fn score_cuts_naive(
    model: &DecoderLm,
    trace: &[i64],
    cuts: &[usize],
    targets: &[Vec<i64>],
) -> Result<Vec<Vec<f64>>> {
    score_request_naive(model, &CutRequest::every_target(trace, cuts, targets))
}

/// [`score_cuts_naive`] for a request whose cuts may pick their targets.
fn score_request_naive(model: &DecoderLm, q: &CutRequest) -> Result<Vec<Vec<f64>>> {
    validate_cuts(model, q)?;
    let dev = model.device();
    tch::no_grad(|| {
        let mut out: Vec<Vec<f64>> = (0..q.cuts.len()).map(|i| vec![0f64; q.targets_at(i)]).collect();
        for (i, s) in q.rows() {
            let (c, t) = (q.cuts[i], q.target(i, s));
            let seq: Vec<i64> = q.trace[..c].iter().chain(t.iter()).copied().collect();
            let len = seq.len() as i64;
            let ids = Tensor::from_slice(&seq).view([1, len]).to_device(dev);
            let pos = Tensor::arange(len, (Kind::Int64, dev)).view([1, len]);
            let h = model.hidden(&ids, &pos, &AttnMask::Causal, None);
            let logits = model.logits(&h.narrow(1, c as i64 - 1, t.len() as i64));
            check_finite(&logits, i)?;
            let tgt = Tensor::from_slice(t).view([1, -1]).to_device(dev);
            out[i][s] = logprobs_at(&logits, &tgt.unsqueeze(-1), 1.0)
                .sum(Kind::Double)
                .double_value(&[]);
        }
        Ok(out)
    })
}

/// Gradient attribution: for `seq` (one sequence), the L1 norm over the hidden dimension of
/// `d [Σ_{i ≥ target_start} log p(seq[i] | seq[..i])] / d e_j` for every position j, where e_j is
/// the input embedding of `seq[j]` (one forward and one backward pass; weights get no gradient).
pub fn embedding_grad_l1(model: &DecoderLm, seq: &[i64], target_start: usize) -> Result<Vec<f64>> {
    if target_start == 0 || target_start >= seq.len() {
        return Err(ModelError::Request(format!(
            "target start {target_start} outside 1..{} (the sequence length)",
            seq.len()
        )));
    }
    model.check_ids(seq, 0, 0)?;
    let dev = model.device();
    let n = seq.len() as i64;
    let ids = Tensor::from_slice(seq).view([1, n]).to_device(dev);
    let pos = Tensor::arange(n, (Kind::Int64, dev)).view([1, n]);
    let emb = tch::no_grad(|| model.embed(&ids)).detach().set_requires_grad(true);
    let h = model.hidden_from_embeds(emb.shallow_clone(), &pos, &AttnMask::Causal, None);
    let t0 = target_start as i64;
    let logits = model.logits(&h.narrow(1, t0 - 1, n - t0));
    check_finite(&logits, 0)?;
    let tgt = ids.narrow(1, t0, n - t0);
    let total = logprobs_at(&logits, &tgt.unsqueeze(-1), 1.0).sum(Kind::Float);
    let grads = Tensor::run_backward(&[&total], &[&emb], false, false);
    let l1 = grads[0]
        .to_kind(Kind::Double)
        .abs()
        .sum_dim_intlist(-1, false, Kind::Double)
        .view([-1]);
    check_finite(&l1, 0)?;
    Vec::<f64>::try_from(l1.to_device(Device::Cpu))
        .map_err(|e| ModelError::Request(format!("reading gradients: {e}")))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::config::{Arch, ModelConfig};

    /// A small random model with enough weight scale that logits are far from uniform.
    pub(crate) fn tiny_model(arch: Arch, seed: i64) -> DecoderLm {
        tch::manual_seed(seed);
        let cfg = ModelConfig {
            arch,
            vocab_size: 61,
            hidden_size: 32,
            intermediate_size: 48,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 8,
            max_position_embeddings: 512,
            rms_norm_eps: 1e-6,
            rope_theta: 10000.0,
            tie_word_embeddings: arch != Arch::Qwen3,
            qkv_bias: arch == Arch::Qwen2,
            o_bias: false,
            mlp_bias: false,
            bos_token_id: None,
            eos_token_ids: vec![],
            pad_token_id: None,
        };
        let m = DecoderLm::new(&cfg, Device::Cpu);
        // By name, so the weights are a function of the seed alone.
        let vars = m.sorted_variables();
        tch::no_grad(|| {
            for (_, mut v) in vars {
                let r = Tensor::randn(v.size(), (Kind::Float, Device::Cpu)) * 0.3;
                v.copy_(&r);
            }
        });
        m
    }

    fn rand_ids(n: usize, vocab: i64, seed: u64) -> Vec<i64> {
        use rand::{Rng, SeedableRng};
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        (0..n).map(|_| r.random_range(0..vocab)).collect()
    }

    #[test]
    fn kv_shared_scoring_equals_naive_oracle() {
        for (k, arch) in [Arch::Qwen2, Arch::Qwen3, Arch::Llama]
            .into_iter()
            .enumerate()
        {
            let m = tiny_model(arch, k as i64);
            let trace = rand_ids(90, 61, 7 + k as u64);
            let cuts = [1usize, 5, 17, 40, 41, 77, 90];
            let targets = vec![rand_ids(1, 61, 1), rand_ids(6, 61, 2), rand_ids(11, 61, 3)];
            let slow = score_cuts_naive(&m, &trace, &cuts, &targets).unwrap();
            // The LM head at once, and in pieces of 3 rows (as a real vocabulary is on the CPU).
            for at_once in [None, Some(3 * m.cfg.vocab_size)] {
                crate::model::head::TEST_LOGITS_AT_ONCE.set(at_once);
                let fast = score_cuts(&m, &trace, &cuts, &targets);
                crate::model::head::TEST_LOGITS_AT_ONCE.set(None);
                let mut worst = 0f64;
                for (a, b) in fast.unwrap().iter().flatten().zip(slow.iter().flatten()) {
                    worst = worst.max((a - b).abs());
                }
                assert!(worst <= 1e-4, "{arch:?}, head pieces of {at_once:?} logits: max |Δ| {worst}");
            }
            // The values are informative (not all equal), so the comparison can fail.
            assert!((slow[0][1] - slow[6][1]).abs() > 1e-3);
        }
    }

    #[test]
    fn packed_traces_score_like_each_trace_alone() {
        for (k, arch) in [Arch::Qwen2, Arch::Llama].into_iter().enumerate() {
            let m = tiny_model(arch, 10 + k as i64);
            // Traces of different lengths, cuts and target sets (one target of one token).
            let traces = [rand_ids(90, 61, 1), rand_ids(23, 61, 2), rand_ids(57, 61, 3)];
            let cuts: [Vec<usize>; 3] = [vec![1, 30, 89, 90], vec![5, 23], vec![2, 3, 40, 57]];
            let targets = [
                vec![rand_ids(4, 61, 4), rand_ids(12, 61, 5)],
                vec![rand_ids(1, 61, 6)],
                vec![rand_ids(9, 61, 7), rand_ids(2, 61, 8), rand_ids(15, 61, 9)],
            ];
            let reqs: Vec<CutRequest> =
                (0..3).map(|r| CutRequest::every_target(&traces[r], &cuts[r], &targets[r])).collect();
            let packed = score_cuts_many(&m, &reqs).unwrap();
            assert_eq!(packed.len(), 3);
            for r in 0..3 {
                let alone = score_cuts_naive(&m, &traces[r], &cuts[r], &targets[r]).unwrap();
                assert_eq!((packed[r].len(), packed[r][0].len()), (alone.len(), alone[0].len()));
                for (a, b) in packed[r].iter().flatten().zip(alone.iter().flatten()) {
                    assert!((a - b).abs() <= 1e-4, "{arch:?} trace {r}: {a} vs {b}");
                }
            }
            // A trace's values depend on its own keys only: packing it with others changes nothing.
            let solo = score_cuts(&m, &traces[2], &cuts[2], &targets[2]).unwrap();
            assert!(solo.iter().flatten().zip(packed[2].iter().flatten()).all(|(a, b)| (a - b).abs() <= 1e-4));
        }
    }

    #[test]
    fn shared_rows_are_scored_once_and_expand_to_every_trace() {
        let m = tiny_model(Arch::Qwen2, 21);
        let prompt = rand_ids(12, 61, 1);
        let other_prompt = rand_ids(9, 61, 2);
        let (a_tail, c_tail) = (rand_ids(20, 61, 3), rand_ids(8, 61, 4));
        let a: Vec<i64> = prompt.iter().chain(&a_tail).copied().collect();
        // c: the same prompt and first 10 completion tokens as a, then its own.
        let c: Vec<i64> = prompt.iter().chain(&a_tail[..10]).chain(&c_tail).copied().collect();
        let d: Vec<i64> = other_prompt.iter().chain(&c_tail).copied().collect();
        let traces = [a.clone(), a.clone(), c, d];
        let cuts: [Vec<usize>; 4] = [vec![12, 22, 32], vec![12, 22, 32], vec![12, 22, 26, 30], vec![9, 17]];
        let (y, u) = (rand_ids(3, 61, 5), rand_ids(7, 61, 6));
        let targets = vec![y, u];
        let reqs: Vec<CutRequest> = (0..4).map(|r| CutRequest::every_target(&traces[r], &cuts[r], &targets)).collect();
        let shared = SharedRows::find(&reqs);
        // b repeats a (3 cuts x 2 targets); c's first two cuts repeat a's: 10 rows reused.
        assert_eq!(shared.reused_rows(), 10);
        assert!(shared.request(1, &reqs[1]).is_none());
        let rc = shared.request(2, &reqs[2]).unwrap();
        assert_eq!((rc.cuts, rc.trace.len()), (&[26usize, 30][..], 30));
        let reduced: Vec<Option<CutRequest>> = reqs.iter().enumerate().map(|(r, q)| shared.request(r, q)).collect();
        let scored: Vec<Option<Vec<Vec<f64>>>> =
            reduced.iter().map(|q| q.map(|q| score_cuts_many(&m, &[q]).unwrap().remove(0))).collect();
        let values = shared.expand(&scored);
        for r in 0..4 {
            let alone = score_cuts_naive(&m, &traces[r], &cuts[r], &targets).unwrap();
            assert_eq!(values[r].len(), alone.len());
            for (x, want) in values[r].iter().flatten().zip(alone.iter().flatten()) {
                assert!((x - want).abs() <= 1e-4, "trace {r}: {x} vs {want}");
            }
        }
        // No sharing: every row scored by its own request.
        let none = SharedRows::none(&reqs);
        assert_eq!(none.reused_rows(), 0);
        assert_eq!(none.request(1, &reqs[1]).unwrap().cuts, &cuts[1][..]);
    }

    #[test]
    fn a_batch_scores_every_request_like_the_oracle_however_packed_and_shared() {
        let m = tiny_model(Arch::Llama, 23);
        let prompt = rand_ids(12, 61, 31);
        let a: Vec<i64> = prompt.iter().chain(&rand_ids(20, 61, 32)).copied().collect();
        let d = rand_ids(17, 61, 33);
        // a twice (a GRPO group's identical samples), then a trace of its own.
        let traces = [a.clone(), a, d];
        let cuts: [Vec<usize>; 3] = [vec![12, 22, 32], vec![12, 22, 32], vec![9, 17]];
        let targets = vec![rand_ids(3, 61, 34), rand_ids(7, 61, 35)];
        let reqs: Vec<CutRequest> = (0..3).map(|r| CutRequest::every_target(&traces[r], &cuts[r], &targets)).collect();
        let want: Vec<Vec<Vec<f64>>> = (0..3).map(|r| score_cuts_naive(&m, &traces[r], &cuts[r], &targets).unwrap()).collect();
        for (scorer, pack_tokens, dedupe) in
            [(CutScorer::KvShared, 1, true), (CutScorer::KvShared, 4096, true), (CutScorer::KvShared, 4096, false), (CutScorer::Naive, 1, true)]
        {
            let mut seen = vec![];
            let (got, cost) = score_cuts_batch(&m, &reqs, scorer, pack_tokens, dedupe, |done| seen.push(done)).unwrap();
            let case = format!("{scorer:?}, pack_tokens {pack_tokens}, dedupe {dedupe}");
            for r in 0..3 {
                for (x, y) in got[r].iter().flatten().zip(want[r].iter().flatten()) {
                    assert!((x - y).abs() <= 1e-4, "{case}: trace {r}: {x} vs {y}");
                }
            }
            // The second trace's 6 rows are the first's: scored once when deduplicating.
            assert_eq!(cost.reused_rows, if dedupe { 6 } else { 0 }, "{case}");
            assert!(cost.sequences > 0 && cost.positions > 0, "{case}");
            assert_eq!(seen.last(), Some(&3), "{case}: progress ends at every request: {seen:?}");
            assert!(seen.windows(2).all(|w| w[0] < w[1]), "{case}: {seen:?}");
        }
        // A request the model cannot score fails its pack, which names its requests.
        let bad_cuts = vec![40usize];
        let bad = [reqs[0], CutRequest::every_target(&traces[2], &bad_cuts, &targets)];
        let e = score_cuts_batch(&m, &bad, CutScorer::KvShared, 1, true, |_| {}).unwrap_err();
        assert_eq!((e.first, e.last), (1, 1), "{e}");
    }

    #[test]
    fn cuts_that_pick_their_targets_score_those_alone_like_the_oracle() {
        let m = tiny_model(Arch::Qwen2, 24);
        let prompt = rand_ids(10, 61, 41);
        let a: Vec<i64> = prompt.iter().chain(&rand_ids(30, 61, 42)).copied().collect();
        let b: Vec<i64> = prompt.iter().chain(&rand_ids(20, 61, 43)).copied().collect();
        let targets = vec![rand_ids(1, 61, 44), rand_ids(5, 61, 45), rand_ids(9, 61, 46), rand_ids(3, 61, 47)];
        let cuts = [vec![10usize, 18, 25, 40], vec![10usize, 30]];
        // Picks in any order, a cut with none; b's prompt-end cut asks for two of a's rows there.
        let picks = [vec![vec![0, 2], vec![1], vec![3, 2, 0], vec![]], vec![vec![2, 0], vec![1, 3]]];
        let traces = [&a, &b];
        let reqs: Vec<CutRequest> =
            (0..2).map(|r| CutRequest { trace: traces[r], cuts: &cuts[r], targets: &targets, picks: Some(&picks[r]) }).collect();
        let every: Vec<Vec<Vec<f64>>> = (0..2).map(|r| score_cuts_naive(&m, traces[r], &cuts[r], &targets).unwrap()).collect();
        // (scorer, pack_tokens, dedupe, sequences run): a's 6 rows and b's 4, b's first 2 shared.
        for (scorer, pack_tokens, dedupe, sequences) in [
            (CutScorer::KvShared, 1, false, 12),
            (CutScorer::KvShared, 1, true, 10),
            (CutScorer::KvShared, 4096, true, 10),
            (CutScorer::Naive, 1, false, 10),
        ] {
            let case = format!("{scorer:?}, pack_tokens {pack_tokens}, dedupe {dedupe}");
            let (got, cost) = score_cuts_batch(&m, &reqs, scorer, pack_tokens, dedupe, |_| {}).unwrap();
            for r in 0..2 {
                for (i, p) in picks[r].iter().enumerate() {
                    assert_eq!(got[r][i].len(), p.len(), "{case}: trace {r} cut {i}");
                    for (x, &j) in got[r][i].iter().zip(p) {
                        let want = every[r][i][j];
                        assert!((x - want).abs() <= 1e-4, "{case}: trace {r} cut {i} target {j}: {x} vs {want}");
                    }
                }
            }
            assert_eq!((cost.sequences, cost.reused_rows), (sequences, if dedupe { 2 } else { 0 }), "{case}");
        }
        // The same values as every target at every cut, read at the picks: the comparison can fail.
        assert!((every[0][0][0] - every[0][0][2]).abs() > 1e-3);
        // Picks that do not fit the cuts or the targets are errors naming them.
        let short = [vec![0usize]];
        let e = score_cuts_many(&m, &[CutRequest { picks: Some(&short), ..reqs[1] }]).unwrap_err().to_string();
        assert!(e.contains("1 target picks for 2 cuts"), "{e}");
        let beyond = [vec![0usize], vec![4]];
        let e = score_cuts_many(&m, &[CutRequest { picks: Some(&beyond), ..reqs[1] }]).unwrap_err().to_string();
        assert!(e.contains("cut 1 picks target 4 of 4"), "{e}");
    }

    #[test]
    fn consecutive_traces_reuse_their_shared_prefix_and_score_like_the_oracle() {
        let m = tiny_model(Arch::Qwen3, 22);
        let prompt = rand_ids(15, 61, 11);
        let a: Vec<i64> = prompt.iter().chain(&rand_ids(25, 61, 12)).copied().collect();
        let b: Vec<i64> = prompt.iter().chain(&rand_ids(40, 61, 13)).copied().collect();
        // c is a prefix of b (all reused but its last token); d shares nothing with c.
        let c = b[..30].to_vec();
        let d = rand_ids(20, 61, 14);
        let targets = vec![rand_ids(4, 61, 15), rand_ids(9, 61, 16)];
        let mut reuse = None;
        let shared_expected = [0usize, 15, 29, 0];
        for (k, (trace, cuts)) in
            [(&a, vec![15, 30, 40]), (&b, vec![10, 15, 33, 55]), (&c, vec![16, 30]), (&d, vec![1, 20])].into_iter().enumerate()
        {
            let req = [CutRequest::every_target(trace, &cuts, &targets)];
            assert_eq!(PrefixReuse::tokens_saved(&reuse, &req), shared_expected[k], "trace {k}");
            let got = score_cuts_reusing(&m, &req, &mut reuse).unwrap();
            let want = score_cuts_naive(&m, trace, &cuts, &targets).unwrap();
            for (x, y) in got[0].iter().flatten().zip(want.iter().flatten()) {
                assert!((x - y).abs() <= 1e-4, "trace {k}: {x} vs {y}");
            }
        }
    }

    #[test]
    fn batched_logprob_equals_per_pair_oracle() {
        let m = tiny_model(Arch::Qwen2, 3);
        let pairs: Vec<(Vec<i64>, Vec<i64>)> = (0..5)
            .map(|i| {
                (
                    rand_ids(3 + 4 * i, 61, i as u64),
                    rand_ids(2 + i, 61, 100 + i as u64),
                )
            })
            .collect();
        let batched = logprob(&m, &pairs, 4).unwrap();
        // The LM head in pieces of 2 rows gives the same.
        crate::model::head::TEST_LOGITS_AT_ONCE.set(Some(2 * m.cfg.vocab_size));
        let pieced = logprob(&m, &pairs, 4);
        crate::model::head::TEST_LOGITS_AT_ONCE.set(None);
        for (a, b) in pieced.unwrap().iter().flatten().zip(batched.iter().flatten()) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
        for (i, (p, c)) in pairs.iter().enumerate() {
            let one = score_cuts_naive(
                &m,
                &[p.clone(), vec![]].concat(),
                &[p.len()],
                std::slice::from_ref(c),
            )
            .unwrap();
            let sum: f64 = batched[i].iter().map(|&x| x as f64).sum();
            assert_eq!(batched[i].len(), c.len());
            assert!(
                (sum - one[0][0]).abs() < 1e-4,
                "pair {i}: {sum} vs {}",
                one[0][0]
            );
        }
    }

    #[test]
    fn embedding_gradient_matches_central_differences() {
        let mut m = tiny_model(Arch::Qwen2, 5);
        m.set_kind(Kind::Double);
        let seq = rand_ids(12, 61, 9);
        let start = 8;
        let g = embedding_grad_l1(&m, &seq, start).unwrap();
        assert_eq!(g.len(), seq.len());
        let n = seq.len() as i64;
        let ids = Tensor::from_slice(&seq).view([1, n]);
        let pos = Tensor::arange(n, (Kind::Int64, Device::Cpu)).view([1, n]);
        let tgt = Tensor::from_slice(&seq[start..]).view([1, -1]);
        // The objective in float64, independent of logprobs_at.
        let objective = |e: &Tensor| -> f64 {
            tch::no_grad(|| {
                let h = m.hidden_from_embeds(e.shallow_clone(), &pos, &AttnMask::Causal, None);
                let lp = m
                    .logits(&h.narrow(1, start as i64 - 1, n - start as i64))
                    .log_softmax(-1, Kind::Double);
                lp.gather(-1, &tgt.unsqueeze(-1), false).sum(Kind::Double).double_value(&[])
            })
        };
        let emb = tch::no_grad(|| m.embed(&ids));
        // RmsNorm and attention softmax run in float32 even in a float64 model, so the step is
        // large enough for f32 rounding of the objective not to dominate the differences.
        let eps = 1e-2;
        for j in [0i64, 3, 7, 10] {
            let mut l1 = 0.0;
            for d in 0..32 {
                let bump = |sign: f64| {
                    let e = emb.copy();
                    let _ = e.get(0).get(j).get(d).g_add_scalar_(sign * eps);
                    objective(&e)
                };
                l1 += ((bump(1.0) - bump(-1.0)) / (2.0 * eps)).abs();
            }
            let rel = (l1 - g[j as usize]).abs() / l1.max(1e-9);
            assert!(rel < 2e-2, "position {j}: autograd {} vs differences {l1}", g[j as usize]);
            assert!(l1 > 1e-3, "position {j}: the check is informative");
        }
        // The last token is only ever a target: nothing depends on its embedding.
        assert!(g[seq.len() - 1] == 0.0, "{}", g[seq.len() - 1]);
        assert!(embedding_grad_l1(&m, &seq, 0).is_err());
        assert!(embedding_grad_l1(&m, &seq, seq.len()).is_err());
    }

    #[test]
    fn bad_requests_are_errors_not_panics() {
        let m = tiny_model(Arch::Llama, 4);
        let trace = rand_ids(10, 61, 1);
        assert!(score_cuts(&m, &trace, &[0], &[vec![1]]).is_err());
        assert!(score_cuts(&m, &trace, &[11], &[vec![1]]).is_err());
        assert!(score_cuts(&m, &trace, &[3], &[vec![]]).is_err());
        assert!(score_cuts(&m, &trace, &[3], &[vec![61]]).is_err());
        let long = rand_ids(600, 61, 2);
        let e = score_cuts(&m, &long, &[3], &[vec![1]]).unwrap_err();
        assert!(matches!(e, ModelError::ContextOverflow { .. }), "{e}");
    }
}
