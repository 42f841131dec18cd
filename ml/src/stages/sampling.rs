//! Sampling G completions per prompt, shared by `rollout` (training batches) and `eval` (avg@k):
//! which prompts can be sampled, per-row seeds, batching, the context-window clamp, progress.

use anyhow::{bail, Context, Result};
use rredcot::artifact::rows::PromptRow;
use rredcot::engine::hash::sha256_hex;
use rredcot::engine::StageContext;
use std::path::Path;
use std::time::Instant;

use super::encode_prompt;
use crate::model::{self, DecoderLm, Generation, SamplingParams, Tokenizer};

/// What to do with a prompt that cannot be sampled (no reference answer, too long).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnBadPrompt {
    Error,
    Skip,
}

/// The sampling seed of one row.
pub fn row_seed(seed: u64, prompt_id: &str, sample_idx: usize) -> u64 {
    let h = sha256_hex(format!("{seed}\u{0}{prompt_id}\u{0}{sample_idx}").as_bytes());
    u64::from_str_radix(&h[..16], 16).expect("hex")
}

/// One completion to sample: (prompt, sample index) with the prompt's token ids.
pub struct Job<'a> {
    pub row: &'a PromptRow,
    pub gold: &'a str,
    pub ids: Vec<i64>,
    pub sample_idx: usize,
}

/// The sampling params every sampling stage shares (`temperature`, `top_p`, `top_k`,
/// `max_new_tokens`, `stop_strings`).
pub fn sampling_params(ctx: &StageContext) -> Result<SamplingParams> {
    Ok(SamplingParams {
        temperature: ctx.param("temperature")?,
        top_p: ctx.param("top_p")?,
        top_k: ctx.param("top_k")?,
        max_new_tokens: ctx.param("max_new_tokens")?,
        stop_strings: ctx.param("stop_strings")?,
        stop_token_ids: vec![],
    })
}

/// `group` jobs per prompt of `prompts` (read from `path`, named in errors). A prompt without a
/// reference answer or not shorter than `context` is an error or a skip counted in the stage's
/// `prompts_skipped_*` counters.
pub fn plan_jobs<'a>(
    ctx: &mut StageContext,
    prompts: &'a [PromptRow],
    path: &Path,
    tok: &Tokenizer,
    context: usize,
    group: usize,
    on_bad: OnBadPrompt,
) -> Result<Vec<Job<'a>>> {
    let mut jobs = Vec::with_capacity(prompts.len() * group);
    let (mut no_answer, mut too_long) = (0i64, 0i64);
    for (i, row) in prompts.iter().enumerate() {
        let at = || format!("{} row {i} (prompt {})", path.display(), row.id);
        let Some(gold) = row.answer.as_deref().filter(|a| !a.trim().is_empty()) else {
            match on_bad {
                OnBadPrompt::Error => bail!("{}: no reference answer, so no reward (set on_bad_prompt = \"skip\" to drop such prompts)", at()),
                OnBadPrompt::Skip => {
                    no_answer += 1;
                    continue;
                }
            }
        };
        let ids = encode_prompt(tok, row).with_context(at)?;
        if ids.len() >= context {
            match on_bad {
                OnBadPrompt::Error => bail!("{}: prompt is {} tokens, the policy's context is {context}", at(), ids.len()),
                OnBadPrompt::Skip => {
                    too_long += 1;
                    continue;
                }
            }
        }
        for sample_idx in 0..group {
            jobs.push(Job { row, gold, ids: ids.clone(), sample_idx });
        }
    }
    ctx.count("prompts_skipped_no_answer", no_answer);
    ctx.count("prompts_skipped_too_long", too_long);
    Ok(jobs)
}

/// Samples every job in batches of `batch_size` rows (in job order, so the result does not
/// depend on timing) and returns one generation per job; row seeds from (`seed`, prompt id,
/// sample index). See [`sample_seeded`].
#[allow(clippy::too_many_arguments)]
pub fn sample_jobs(
    ctx: &mut StageContext,
    model: &DecoderLm,
    tok: &Tokenizer,
    jobs: &[Job],
    seed: u64,
    batch_size: usize,
    sampling: &SamplingParams,
    label: &str,
) -> Result<Vec<Generation>> {
    let rows: Vec<(&[i64], u64)> = jobs.iter().map(|j| (j.ids.as_slice(), row_seed(seed, &j.row.id, j.sample_idx))).collect();
    sample_seeded(ctx, model, tok, &rows, batch_size, sampling, label, |i| format!("prompt {}", jobs[i].row.id))
}

