//! `score_mc`: Monte Carlo values (VinePPO-style; the paper's baseline and proxy for the true
//! values, §4, Fig. 3, 4, 7, appendix D.1). For a trace x, u_1..u_T, from every exit point
//! t = 0..T−1 (the prefix x, u_1..u_t) the policy samples `k` completions; the value is the
//! fraction the math verifier finds correct against the reference answer. The value at t = T is
//! the trace's own reward (its return: nothing is left to sample). σ^unnorm_t = value_t −
//! value_{t−1} (so Σσ^unnorm = reward − value_0), normalized by `normalize` like `score_sigma`.
//!
//! Completion (trace, t, j) is sampled with its own seed derived from (`seed`, prompt id, sample,
//! t, j), batched `batch_size` rows at a time, so values do not depend on which traces run
//! together. `max_new_tokens` truncates completions: one that hits the limit without an explicit
//! final answer ("the answer is", `\boxed{}`, `####`, …) is *lost* (paper Fig. 3). `lost = "keep"`
//! scores it like any other completion (the verifier's verdict), `"drop"` leaves it out of its exit
//! point's value (an exit point with every completion lost gets 0, counted).
//!
//! Outputs: `scores` (`R` = value_0..value_T, `v` = zeros of the same length, `method = "mc"`),
//! `completions` (one row per sampled completion, with the `max_new_tokens` it was sampled under:
//! the artifacts the values come from) and `mc_sd`
//! (the standard deviation of the value estimate with k' = 1..k completions, bootstrapped from
//! the k drawn and binomial, averaged over exit points: paper Fig. 7).

use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rredcot::analysis::mc_sd::SdIn;
use rredcot::artifact::{write_rows, Schema};
use rredcot::credit::sigma::Normalize;
use rredcot::engine::{Builtin, Executable, StageContext};
use rredcot::math::has_final_answer;
use serde::{Deserialize, Serialize};

use crate::sampling::{finish_engine, row_seed, sample_seeded, split_answer, SamplerParams};
use crate::traces::{write_scores, TraceInputs};
use super::{load_sampler, use_threads};
use crate::model::FinishReason;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum Lost {
    Keep,
    Drop,
}

/// The stage's own params beside [`SamplerParams`] (stages/score_mc.toml documents them;
/// score_progress's `mc` estimate reads the same).
#[derive(Debug, serde::Deserialize)]
pub struct McParams {
    /// Completions per exit point.
    pub k: usize,
    pub normalize: Normalize,
    lost: Lost,
    /// Bootstrap resamples per exit point for the `mc_sd` table.
    bootstrap: usize,
}

/// One row of the `completions` output.
#[derive(Debug, Serialize, Deserialize)]
pub struct CompletionRow {
    pub prompt_id: String,
    pub sample_idx: i32,
    /// Exit point t: the completion continues x, u_1..u_t.
    pub exit: i32,
    pub k: i32,
    /// The sampled continuation with its special tokens; the answer verified is what follows the
    /// end of thinking of the prefix followed by it.
    pub text: String,
    pub tokens: i32,
    pub correct: bool,
    /// Hit `max_new_tokens`.
    pub truncated: bool,
    /// Truncated without an explicit final answer.
    pub lost: bool,
    /// The `max_new_tokens` param the completion was sampled under (the truncation length of
    /// paper Fig. 3; a batch that would run past the context window samples fewer, counted as
    /// `rows_max_new_tokens_clamped`).
    pub max_new_tokens: i32,
}

/// Seed of completion `j` from exit point `t` of trace (prompt, sample).
fn completion_seed(seed: u64, prompt_id: &str, sample_idx: i32, t: usize, j: usize) -> u64 {
    row_seed(seed, &format!("{prompt_id}\u{0}{sample_idx}\u{0}{t}"), j)
}

/// SD of the mean of k' draws (k' = 1..k) from each exit point's outcomes, averaged over exit
/// points: bootstrapped (`reps` resamples with replacement, seeded) and binomial √(p̂(1−p̂)/k').
fn sd_by_k(outcomes: &[Vec<bool>], k: usize, reps: usize, seed: u64) -> Vec<SdIn> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let used: Vec<&Vec<bool>> = outcomes.iter().filter(|o| !o.is_empty()).collect();
    let m = used.len().max(1) as f64;
    (1..=k)
        .map(|kk| {
            let (mut boot, mut binom) = (0.0, 0.0);
            for o in &used {
                let p = o.iter().filter(|&&c| c).count() as f64 / o.len() as f64;
                binom += (p * (1.0 - p) / kk as f64).sqrt();
                let means: Vec<f64> = (0..reps)
                    .map(|_| (0..kk).filter(|_| o[rng.random_range(0..o.len())]).count() as f64 / kk as f64)
                    .collect();
                let mu = means.iter().sum::<f64>() / reps.max(1) as f64;
                boot += (means.iter().map(|x| (x - mu).powi(2)).sum::<f64>() / reps.max(1) as f64).sqrt();
            }
            SdIn { k: kk as i32, sd_bootstrap: boot / m, sd_binomial: binom / m, exit_points: used.len() as i32 }
        })
        .collect()
}

