//! `segment`: cuts every rollout's completion into segments (`segments` artifact) with the
//! method of [`crate::credit::segmentation`]. Token texts come from the wired tokenizer (the
//! policy checkpoint's `tokenizer.json`); entropies from the rollout.
//!
//! `seg_starts[i]..seg_ends[i]` (end exclusive) index `completion_ids`; together they tile the
//! chain of thought `0..cot_end` ([`crate::credit::thinking`]): the tokens after it (the answer)
//! get no segment. A rollout whose thinking never closed is handled by `on_unclosed`: `truncate`
//! (segment the whole completion), `skip` (no row; named on stderr) or `error`; counted as
//! `thinking_unclosed`. A rollout with an empty chain of thought (`cot_end = 0`: a model without
//! thinking that answered on its first line) has nothing to segment: no row, counted as
//! `no_chain_of_thought` (the update gives it GRPO's uniform credit).

use anyhow::{bail, Context, Result};

use crate::artifact::rows::{RolloutRow, SegmentRow};
use crate::artifact::{read_rows, write_rows, Schema};
use crate::credit::segmentation::{self, bounds, Method, Params};
use crate::credit::thinking::OnUnclosed;
use crate::engine::{Builtin, Executable, StageContext};

/// What to do with a rollout that has no completion tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum OnEmpty {
    Error,
    Skip,
}

/// Decoded text of each token (special tokens kept, so `<|im_end|>` is a token of its own).
pub fn token_texts(tok: &tokenizers::Tokenizer, ids: &[i32]) -> Result<Vec<String>> {
    ids.iter()
        .map(|&id| {
            tok.decode(&[id as u32], false)
                .map_err(|e| anyhow::anyhow!("decoding token {id}: {e}"))
        })
        .collect()
}

/// Params of `segment` (defaults and their docs: `stages/segment.toml`).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SegmentParams {
    method: Method,
    max_segments: usize,
    keywords: Vec<String>,
    homogenize: bool,
    on_empty: OnEmpty,
    on_unclosed: OnUnclosed,
}

// Version 3: whitespace-only tokens join the segment they follow (no segment of one newline).
pub const STAGE: Builtin = Builtin { name: "segment", version: "3", runs_in: Executable::Engine, run };

pub fn run(ctx: &mut StageContext) -> Result<()> {
    let p: SegmentParams = ctx.params()?;
    if p.max_segments == 0 {
        bail!("stage `{}`: max_segments must be at least 1", ctx.instance);
    }
    let params = Params { method: p.method, keywords: p.keywords, max_segments: p.max_segments, homogenize: p.homogenize };
    let (method, on_empty, on_unclosed) = (p.method, p.on_empty, p.on_unclosed);
    let tok = crate::tokenizer_file::load(ctx.input("tokenizer")?)?;
    let path = ctx.input("rollouts")?.to_path_buf();
    let rollouts: Vec<RolloutRow> = read_rows(&path, Schema::Rollouts)?;
    let mut out = Vec::with_capacity(rollouts.len());
    let (mut skipped, mut total_segments) = (0i64, 0i64);
    let (mut unclosed, mut unclosed_skipped, mut after_cot, mut no_cot) = (0i64, 0i64, 0i64, 0i64);
    let mut progress = ctx.progress(rollouts.len() as u64, "segmenting");
    for (row_idx, r) in rollouts.iter().enumerate() {
        let at = || {
            format!(
                "{} row {row_idx} (prompt {}, sample {})",
                path.display(),
                r.prompt_id,
                r.sample_idx
            )
        };
        let n = r.completion_ids.len();
        if n == 0 {
            match on_empty {
                OnEmpty::Error => bail!("{}: empty completion, nothing to segment (set on_empty = \"skip\" to drop such rows)", at()),
                OnEmpty::Skip => {
                    skipped += 1;
                    continue;
                }
            }
        }
        if r.entropies.len() != n || r.logprobs.len() != n {
            bail!(
                "{}: {} logprobs and {} entropies for {n} completion tokens",
                at(),
                r.logprobs.len(),
                r.entropies.len()
            );
        }
        // A non-finite logprob means a broken rollout; later stages would train on it.
        if let Some(i) = r.logprobs.iter().position(|l| !l.is_finite()) {
            bail!("{}: logprob of token {i} is {}", at(), r.logprobs[i]);
        }
        if method != Method::Keyword {
            if r.entropies.iter().all(|e| e.is_nan()) {
                bail!(
                    "{}: the rollout has no entropies (sampled by an engine with entropies = \"none\"); {} segmentation needs them: \
                     rerun the rollout with entropies = \"prefill\" (exact) or \"topk\" (estimate), or segment with method = \"keyword\"",
                    at(),
                    method.as_str()
                );
            }
            if let Some(i) = r.entropies.iter().position(|e| !e.is_finite()) {
                bail!("{}: entropy of token {i} is {}", at(), r.entropies[i]);
            }
        }
        if let Some(c) = r.cot_end.filter(|&c| c < 0 || c as usize > n) {
            bail!("{}: cot_end {c} is outside the completion's 0..={n} tokens", at());
        }
        if r.cot_end == Some(0) {
            no_cot += 1;
            after_cot += n as i64;
            progress.inc(1);
            continue;
        }
        if r.cot_end.is_none() {
            unclosed += 1;
            match on_unclosed {
                OnUnclosed::Error => bail!("{}: the chain of thought never ends (no end-of-thinking token or answer line; set on_unclosed = \"truncate\" or \"skip\")", at()),
                OnUnclosed::Skip => {
                    eprintln!("segment: skipped {}: the chain of thought never ends (on_unclosed = \"skip\")", at());
                    unclosed_skipped += 1;
                    continue;
                }
                OnUnclosed::Truncate => {}
            }
        }
        let cot = r.cot_len();
        after_cot += (n - cot) as i64;
        let texts = token_texts(&tok, &r.completion_ids[..cot]).with_context(at)?;
        let cuts = segmentation::segment(&texts, &r.entropies[..cot], &params);
        let b = bounds(&cuts, cot);
        total_segments += b.len() as i64;
        out.push(SegmentRow {
            prompt_id: r.prompt_id.clone(),
            sample_idx: r.sample_idx,
            seg_starts: b.iter().map(|&(s, _)| s as i32).collect(),
            seg_ends: b.iter().map(|&(_, e)| e as i32).collect(),
            method: method.as_str().to_string(),
        });
        progress.inc(1);
    }
    progress.finish();
    ctx.count("traces_segmented", out.len() as i64);
    ctx.count("empty_completions_skipped", skipped);
    ctx.count("thinking_unclosed", unclosed);
    ctx.count("unclosed_skipped", unclosed_skipped);
    ctx.count("tokens_after_cot", after_cot);
    ctx.count("no_chain_of_thought", no_cot);
    ctx.metric("mean_segments", total_segments as f64 / out.len().max(1) as f64);
    write_rows(ctx.output("segments")?, Schema::Segments, &out)?;
    Ok(())
}
