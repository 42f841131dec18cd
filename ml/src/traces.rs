//! What the per-trace credit scorers (`score_sigma`, `score_mc`, `score_loo`, `score_grad`,
//! `score_progress`) share: their wiring (prompts, rollouts, segments joined by (prompt id,
//! sample)), a trace's token ids as the policy sees them, the y* target, and the `scores` row with
//! σ normalized by [`rredcot::credit::sigma::normalize`].
//!
//! Also the prompt ids every ML stage gives the policy ([`encode_prompt`]: rollout, scoring and
//! update must agree on them).
//!
//! Must not know any one method: each scorer computes its per-segment values and σ^unnorm.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use rredcot::artifact::rows::{PromptRow, RolloutRow, ScoreRow, SegmentRow};
use rredcot::artifact::{read_rows, write_rows, Schema};
use rredcot::credit::segmentation::checked_ends;
use rredcot::credit::sigma::{self, Normalize};
use rredcot::engine::StageContext;

use crate::model::{ChatMessage, Tokenizer};

/// The `prompts`, `rollouts` and `segments` inputs of a scorer.
pub struct TraceInputs {
    prompts: Vec<PromptRow>,
    rollouts: Vec<RolloutRow>,
    segments: Vec<SegmentRow>,
    rollouts_path: PathBuf,
    segments_path: PathBuf,
}

/// One segmented rollout with its prompt; `at` names it in errors.
pub struct Trace<'a> {
    pub prompt: &'a PromptRow,
    pub rollout: &'a RolloutRow,
    pub seg: &'a SegmentRow,
    pub at: String,
}

/// A trace in token ids: the chat-templated prompt, the chain of thought (`0..cot_end` of the
/// completion: the answer after it is no part of any segment) without a trailing stop token (as
/// `score_sigma` scores it), and each segment's `[start, end)` in it, clamped to it (a segment
/// holding only the stop token is empty here).
pub struct TraceTokens {
    pub prompt: Vec<i64>,
    pub completion: Vec<i64>,
    pub bounds: Vec<(usize, usize)>,
}

impl TraceTokens {
    /// The prompt followed by the completion's first `upto` tokens.
    pub fn prefix(&self, upto: usize) -> Vec<i64> {
        self.prompt.iter().chain(&self.completion[..upto]).copied().collect()
    }
}

impl TraceInputs {
    pub fn read(ctx: &StageContext) -> Result<TraceInputs> {
        let rollouts_path = ctx.input("rollouts")?.to_path_buf();
        let segments_path = ctx.input("segments")?.to_path_buf();
        Ok(TraceInputs {
            prompts: read_rows(ctx.input("prompts")?, Schema::Prompts)?,
            rollouts: read_rows(&rollouts_path, Schema::Rollouts)?,
            segments: read_rows(&segments_path, Schema::Segments)?,
            rollouts_path,
            segments_path,
        })
    }

    /// Every segments row with its rollout and prompt, in the segments' order.
    pub fn traces(&self) -> Result<Vec<Trace<'_>>> {
        let by_id: HashMap<&str, &PromptRow> = self.prompts.iter().map(|p| (p.id.as_str(), p)).collect();
        let by_key: HashMap<(&str, i32), &RolloutRow> =
            self.rollouts.iter().map(|r| ((r.prompt_id.as_str(), r.sample_idx), r)).collect();
        self.segments
            .iter()
            .enumerate()
            .map(|(i, seg)| {
                let at = format!("{} row {i} (prompt {}, sample {})", self.segments_path.display(), seg.prompt_id, seg.sample_idx);
                let rollout = by_key
                    .get(&(seg.prompt_id.as_str(), seg.sample_idx))
                    .with_context(|| format!("{at}: no such rollout in {}", self.rollouts_path.display()))?;
                let prompt = by_id.get(seg.prompt_id.as_str()).with_context(|| format!("{at}: prompt not in the wired prompts"))?;
                Ok(Trace { prompt, rollout, seg, at })
            })
            .collect()
    }
}