/// An exit point: trace index, t, the prefix ids, its chain-of-thought ids and their text.
struct Exit {
    trace: usize,
    t: usize,
    ids: Vec<i64>,
    cot: Vec<i64>,
    text: String,
}

pub const STAGE: Builtin = Builtin { name: "score_mc", version: "12", runs_in: Executable::Worker, run };

pub fn run(ctx: &mut StageContext) -> Result<()> {
    let (sampling, mc): (SamplerParams, McParams) = (ctx.params()?, ctx.params()?);
    mc_values(ctx, &sampling, &mc, "policy", "mc", true)
}

/// The stage's work with the sampling model wired to input `model_input` and `method` in the
/// score rows; `score_progress` reuses it with its prover (and without the extra tables).
pub fn mc_values(ctx: &mut StageContext, sampling: &SamplerParams, p: &McParams, model_input: &str, method: &str, tables: bool) -> Result<()> {
    use_threads(sampling.threads);
    let (k, seed, normalize, lost_rule, reps) = (p.k, sampling.seed, p.normalize, p.lost, p.bootstrap);
    let thinking = sampling.thinking;
    if k == 0 {
        bail!("stage `{}`: k must be positive", ctx.instance);
    }
    let inputs = TraceInputs::read(ctx)?;
    let traces = inputs.traces()?;
    let (sampler, tok) = load_sampler(ctx, model_input, sampling, None)?;

    let mut exits = Vec::new();
    let mut golds = Vec::with_capacity(traces.len());
    for (i, tr) in traces.iter().enumerate() {
        golds.push(tr.answer()?);
        let tt = tr.tokens(&tok)?;
        for t in 0..tt.bounds.len() {
            let upto = if t == 0 { 0 } else { tt.bounds[t - 1].1 };
            let cot = tt.completion[..upto].to_vec();
            exits.push(Exit { trace: i, t, ids: tt.prefix(upto), text: tok.decode(&cot, true)?, cot });
        }
    }
    let rows: Vec<(&[i64], u64)> = exits
        .iter()
        .flat_map(|e| {
            let s = traces[e.trace].seg;
            (0..k).map(move |j| (e.ids.as_slice(), completion_seed(seed, &s.prompt_id, s.sample_idx, e.t, j)))
        })
        .collect();
    let name = |r: usize| {
        let e = &exits[r / k];
        format!("{} exit {} completion {}", traces[e.trace].at, e.t, r % k)
    };
    let t0 = std::time::Instant::now();
    let (gens, prefilled) = sample_seeded(ctx, &sampler, &tok, &rows, sampling, "mc", name)?;
    finish_engine(ctx, sampler, super::model_core(model_input, sampling))?;
    // An exit's k continuations share its prefix's prefill: positions run, not k prefixes.
    let forward_tokens = prefilled as usize + gens.iter().map(|g| g.tokens.len()).sum::<usize>();

    // Verify every completion; outcomes per exit point (lost ones left out under `drop`).
    let mut completions = Vec::with_capacity(gens.len());
    let mut outcomes: Vec<Vec<bool>> = vec![Vec::with_capacity(k); exits.len()];
    for (r, g) in gens.into_iter().enumerate() {
        let e = &exits[r / k];
        let tr = &traces[e.trace];
        let text = g.text.unwrap_or_default();
        let response = format!("{}{text}", e.text);
        // The answer after the continuation's end of thinking, as the rollout judges its own.
        let ids: Vec<i64> = e.cot.iter().chain(&g.tokens).copied().collect();
        // Not `cut`: a continuation cut without a final answer is `lost`, kept or dropped by `lost`.
        let verdict = split_answer(&tok, thinking, golds[e.trace], &ids, &response, false).with_context(|| name(r))?.verdict;
        let correct = verdict.correct;
        let truncated = g.finish_reason == FinishReason::Length;
        let lost = truncated && !(verdict.extracted.is_some() && has_final_answer(&response));
        if !(lost && lost_rule == Lost::Drop) {
            outcomes[r / k].push(correct);
        }
        completions.push(CompletionRow {
            prompt_id: tr.seg.prompt_id.clone(),
            sample_idx: tr.seg.sample_idx,
            exit: e.t as i32,
            k: (r % k) as i32,
            text: tok.decode(&g.tokens, false)?,
            tokens: g.tokens.len() as i32,
            correct,
            truncated,
            lost,
            max_new_tokens: sampling.max_new_tokens as i32,
        });
    }

    // Values per trace: exit points in order, then the trace's own reward.
    let mut scores = Vec::with_capacity(traces.len());
    let (mut fell_back, mut all_lost) = (0i64, 0i64);
    let mut next = 0;
    for (i, tr) in traces.iter().enumerate() {
        let mut values = Vec::new();
        while next < exits.len() && exits[next].trace == i {
            let o = &outcomes[next];
            all_lost += o.is_empty() as i64;
            values.push(if o.is_empty() { 0.0 } else { o.iter().filter(|&&c| c).count() as f64 / o.len() as f64 });
            next += 1;
        }
        values.push(tr.rollout.reward);
        let unnorm: Vec<f64> = values.windows(2).map(|w| w[1] - w[0]).collect();
        let zeros = vec![0.0; values.len()];
        let (row, fb) = tr.score_row(values, zeros, &unnorm, normalize, method)?;
        fell_back += fb as i64;
        scores.push(row);
    }

    let n = completions.len().max(1) as f64;
    let lost = completions.iter().filter(|c| c.lost).count();
    let sd = sd_by_k(&outcomes, k, reps, seed);
    ctx.count("exit_points", exits.len() as i64);
    ctx.count("completions", completions.len() as i64);
    ctx.count("completions_truncated", completions.iter().filter(|c| c.truncated).count() as i64);
    ctx.count("completions_lost", lost as i64);
    ctx.count("exit_points_all_lost", all_lost);
    ctx.count("forward_sequences", completions.len() as i64);
    ctx.count("forward_tokens", forward_tokens as i64);
    ctx.metric("scoring_s_per_trace", t0.elapsed().as_secs_f64() / traces.len().max(1) as f64);
    ctx.metric("truncation_loss_fraction", lost as f64 / n);
    ctx.metric("completion_accuracy", completions.iter().filter(|c| c.correct).count() as f64 / n);
    ctx.metric("value_sd_bootstrap_by_k", sd.iter().map(|r| r.sd_bootstrap).collect::<Vec<f64>>());
    if let Some(r) = sd.iter().find(|r| r.sd_bootstrap < 0.1) {
        ctx.metric("k_sd_below_0_1", r.k);
    }
    if tables {
        write_rows(ctx.output("completions")?, Schema::Table, &completions)?;
        write_rows(ctx.output("mc_sd")?, Schema::Table, &sd)?;
    }
    write_scores(ctx, &scores, fell_back, normalize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_sd_follows_the_binomial_and_is_zero_for_certain_outcomes() {
        let mixed = vec![vec![true, false, true, false, true, false, true, false]];
        let rows = sd_by_k(&mixed, 8, 4000, 1);
        for r in &rows {
            let want = (0.25 / r.k as f64).sqrt();
            assert!((r.sd_binomial - want).abs() < 1e-12);
            assert!((r.sd_bootstrap - want).abs() < 0.03, "k' = {}: {} vs {want}", r.k, r.sd_bootstrap);
        }
        assert!(rows[7].sd_bootstrap < rows[0].sd_bootstrap);
        let certain = vec![vec![true; 5], vec![false; 5], vec![]];
        for r in sd_by_k(&certain, 5, 100, 2) {
            assert_eq!((r.sd_bootstrap, r.sd_binomial, r.exit_points), (0.0, 0.0, 2));
        }
    }

    #[test]
    fn completion_seeds_differ_per_exit_point_and_draw() {
        let s = |t, j| completion_seed(0, "p", 1, t, j);
        assert_ne!(s(0, 0), s(0, 1));
        assert_ne!(s(0, 0), s(1, 0));
        assert_ne!(completion_seed(0, "p", 1, 0, 0), completion_seed(0, "p", 2, 0, 0));
        assert_eq!(s(3, 4), s(3, 4));
    }

    #[test]
    fn the_params_struct_reads_every_param_of_the_stage_file() {
        use super::super::tests::{assert_reads_every_param, sampling_stage};
        let p: McParams = assert_reads_every_param("score_mc", sampling_stage);
        assert_eq!((p.k, p.lost), (20, Lost::Keep));
    }

    #[test]
    fn only_explicit_answers_save_a_truncated_completion() {
        assert!(has_final_answer("so 3 + 4 = 7. The answer is 7."));
        assert!(has_final_answer("\\boxed{7}"));
        assert!(!has_final_answer("first 3 + 4 = 7 then 7 * 2 = 1"));
    }
}
