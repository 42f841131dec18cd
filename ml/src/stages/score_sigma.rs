//! `score_sigma`: RREDCoT's redistribution (paper Algorithm 1) for every segmented rollout.
//!
//! For a trace x, u_1..u_T the policy scores, in prefill only, R_t = log p(y* | x, u_1..u_t) and
//! v_t = log p(u* | x, u_1..u_t) at the T + 1 cut points (prompt end and every segment end), with
//! the trace's keys/values computed once and shared by all cuts ([`crate::model::score_cuts`]).
//! σ then follows [`rredcot::credit::sigma`]. y* is `answer_template` filled with the reference
//! answer (`answer_source = "reference"`) or the rollout's own extracted answer (`"self"`), joined
//! to each cut without stacking newlines ([`crate::traces::JoinedTarget`]: after a cut that ends a
//! line, the template's leading newline is dropped); u* is the reference solution, on a line of its
//! own the same way (a newline first after a cut that does not end a line).
//!
//! Segments cover the chain of thought only (`0..cot_end`, [`rredcot::credit::thinking`]), so
//! the last cut is the end of the thinking: right after `</think>` for a thinking model, before
//! the final-answer line otherwise. R_T asks for y* there, never after the model's own answer
//! (which would ask for the answer a second time). A trace that never closed its thinking (and was
//! segmented whole, `on_unclosed = "truncate"`) ends before a trailing stop token (`<|im_end|>`).
//! When u* is written as `<think>…</think>answer` (the default world), v_t scores its chain of
//! thought ([`rredcot::credit::thinking::reasoning_body`]): the continuation of a partial one.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use rredcot::artifact::rows::ScoreRow;
use rredcot::credit::sigma::{self, Normalize, Terms};
use rredcot::credit::thinking::reasoning_body;
use rredcot::engine::{Builtin, Executable, StageContext};

use super::{load_policy_on, use_threads};
use crate::model::{score_cuts_batch, CutRequest, CutScorer, Tokenizer};
use crate::traces::{check_answer_template, trailing_newlines, write_scores, JoinedTarget, Trace, TraceInputs, TraceTokens};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum AnswerSource {
    Reference,
    #[serde(rename = "self")]
    Own,
}

/// A trace without the answer/solution it needs: stop with an error, or give it uniform σ
/// (empty R/v, `method = "uniform"`) and count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum OnMissing {
    Error,
    Uniform,
}

/// A trace + solution longer than the context: stop, or shorten the solution target u* (counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum OnTooLong {
    Error,
    Truncate,
}

/// The stage's params (stages/score_sigma.toml documents them); unknown or mistyped ones are
/// errors naming the stage and the param.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    normalize: Normalize,
    terms: Terms,
    answer_source: AnswerSource,
    answer_template: String,
    #[serde(rename = "on_missing_reference")]
    on_missing: OnMissing,
    on_too_long: OnTooLong,
    /// `kv_shared` (the stage's point) or `naive` (one prefill per cut; the oracle, for checks).
    scorer: CutScorer,
    pack_tokens: usize,
    dedupe_rows: bool,
    device: crate::model::DeviceChoice,
    dtype: crate::model::DtypeChoice,
    threads: i64,
}

/// Fewest reference-solution tokens kept when `on_too_long = "truncate"` shortens u*.
const MIN_SOLUTION_TOKENS: usize = 32;

/// Outcome for one trace: the score row, and whether it was truncated / fell back.
struct Scored {
    row: ScoreRow,
    solution_truncated: bool,
    trace_truncated: bool,
    fell_back: bool,
    missing: bool,
}

/// A trace ready to score: its token ids, its cuts, the forms of y* and u* and which of them
/// each cut asks for.
struct Request {
    trace: Vec<i64>,
    cuts: Vec<usize>,
    /// y*'s forms, then u*'s (each only when scored).
    targets: Vec<Vec<i64>>,
    /// Per cut, its form of y* then its form of u* (indices into `targets`): a cut is scored
    /// against its own forms only. Scoring u*'s second form at every cut of the quickstart (where
    /// only the `</think>` cut asks for it) cost σ 65 % more positions.
    picks: Vec<Vec<usize>>,
    scores_answer: bool,
    scores_solution: bool,
    solution_truncated: bool,
    trace_truncated: bool,
}

/// What one segments row needs: scoring, or nothing (uniform σ: no reference to score against).
enum Prepared {
    Score(Request),
    Done(Scored),
}