impl Trace<'_> {
    pub fn tokens(&self, tok: &Tokenizer) -> Result<TraceTokens> {
        let n = self.rollout.cot_len();
        let ends = checked_ends(&self.seg.seg_starts, &self.seg.seg_ends, n).map_err(anyhow::Error::msg).with_context(|| self.at.clone())?;
        let mut completion: Vec<i64> = self.rollout.completion_ids[..n].iter().map(|&t| t as i64).collect();
        if completion.last().is_some_and(|t| tok.eos_ids.contains(t)) {
            completion.pop();
        }
        let m = completion.len();
        let bounds = ends.iter().scan(0, |start, &e| {
            let b = ((*start).min(m), e.min(m));
            *start = e;
            Some(b)
        });
        Ok(TraceTokens { prompt: encode_prompt(tok, self.prompt).with_context(|| self.at.clone())?, completion, bounds: bounds.collect() })
    }

    /// The prompt's reference answer (y*), or an error naming the row.
    pub fn answer(&self) -> Result<&str> {
        match self.prompt.answer.as_deref().map(str::trim).filter(|a| !a.is_empty()) {
            Some(a) => Ok(a),
            None => bail!("{}: the prompt has no reference answer to score against", self.at),
        }
    }

    /// The `scores` row: per-segment values `r`, `v`, and σ = `unnorm` normalized as
    /// `score_sigma` does; also whether the uniform fallback was used.
    pub fn score_row(&self, r: Vec<f64>, v: Vec<f64>, unnorm: &[f64], how: Normalize, method: &str) -> Result<(ScoreRow, bool)> {
        let (sigma, fell_back) = sigma::normalize(unnorm, how);
        if let Some(bad) = sigma.iter().find(|x| !x.is_finite()) {
            bail!("{}: σ is {bad} (a non-finite value)", self.at);
        }
        let row = ScoreRow { prompt_id: self.seg.prompt_id.clone(), sample_idx: self.seg.sample_idx, r, v, sigma, method: method.into() };
        Ok((row, fell_back))
    }
}

/// y* as the scorers ask for it after a prefix: `template` with `{answer}` filled.
pub fn answer_ids(tok: &Tokenizer, template: &str, answer: &str) -> Result<Vec<i64>> {
    check_answer_template(template)?;
    Ok(tok.encode(&template.replace("{answer}", answer))?)
}

/// A template without `{answer}` would ask every prefix for the same text, whatever y* is.
pub fn check_answer_template(template: &str) -> Result<()> {
    if !template.contains("{answer}") {
        bail!("answer_template must contain {{answer}}");
    }
    Ok(())
}

/// Writes the `scores` output with the counters every scorer reports (`traces_scored`,
/// `segments_scored`, `sigma_uniform_fallback`) and the `mean_sigma_entropy` metric.
pub fn write_scores(ctx: &mut StageContext, rows: &[ScoreRow], fell_back: i64, how: Normalize) -> Result<()> {
    ctx.count("traces_scored", rows.len() as i64);
    ctx.count("segments_scored", rows.iter().map(|r| r.sigma.len() as i64).sum());
    ctx.count("sigma_uniform_fallback", fell_back);
    if how != Normalize::None && !rows.is_empty() {
        ctx.metric("mean_sigma_entropy", rows.iter().map(|r| sigma::entropy(&r.sigma)).sum::<f64>() / rows.len() as f64);
    }
    write_rows(ctx.output("scores")?, Schema::Scores, rows)?;
    Ok(())
}

/// Values of a prefill-only method for one trace (the `R` column), with what it cost.
pub struct Attribution {
    pub values: Vec<f64>,
    /// σ^unnorm per segment; `None`: the values are per segment and are σ^unnorm themselves.
    pub credit: Option<Vec<f64>>,
    /// Sequences run through the model (teacher-forced passes).
    pub sequences: usize,
    /// Token positions in those sequences.
    pub positions: usize,
}

/// The loop of a prefill-only scorer: `value` for every trace, `R` = the values, `v` = zeros of
/// the same length, σ = `normalize` applied to the credit (default: the values); counters
/// `forward_sequences`, `forward_tokens` (and `tokens_generated` = 0), metric
/// `scoring_s_per_trace`.
pub fn score_attribution(ctx: &mut StageContext, method: &str, normalize: Normalize, mut value: impl FnMut(&Trace) -> Result<Attribution>) -> Result<()> {
    let inputs = TraceInputs::read(ctx)?;
    let traces = inputs.traces()?;
    let (mut rows, mut fell_back, mut sequences, mut positions) = (Vec::with_capacity(traces.len()), 0i64, 0usize, 0usize);
    let t0 = Instant::now();
    let mut progress = ctx.progress(traces.len() as u64, method);
    for (i, trace) in traces.iter().enumerate() {
        let a = value(trace).with_context(|| trace.at.clone())?;
        sequences += a.sequences;
        positions += a.positions;
        let zeros = vec![0.0; a.values.len()];
        let credit = a.credit.as_ref().unwrap_or(&a.values);
        let (row, fb) = trace.score_row(a.values.clone(), zeros, credit, normalize, method)?;
        fell_back += fb as i64;
        rows.push(row);
        let rate = (i + 1) as f64 / t0.elapsed().as_secs_f64().max(1e-9);
        progress.set(i as u64 + 1, &format!("{method} {rate:.1} traces/s"));
    }
    progress.finish();
    ctx.count("tokens_generated", 0);
    ctx.count("forward_sequences", sequences as i64);
    ctx.count("forward_tokens", positions as i64);
    ctx.metric("scoring_s_per_trace", t0.elapsed().as_secs_f64() / rows.len().max(1) as f64);
    write_scores(ctx, &rows, fell_back, normalize)
}

