//! `rollout`: G sampled completions per prompt from a policy checkpoint (`rollouts` artifact),
//! each with its per-token logprobs and entropies, the extracted answer and the outcome reward of
//! the math verifier (1 if it matches the reference answer, else 0) on the answer after the chain
//! of thought, and `cot_end`, where that chain of thought ends ([`split_answer`]; param
//! `thinking`). A completion whose thinking never closed has no answer (reward 0) and no
//! `cot_end`; counted as `thinking_unclosed`.
//!
//! Row (prompt p, sample i) is sampled with its own seed, derived from (`seed`, p's id, i), so a
//! rollout does not depend on which other prompts are in the run. Batches hold `batch_size`
//! rows in prompt order; the result is deterministic for the same inputs, params and threads.
//! With `group_requests = true` sample i's seed is instead the seed of sample 0 plus i (vLLM's
//! seeds for the n choices of one request), so an engine gets one request per prompt.
//!
//! `backend = "http"` samples through an inference engine ([`crate::sampling::http`]); its token
//! ids and chosen-token logprobs are kept as it returned them. Entropies (param `entropies`):
//! `prefill` = exact, from one prefill of each finished completion in the model core after the
//! engine stopped (also records how far the engine's logprobs are from the model core's,
//! `engine_logprob_gap_max`); `topk` = estimated from the engine's top `top_logprobs` logprobs
//! (a lower bound; metric `entropies = "topk-estimate"`); `none` = NaN per token (entropy and
//! hybrid segmentation refuse such rollouts). The built-in backend always records exact ones.

use anyhow::{bail, Context, Result};
use rredcot::artifact::rows::{PromptRow, RolloutRow};
use rredcot::artifact::{read_rows, write_rows, Schema};
use rredcot::engine::{Builtin, Executable, StageContext};

use crate::model::FinishReason;
use crate::sampling::{engine_entropies, plan_jobs, sample_jobs, split_answer, window, EngineLogprobs, OnBadPrompt, SamplerParams};
use super::{load_sampler, model_core, use_threads};

pub use crate::sampling::row_seed;

/// The stage's own params beside [`SamplerParams`] and [`EngineLogprobs`] (stages/rollout.toml
/// documents them).
#[derive(Debug, serde::Deserialize)]
struct RolloutParams {
    group_size: usize,
    /// Prompts per step (0 = all) and which window of them ([`window`]).
    limit: usize,
    batch_index: usize,
    on_bad_prompt: OnBadPrompt,
    group_requests: bool,
}

// Version 12 (no thinking): the answer starts at the sentence holding it, not its line; an answer
// that starts the completion has cot_end 0, an empty chain of thought, not null (never ended).
pub const STAGE: Builtin = Builtin { name: "rollout", version: "12", runs_in: Executable::Worker, run };

pub fn run(ctx: &mut StageContext) -> Result<()> {
    let (sampling, logprobs): (SamplerParams, EngineLogprobs) = (ctx.params()?, ctx.params()?);
    let p: RolloutParams = ctx.params()?;
    use_threads(sampling.threads);
    let group = p.group_size;
    if group == 0 {
        bail!("stage `{}`: group_size must be positive", ctx.instance);
    }
    let prompts_path = ctx.input("prompts")?.to_path_buf();
    let prompts: Vec<PromptRow> = window(read_rows(&prompts_path, Schema::Prompts)?, p.limit, p.batch_index);
    let policy_hash = ctx.input_hash("policy")?.to_string();
    let (sampler, tok) = load_sampler(ctx, "policy", &sampling, Some(&logprobs))?;
    let context = sampler.context();

    let jobs = plan_jobs(ctx, &prompts, &prompts_path, &tok, context, group, p.on_bad_prompt)?;
    let mut gens = sample_jobs(ctx, &sampler, &tok, &jobs, &sampling, "rollouts", p.group_requests)?;
    let prompts_ids: Vec<&[i64]> = jobs.iter().map(|j| j.ids.as_slice()).collect();
    engine_entropies(ctx, sampler, model_core("policy", &sampling), &prompts_ids, &mut gens, &sampling, logprobs, |i| format!("prompt {} sample {}", jobs[i].row.id, jobs[i].sample_idx))?;
    let thinking = sampling.thinking;
    let mut cut_unanswered = 0i64;
    let rows: Vec<RolloutRow> = jobs
        .iter()
        .zip(gens)
        .map(|(job, g)| -> Result<RolloutRow> {
            let text = g.text.clone().unwrap_or_default();
            let cut = g.finish_reason == FinishReason::Length;
            let a = split_answer(&tok, thinking, job.gold, &g.tokens, &text, cut).with_context(|| format!("prompt {} sample {}", job.row.id, job.sample_idx))?;
            cut_unanswered += a.cut_unanswered as i64;
            let verdict = a.verdict;
            Ok(RolloutRow {
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
                cot_end: a.cot_end.map(|c| c as i32),
            })
        })
        .collect::<Result<_>>()?;
    let generated: usize = rows.iter().map(|r| r.completion_ids.len()).sum();
    ctx.count("rollouts", rows.len() as i64);
    ctx.count("thinking_unclosed", rows.iter().filter(|r| r.cot_end.is_none()).count() as i64);
    ctx.count("no_chain_of_thought", rows.iter().filter(|r| r.cot_end == Some(0)).count() as i64);
    ctx.count("cut_unanswered", cut_unanswered);
    ctx.metric("mean_reward", rows.iter().map(|r| r.reward).sum::<f64>() / rows.len().max(1) as f64);
    ctx.metric("mean_completion_tokens", generated as f64 / rows.len().max(1) as f64);
    write_rows(ctx.output("rollouts")?, Schema::Rollouts, &rows)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_params_struct_reads_every_param_of_the_stage_file() {
        use super::super::tests::{assert_reads_every_param, sampling_stage_and, shipped_params};
        let read = sampling_stage_and::<super::EngineLogprobs, super::RolloutParams>;
        let (logprobs, p) = assert_reads_every_param("rollout", read);
        assert_eq!((logprobs.entropies, p.group_size), (crate::sampling::Entropies::Prefill, 4));
        let mut typo = shipped_params("rollout");
        typo.insert("temperature".into(), "hot".into());
        let e = read("grpo.rollout[0]", &typo).unwrap_err().to_string();
        assert!(e.contains("stage `grpo.rollout[0]`: param `temperature` = \"hot\""), "{e}");
    }
}
