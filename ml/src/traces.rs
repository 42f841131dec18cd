//! What the per-trace credit scorers (`score_sigma`, `score_mc`, `score_loo`, `score_grad`,
//! `score_progress`) share: their wiring (prompts, rollouts, segments joined by (prompt id,
//! sample)), a trace's token ids as the policy sees them, the y* / u* targets joined to a prefix
//! ([`JoinedTarget`]), and the `scores` row with
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

/// How many of a prefix's last tokens [`trailing_newlines`] decodes to see how it ends (a run of
/// newline tokens longer than this is as good as a blank line).
const PREFIX_TAIL_TOKENS: usize = 8;

/// How many newlines `prefix` ends with (decoded from its last [`PREFIX_TAIL_TOKENS`] tokens).
pub fn trailing_newlines(tok: &Tokenizer, prefix: &[i64]) -> Result<usize> {
    let tail = tok.decode(&prefix[prefix.len().saturating_sub(PREFIX_TAIL_TOKENS)..], false)?;
    Ok(tail.len() - tail.trim_end_matches('\n').len())
}

/// A scored target (y* or u*) joined to each prefix without stacking newlines. The text's leading
/// newlines put it on a line of its own; a prefix that already ends in newlines has them, so that
/// many are dropped (`"\nThe answer is 6."` after a prefix ending in `"\n"` is `"The answer is
/// 6."`). Asked after a blank line with its newline kept, SmolLM2-135M gave y* ~20 nats less
/// (−35.9 vs −15.5, 37 cuts): formatting, not reasoning, and ΔR took it wherever consecutive cuts
/// ended differently. u* glued to a cut that ends a sentence (`"= 6.Janet"`) moved v the same
/// way (`bench/answer_join.sh`).
#[derive(Debug)]
pub struct JoinedTarget {
    /// `forms[k]`: the text's token ids with its first `k` leading newlines dropped.
    forms: Vec<Vec<i64>>,
}

impl JoinedTarget {
    /// y*: `template` with `{answer}` filled.
    pub fn answer(tok: &Tokenizer, template: &str, answer: &str) -> Result<JoinedTarget> {
        check_answer_template(template)?;
        let text = template.replace("{answer}", answer);
        if text.trim_start_matches('\n').is_empty() {
            bail!("answer_template {template:?} filled with {answer:?} is only newlines: no y* to score");
        }
        Self::from_text(tok, &text)
    }

    /// u*: the reference solution's text on a line of its own (its own leading newlines dropped).
    pub fn solution(tok: &Tokenizer, text: &str) -> Result<JoinedTarget> {
        let body = text.trim_start_matches('\n');
        if body.is_empty() {
            bail!("the reference solution is empty: no u* to score");
        }
        Self::from_text(tok, &format!("\n{body}"))
    }

    fn from_text(tok: &Tokenizer, text: &str) -> Result<JoinedTarget> {
        let leading = text.len() - text.trim_start_matches('\n').len();
        let forms = (0..=leading).map(|k| tok.encode(&text[k..])).collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(JoinedTarget { forms })
    }

    /// Every form the target can take, `[k]` with `k` leading newlines dropped.
    pub fn forms(&self) -> &[Vec<i64>] {
        &self.forms
    }

    /// The most tokens any form takes (what must fit in the context beside a prefix).
    pub fn longest(&self) -> usize {
        self.forms.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// Keeps at most `keep` tokens of every form (`on_too_long = "truncate"`).
    pub fn truncate(&mut self, keep: usize) {
        self.forms.iter_mut().for_each(|f| f.truncate(keep));
    }

    /// Which form follows a prefix that ends in `newlines` newlines: as many leading ones dropped.
    pub fn form_after_newlines(&self, newlines: usize) -> usize {
        newlines.min(self.forms.len() - 1)
    }

    /// The token ids that follow `prefix` (see [`Self::form_after_newlines`]).
    pub fn after(&self, tok: &Tokenizer, prefix: &[i64]) -> Result<&[i64]> {
        Ok(&self.forms[self.form_after_newlines(trailing_newlines(tok, prefix)?)])
    }
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
mod joined_target_tests {
    use super::JoinedTarget;
    use crate::model::Tokenizer;

    fn tokenizer() -> Tokenizer {
        let texts: Vec<String> = (0..40).map(|i| format!("Add 3: {i} + 3 = {}.\n\nThe answer is {}.\n", i + 3, i + 3)).collect();
        Tokenizer::trained_on(&texts)
    }

    #[test]
    fn y_star_is_joined_to_the_prefix_without_stacking_newlines() {
        let tok = tokenizer();
        let y = JoinedTarget::answer(&tok, "\nThe answer is {answer}.", "6").unwrap();
        let text = |ids: &[i64]| tok.decode(ids, false).unwrap();
        assert_eq!(y.forms().len(), 2);
        for (prefix, want) in [
            ("Add 3: 3 + 3 = 6", "\nThe answer is 6."),
            ("Add 3: 3 + 3 = 6.\n", "The answer is 6."),
            ("Add 3: 3 + 3 = 6.\n\n", "The answer is 6."),
            ("<|im_start|>assistant\n", "The answer is 6."),
        ] {
            let ids = tok.encode(prefix).unwrap();
            assert_eq!(text(y.after(&tok, &ids).unwrap()), want, "after {prefix:?}");
        }
        // Two leading newlines: a prefix ending in one newline keeps one, a blank line none.
        let y = JoinedTarget::answer(&tok, "\n\nThe answer is {answer}.", "6").unwrap();
        for (prefix, want) in [("= 6", "\n\nThe answer is 6."), ("= 6\n", "\nThe answer is 6."), ("= 6\n\n", "The answer is 6."), ("= 6\n\n\n", "The answer is 6.")] {
            let ids = tok.encode(prefix).unwrap();
            assert_eq!(text(y.after(&tok, &ids).unwrap()), want, "after {prefix:?}");
        }
        // Without leading newlines there is one form, whatever the prefix.
        let y = JoinedTarget::answer(&tok, "The answer is {answer}.", "6").unwrap();
        assert_eq!(y.forms().len(), 1);
        assert_eq!(text(y.after(&tok, &tok.encode("= 6\n\n").unwrap()).unwrap()), "The answer is 6.");
        assert!(JoinedTarget::answer(&tok, "The answer", "6").unwrap_err().to_string().contains("{answer}"));
    }

    #[test]
    fn u_star_starts_a_line_of_its_own_after_a_cut_that_does_not_end_one() {
        let tok = tokenizer();
        let text = |ids: &[i64]| tok.decode(ids, false).unwrap();
        // Leading newlines of the solution itself are not stacked on the added one.
        let u = JoinedTarget::solution(&tok, "\n\nAdd 3: 3 + 3 = 6.").unwrap();
        assert_eq!(u.forms().len(), 2);
        for (prefix, want) in [
            ("Add 3: 3 + 3 = 6.", "\nAdd 3: 3 + 3 = 6."),
            ("Add 3: 3 + 3 = 6.\n", "Add 3: 3 + 3 = 6."),
            ("Add 3: 3 + 3 = 6.\n\n", "Add 3: 3 + 3 = 6."),
        ] {
            assert_eq!(text(u.after(&tok, &tok.encode(prefix).unwrap()).unwrap()), want, "after {prefix:?}");
        }
        let mut u = u;
        u.truncate(2);
        assert!(u.forms().iter().all(|f| f.len() == 2) && u.longest() == 2);
        assert!(JoinedTarget::solution(&tok, "\n\n").unwrap_err().to_string().contains("empty"));
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