/// The trace's cuts and targets (y* and/or u*) within the policy's `context`, or its uniform σ
/// when the reference it needs is missing and `on_missing_reference = "uniform"`.
fn prepare(context: usize, tok: &Tokenizer, s: &Settings, trace: &Trace, tokens: TraceTokens) -> Result<Prepared> {
    let (prompt, rollout, seg) = (trace.prompt, trace.rollout, trace.seg);
    let segments = tokens.bounds.len();
    let uniform = |missing: bool| Scored {
        row: ScoreRow {
            prompt_id: seg.prompt_id.clone(),
            sample_idx: seg.sample_idx,
            r: vec![],
            v: vec![],
            sigma: vec![1.0 / segments as f64; segments],
            method: "uniform".into(),
        },
        solution_truncated: false,
        trace_truncated: false,
        fell_back: false,
        missing,
    };
    let answer = match s.answer_source {
        AnswerSource::Reference => prompt.answer.as_deref(),
        AnswerSource::Own => rollout.answer_extracted.as_deref(),
    }
    .filter(|a| !a.trim().is_empty());
    let solution = prompt.solution.as_deref().map(reasoning_body).filter(|u| !u.trim().is_empty());
    let need_answer = s.terms.uses_answer();
    let need_solution = s.terms.uses_solution();
    if (need_answer && answer.is_none()) || (need_solution && solution.is_none()) {
        let what = if need_answer && answer.is_none() { "answer" } else { "reference solution" };
        return match s.on_missing {
            OnMissing::Error => bail!("no {what} to score against (set on_missing_reference = \"uniform\" to give such traces uniform credit)"),
            OnMissing::Uniform => Ok(Prepared::Done(uniform(true))),
        };
    }

    let p = tokens.prompt.len();
    let mut cuts: Vec<usize> = std::iter::once(p).chain(tokens.bounds.iter().map(|&(_, e)| p + e)).collect();
    let mut trace = tokens.prefix(tokens.completion.len());

    let y = match answer.filter(|_| need_answer) {
        Some(a) => Some(JoinedTarget::answer(tok, &s.answer_template, a.trim())?),
        None => None,
    };
    let mut u = match solution.filter(|_| need_solution) {
        Some(text) => Some(JoinedTarget::solution(tok, text)?),
        None => None,
    };
    let longest = |y: &Option<JoinedTarget>, u: &Option<JoinedTarget>| y.iter().chain(u).map(JoinedTarget::longest).max().unwrap_or(0);
    let (mut solution_truncated, mut trace_truncated) = (false, false);
    if trace.len() + longest(&y, &u) > context {
        if s.on_too_long == OnTooLong::Error {
            bail!(
                "trace ({} tokens) + longest target ({} tokens) exceed the policy's context of {context} (on_too_long = \"truncate\" scores a shortened window)",
                trace.len(),
                longest(&y, &u)
            );
        }
        // 1. Shorten u* to fit beside the whole trace, but keep enough of it to mean something.
        if let Some(u) = u.as_mut() {
            let keep = context.saturating_sub(trace.len()).max(MIN_SOLUTION_TOKENS.min(u.longest()));
            if keep < u.longest() {
                u.truncate(keep);
                solution_truncated = true;
            }
        }
        // 2. Cuts past the room left for the targets are clamped: those segments get σ^unnorm = 0.
        let max_prefix = context.saturating_sub(longest(&y, &u));
        if max_prefix <= p {
            bail!("prompt ({p} tokens) + longest target ({} tokens) leave no room in the policy's context of {context}", longest(&y, &u));
        }
        if trace.len() > max_prefix {
            trace.truncate(max_prefix);
            cuts.iter_mut().for_each(|c| *c = (*c).min(max_prefix));
            trace_truncated = true;
        }
    }
    // The forms of y* and u* each cut asks for: how its prefix ends picks them.
    let (y_forms, u_forms) = (y.as_ref().map_or(&[][..], JoinedTarget::forms), u.as_ref().map_or(&[][..], JoinedTarget::forms));
    let mut picks = Vec::with_capacity(cuts.len());
    for &c in &cuts {
        let newlines = trailing_newlines(tok, &trace[..c])?;
        let y_pick = y.as_ref().map(|y| y.form_after_newlines(newlines));
        let u_pick = u.as_ref().map(|u| y_forms.len() + u.form_after_newlines(newlines));
        picks.push(y_pick.into_iter().chain(u_pick).collect());
    }
    Ok(Prepared::Score(Request {
        trace,
        cuts,
        targets: y_forms.iter().chain(u_forms).cloned().collect(),
        picks,
        scores_answer: y.is_some(),
        scores_solution: u.is_some(),
        solution_truncated,
        trace_truncated,
    }))
}

/// σ of trace `t` from its values `values[cut][picked target]` (a non-finite σ is an error
/// naming it).
fn finish(t: &Trace, q: Request, values: &[Vec<f64>], s: &Settings) -> Result<Scored> {
    // A cut's values: y*'s form, then u*'s, each only when scored (R / v stay empty otherwise).
    let column = |scored: bool, k: usize| if scored { values.iter().map(|row| row[k]).collect() } else { Vec::new() };
    let r = column(q.scores_answer, 0);
    let v = column(q.scores_solution, q.scores_answer as usize);
    let unnorm = sigma::unnormalized(&r, &v, s.terms);
    let (row, fell_back) = t.score_row(r, v, &unnorm, s.normalize, "rredcot")?;
    Ok(Scored { row, solution_truncated: q.solution_truncated, trace_truncated: q.trace_truncated, fell_back, missing: false })
}