/// Samples `rows` = (prompt ids, row seed) in batches of `batch_size` rows, in order (or, with the
/// stage param `continuous_batching`, in `batch_size` slots refilled as rows finish), and returns
/// one generation per row (`name(i)` names row i in errors). Counts `tokens_generated` and
/// `rows_max_new_tokens_clamped`, sets the `decode_tok_s` metric and shows a progress bar.
#[allow(clippy::too_many_arguments)]
pub fn sample_seeded(
    ctx: &mut StageContext,
    model: &DecoderLm,
    tok: &Tokenizer,
    rows: &[(&[i64], u64)],
    batch_size: usize,
    sampling: &SamplingParams,
    label: &str,
    name: impl Fn(usize) -> String,
) -> Result<Vec<Generation>> {
    if batch_size == 0 {
        bail!("stage `{}`: batch_size must be positive", ctx.instance);
    }
    let context = model.cfg.max_position_embeddings as usize;
    let mut out = Vec::with_capacity(rows.len());
    let (mut generated, mut clamped) = (0i64, 0i64);
    let t0 = Instant::now();
    let mut progress = ctx.progress(rows.len() as u64, label);
    if ctx.param::<bool>("continuous_batching")? {
        // One request, `batch_size` slots: a finished row's slot takes the next row. The
        // context clamp then applies to the whole request (its longest prompt).
        let longest = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        let mut p = sampling.clone();
        if longest + p.max_new_tokens > context {
            p.max_new_tokens = context.saturating_sub(longest);
            clamped = rows.len() as i64;
        }
        let prompts: Vec<Vec<i64>> = rows.iter().map(|r| r.0.to_vec()).collect();
        let seeds: Vec<u64> = rows.iter().map(|r| r.1).collect();
        let gens = tch::no_grad(|| model::generate_continuous(model, Some(tok), &prompts, &seeds, &p, batch_size))
            .with_context(|| format!("sampling {} .. {}", name(0), name(rows.len().saturating_sub(1))))?;
        generated = gens.iter().map(|g| g.tokens.len() as i64).sum::<i64>();
        out = gens;
        progress.set(out.len() as u64, label);
    }
    let static_batches = if out.is_empty() { rows.chunks(batch_size) } else { rows[..0].chunks(batch_size) };
    for chunk in static_batches {
        let longest = chunk.iter().map(|r| r.0.len()).max().unwrap_or(0);
        // Never sample past the context window: shorten this batch's budget and count it.
        let mut p = sampling.clone();
        if longest + p.max_new_tokens > context {
            p.max_new_tokens = context.saturating_sub(longest);
            clamped += chunk.len() as i64;
        }
        let prompts: Vec<Vec<i64>> = chunk.iter().map(|r| r.0.to_vec()).collect();
        let seeds: Vec<u64> = chunk.iter().map(|r| r.1).collect();
        let first = out.len();
        let gens = tch::no_grad(|| model::generate(model, Some(tok), &prompts, &seeds, &p))
            .with_context(|| format!("sampling {} .. {}", name(first), name(first + chunk.len() - 1)))?;
        generated += gens.iter().map(|g| g.tokens.len() as i64).sum::<i64>();
        out.extend(gens);
        let rate = generated as f64 / t0.elapsed().as_secs_f64().max(1e-9);
        progress.set(out.len() as u64, &format!("{label} {rate:.0} tok/s"));
    }
    progress.finish();
    ctx.count("tokens_generated", generated);
    ctx.count("rows_max_new_tokens_clamped", clamped);
    ctx.metric("decode_tok_s", generated as f64 / t0.elapsed().as_secs_f64().max(1e-9));
    Ok(out)
}

/// The first `limit` prompts (0 = all) of window `batch_index`, wrapping around the set (one
/// window per training step).
pub fn window(prompts: Vec<PromptRow>, limit: usize, batch_index: usize) -> Vec<PromptRow> {
    if limit == 0 || prompts.is_empty() {
        return prompts;
    }
    let start = (batch_index * limit) % prompts.len();
    prompts.iter().cycle().skip(start).take(limit.min(prompts.len())).cloned().collect()
}
