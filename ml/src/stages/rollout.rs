//! `rollout`: G sampled completions per prompt from a policy checkpoint (`rollouts` artifact),
//! each with its per-token logprobs and entropies, the extracted answer and the outcome reward of
//! the math verifier (1 if it matches the reference answer, else 0).
//!
//! Row (prompt p, sample i) is sampled with its own seed, derived from (`seed`, p's id, i), so a
//! rollout does not depend on which other prompts are in the run. Batches hold `batch_size`
//! rows in prompt order; the result is deterministic for the same inputs, params and threads.

use anyhow::{bail, Context, Result};
use rredcot::artifact::rows::{PromptRow, RolloutRow};
use rredcot::artifact::{read_rows, write_rows, Schema};
use rredcot::engine::hash::sha256_hex;
use rredcot::engine::StageContext;
use std::time::Instant;

use super::{encode_prompt, load_policy, set_threads};
use crate::model::{self, SamplingParams};

/// What to do with a prompt that cannot be rolled out (no reference answer, too long).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum OnBadPrompt {
    Error,
    Skip,
}

/// The sampling seed of one row.
pub fn row_seed(seed: u64, prompt_id: &str, sample_idx: usize) -> u64 {
    let h = sha256_hex(format!("{seed}\u{0}{prompt_id}\u{0}{sample_idx}").as_bytes());
    u64::from_str_radix(&h[..16], 16).expect("hex")
}

struct Job<'a> {
    row: &'a PromptRow,
    gold: &'a str,
    ids: Vec<i64>,
    sample_idx: usize,
}

pub fn run(ctx: &mut StageContext) -> Result<()> {
    set_threads(ctx)?;
    let seed: u64 = ctx.param("seed")?;
    let group: usize = ctx.param("group_size")?;
    let batch_size: usize = ctx.param("batch_size")?;
    let limit: usize = ctx.param("limit")?;
    let on_bad: OnBadPrompt = ctx.param("on_bad_prompt")?;
    let sampling = SamplingParams {
        temperature: ctx.param("temperature")?,
        top_p: ctx.param("top_p")?,
        top_k: ctx.param("top_k")?,
        max_new_tokens: ctx.param("max_new_tokens")?,
        stop_strings: ctx.param("stop_strings")?,
        stop_token_ids: vec![],
    };
    if group == 0 || batch_size == 0 {
        bail!("stage `{}`: group_size and batch_size must be positive", ctx.instance);
    }
    let prompts_path = ctx.input("prompts")?.to_path_buf();
    let mut prompts: Vec<PromptRow> = read_rows(&prompts_path, Schema::Prompts)?;
    let batch_index: usize = ctx.param("batch_index")?;
    if limit > 0 && !prompts.is_empty() {
        // Window `batch_index` of `limit` prompts, wrapping around (one window per training step).
        let start = (batch_index * limit) % prompts.len();
        prompts = prompts.iter().cycle().skip(start).take(limit.min(prompts.len())).cloned().collect();
    }
    let policy_hash = ctx.input_hash("policy")?.to_string();
    let (model, tok) = load_policy(ctx, "policy")?;
    let context = model.cfg.max_position_embeddings as usize;

    let mut jobs = Vec::with_capacity(prompts.len() * group);
    let (mut no_answer, mut too_long) = (0i64, 0i64);
    for (i, row) in prompts.iter().enumerate() {
        let at = || format!("{} row {i} (prompt {})", prompts_path.display(), row.id);
        let Some(gold) = row.answer.as_deref().filter(|a| !a.trim().is_empty()) else {
            match on_bad {
                OnBadPrompt::Error => bail!("{}: no reference answer, so no reward (set on_bad_prompt = \"skip\" to drop such prompts)", at()),
                OnBadPrompt::Skip => {
                    no_answer += 1;
                    continue;
                }
            }
        };
        let ids = encode_prompt(&tok, row).with_context(at)?;
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

    let mut rows = Vec::with_capacity(jobs.len());
    let mut generated = 0i64;
    let mut clamped = 0i64;
    let t0 = Instant::now();
    let mut progress = ctx.progress(jobs.len() as u64, "rollouts");
    for chunk in jobs.chunks(batch_size) {
        let longest = chunk.iter().map(|j| j.ids.len()).max().unwrap_or(0);
        // Never sample past the context window: shorten this batch's budget and count it.
        let mut p = sampling.clone();
        if longest + p.max_new_tokens > context {
            p.max_new_tokens = context - longest;
            clamped += chunk.len() as i64;
        }
        let prompts: Vec<Vec<i64>> = chunk.iter().map(|j| j.ids.clone()).collect();
        let seeds: Vec<u64> = chunk.iter().map(|j| row_seed(seed, &j.row.id, j.sample_idx)).collect();
        let gens = tch::no_grad(|| model::generate(&model, Some(&tok), &prompts, &seeds, &p))
            .with_context(|| format!("sampling prompts {} .. {}", chunk[0].row.id, chunk[chunk.len() - 1].row.id))?;
        for (job, g) in chunk.iter().zip(gens) {
            generated += g.tokens.len() as i64;
            let text = g.text.clone().unwrap_or_default();
            let verdict = rredcot::math::verify_response(job.gold, &text);
            rows.push(RolloutRow {
                prompt_id: job.row.id.clone(),
                sample_idx: job.sample_idx as i32,
                completion_ids: g.tokens.iter().map(|&t| t as i32).collect(),
                text,
                logprobs: g.logprobs,
                entropies: g.entropies,
                answer_extracted: verdict.extracted,
                reward: if verdict.correct { 1.0 } else { 0.0 },
                finish_reason: g.finish_reason.as_str().to_string(),
                policy_ckpt: policy_hash.clone(),
            });
        }
        let rate = generated as f64 / t0.elapsed().as_secs_f64().max(1e-9);
        progress.set(rows.len() as u64, &format!("rollouts {rate:.0} tok/s"));
    }
    progress.finish();
    let secs = t0.elapsed().as_secs_f64();
    ctx.count("tokens_generated", generated);
    ctx.count("rollouts", rows.len() as i64);
    ctx.count("rows_max_new_tokens_clamped", clamped);
    ctx.metric("decode_tok_s", generated as f64 / secs.max(1e-9));
    ctx.metric("mean_reward", rows.iter().map(|r| r.reward).sum::<f64>() / rows.len().max(1) as f64);
    ctx.metric("mean_completion_tokens", generated as f64 / rows.len().max(1) as f64);
    write_rows(ctx.output("rollouts")?, Schema::Rollouts, &rows)?;
    Ok(())
}
