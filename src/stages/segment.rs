//! `segment`: cuts every rollout's completion into segments (`segments` artifact) with the
//! method of [`crate::credit::segmentation`]. Token texts come from the wired tokenizer (the
//! policy checkpoint's `tokenizer.json`); entropies from the rollout.
//!
//! `seg_starts[i]..seg_ends[i]` (end exclusive) index `completion_ids`; together they tile it.

use anyhow::{bail, Context, Result};

use crate::artifact::rows::{RolloutRow, SegmentRow};
use crate::artifact::{read_rows, write_rows, Schema};
use crate::credit::segmentation::{self, bounds, Method, Params};
use crate::engine::StageContext;

/// What to do with a rollout that has no completion tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum OnEmpty {
    Error,
    Skip,
}

/// Decoded text of each token (special tokens kept, so `<|im_end|>` is a token of its own).
fn token_texts(tok: &tokenizers::Tokenizer, ids: &[i32]) -> Result<Vec<String>> {
    ids.iter()
        .map(|&id| {
            tok.decode(&[id as u32], false)
                .map_err(|e| anyhow::anyhow!("decoding token {id}: {e}"))
        })
        .collect()
}

pub fn run(ctx: &mut StageContext) -> Result<()> {
    let method: Method = ctx.param("method")?;
    let max_segments: usize = ctx.param("max_segments")?;
    if max_segments == 0 {
        bail!("stage `{}`: max_segments must be at least 1", ctx.instance);
    }
    let params = Params {
        method,
        keywords: ctx.param("keywords")?,
        max_segments,
        homogenize: ctx.param("homogenize")?,
    };
    let on_empty: OnEmpty = ctx.param("on_empty")?;
    let tok = super::tokenizer_train::load(ctx.input("tokenizer")?)?;
    let path = ctx.input("rollouts")?.to_path_buf();
    let rollouts: Vec<RolloutRow> = read_rows(&path, Schema::Rollouts)?;
    let mut out = Vec::with_capacity(rollouts.len());
    let (mut skipped, mut total_segments) = (0i64, 0i64);
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
            if let Some(i) = r.entropies.iter().position(|e| !e.is_finite()) {
                bail!("{}: entropy of token {i} is {}", at(), r.entropies[i]);
            }
        }
        let texts = token_texts(&tok, &r.completion_ids).with_context(at)?;
        let cuts = segmentation::segment(&texts, &r.entropies, &params);
        let b = bounds(&cuts, n);
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
    ctx.metric(
        "mean_segments",
        total_segments as f64 / out.len().max(1) as f64,
    );
    write_rows(ctx.output("segments")?, Schema::Segments, &out)?;
    Ok(())
}