/// The chat of a `prompts.prompt` value: its messages when it is a JSON chat, else one user turn.
fn prompt_messages(prompt: &str) -> Vec<ChatMessage> {
    if let Ok(serde_json::Value::Array(msgs)) = serde_json::from_str::<serde_json::Value>(prompt.trim_start()) {
        let chat: Vec<ChatMessage> = msgs
            .iter()
            .filter_map(|m| Some(ChatMessage::new(m.get("role")?.as_str()?, m.get("content")?.as_str()?)))
            .collect();
        if !chat.is_empty() {
            return chat;
        }
    }
    vec![ChatMessage::new("user", prompt)]
}

/// The `meta` key of a reset prompt (stage `reset`) holding the trace prefix it continues.
pub const RESET_PREFIX_KEY: &str = "reset_prefix_ids";

/// Prompt token ids as the policy sees them (chat template + assistant header, then a reset
/// prompt's trace prefix). Rollout, scoring and update must agree on this, so all call it.
pub fn encode_prompt(tok: &Tokenizer, row: &PromptRow) -> Result<Vec<i64>> {
    let mut ids = tok.encode_chat(&prompt_messages(&row.prompt), true)?;
    ids.extend(reset_prefix(row)?);
    Ok(ids)
}

/// The reset prefix in a prompt's `meta` (empty for an ordinary prompt, or a meta that is not a
/// JSON object: meta is free-form elsewhere).
fn reset_prefix(row: &PromptRow) -> Result<Vec<i64>> {
    if !row.meta.contains(RESET_PREFIX_KEY) {
        return Ok(Vec::new());
    }
    let Ok(serde_json::Value::Object(meta)) = serde_json::from_str::<serde_json::Value>(&row.meta) else {
        return Ok(Vec::new());
    };
    match meta.get(RESET_PREFIX_KEY) {
        None => Ok(Vec::new()),
        Some(v) => serde_json::from_value(v.clone()).with_context(|| format!("prompt {}: meta `{RESET_PREFIX_KEY}` is not a list of token ids", row.id)),
    }
}

#[cfg(test)]
mod prompt_tests {
    #[test]
    fn chat_prompts_keep_their_roles_and_plain_text_is_a_user_turn() {
        let m = super::prompt_messages(r#"[{"role":"system","content":"be brief"},{"role":"user","content":"2+2?"}]"#);
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].role.as_str(), m[1].content.as_str()), ("system", "2+2?"));
        let m = super::prompt_messages("What is 2+2?");
        assert_eq!((m.len(), m[0].role.as_str()), (1, "user"));
    }

    #[test]
    fn a_reset_prompt_carries_its_prefix_and_other_metas_none() {
        let row = |meta: &str| rredcot::artifact::rows::PromptRow { id: "p#0@2".into(), prompt: "q".into(), answer: None, solution: None, source: "s".into(), meta: meta.into() };
        assert_eq!(super::reset_prefix(&row(r#"{"reset_prefix_ids": [5, 6, 7], "split": "eval"}"#)).unwrap(), vec![5, 6, 7]);
        assert!(super::reset_prefix(&row(r#"{"split": "eval"}"#)).unwrap().is_empty());
        assert!(super::reset_prefix(&row("not json reset_prefix_ids")).unwrap().is_empty());
        let err = super::reset_prefix(&row(r#"{"reset_prefix_ids": "abc"}"#)).unwrap_err().to_string();
        assert!(err.contains("p#0@2") && err.contains("reset_prefix_ids"), "{err}");
    }
}