pub const STAGE: Builtin = Builtin { name: "score_sigma", version: "7", runs_in: Executable::Worker, run };

pub fn run(ctx: &mut StageContext) -> Result<()> {
    let s: Settings = ctx.params()?;
    use_threads(s.threads);
    check_answer_template(&s.answer_template).with_context(|| format!("stage `{}`", ctx.instance))?;
    let inputs = TraceInputs::read(ctx)?;
    let traces = inputs.traces()?;
    let (model, tok) = load_policy_on(ctx, "policy", s.device, s.dtype)?;
    let context = model.cfg.max_position_embeddings as usize;

    // 1. Every row's trace, cuts and targets (errors name the row).
    let mut prepared = Vec::with_capacity(traces.len());
    for t in &traces {
        let tokens = t.tokens(&tok)?;
        prepared.push(prepare(context, &tok, &s, t, tokens).with_context(|| t.at.clone())?);
    }
    // 2. The traces to score, in one model-core call: rows shared between traces (the
    //    prompt-end cut of a group, samples that begin alike) scored once, the rest in packed
    //    passes.
    let mut requests: Vec<CutRequest> = Vec::new();
    let mut row_of_request: Vec<usize> = Vec::new();
    for (i, p) in prepared.iter().enumerate() {
        if let Prepared::Score(q) = p {
            requests.push(CutRequest { trace: &q.trace, cuts: &q.cuts, targets: &q.targets, picks: Some(&q.picks) });
            row_of_request.push(i);
        }
    }
    let target_rows: usize = requests.iter().flat_map(|q| (0..q.cuts.len()).map(|i| q.targets_at(i))).sum();
    let t0 = Instant::now();
    let mut progress = ctx.progress(traces.len() as u64, "sigma");
    let uniform = prepared.iter().filter(|p| matches!(p, Prepared::Done(_))).count();
    let (scored, cost) = score_cuts_batch(&model, &requests, s.scorer, s.pack_tokens, s.dedupe_rows, |done| {
        let done = uniform + done;
        let rate = done as f64 / t0.elapsed().as_secs_f64().max(1e-9);
        progress.set(done as u64, &format!("sigma {rate:.1} traces/s"));
    })
    .map_err(|e| {
        let rows = format!("scoring {} through row {}", traces[row_of_request[e.first]].at, row_of_request[e.last]);
        anyhow::Error::new(e.error).context(rows)
    })?;
    let mut values: Vec<Vec<Vec<f64>>> = vec![Vec::new(); prepared.len()];
    for (&i, v) in row_of_request.iter().zip(scored) {
        values[i] = v;
    }
    // 3. σ per trace, in row order.
    let mut out = Vec::with_capacity(traces.len());
    let (mut sol_trunc, mut trace_trunc, mut fell_back, mut missing) = (0i64, 0i64, 0i64, 0i64);
    for ((p, v), t) in prepared.into_iter().zip(values).zip(&traces) {
        let scored = match p {
            Prepared::Done(d) => d,
            Prepared::Score(q) => finish(t, q, &v, &s)?,
        };
        sol_trunc += scored.solution_truncated as i64;
        trace_trunc += scored.trace_truncated as i64;
        fell_back += scored.fell_back as i64;
        missing += scored.missing as i64;
        out.push(scored.row);
    }
    progress.finish();
    ctx.count("missing_reference", missing);
    ctx.count("solution_targets_truncated", sol_trunc);
    ctx.count("traces_truncated", trace_trunc);
    ctx.count("tokens_generated", 0);
    ctx.count("forward_sequences", cost.sequences as i64);
    ctx.count("forward_tokens", cost.positions as i64);
    ctx.count("rows_reused", cost.reused_rows as i64);
    // (cut, target) rows asked for, shared ones included: R's and v's length when each cut gets
    // only its own forms of y* and u*.
    ctx.count("target_rows", target_rows as i64);
    ctx.metric("scoring_s_per_trace", t0.elapsed().as_secs_f64() / out.len().max(1) as f64);
    write_scores(ctx, &out, fell_back, s.normalize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rredcot::engine::context::parse_params;

    #[test]
    fn the_shipped_params_are_what_the_stage_reads() {
        let shipped = super::super::tests::shipped_params("score_sigma");
        let s: Settings = parse_params("score_sigma", &shipped).unwrap();
        assert_eq!((s.scorer, s.on_missing, s.dedupe_rows), (CutScorer::KvShared, OnMissing::Error, true));
        let mut typo = shipped;
        typo.insert("on_missing".into(), "skip".into());
        let e = parse_params::<Settings>("score", &typo).unwrap_err().to_string();
        assert!(e.contains("unknown field `on_missing`"), "{e}");
    }
}
