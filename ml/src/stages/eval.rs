//! `eval`: avg@k of a policy on one or more benchmarks (input group `benchmarks.<name>`, each a
//! `prompts` artifact): k samples per problem, each checked by the math verifier against the
//! reference answer, on the answer after the chain of thought only (param `thinking`, as in
//! `rollout`: a completion whose thinking never closed has no answer). Writes the `eval` artifact (`correct_judge` empty: a judge stage fills it)
//! and, per benchmark, `avg_at_k.<name>` ± `stderr.<name>` metrics in the run record.

use anyhow::{bail, Context, Result};
use rredcot::artifact::rows::{EvalRow, PromptRow};
use rredcot::artifact::{read_rows, write_rows, Schema};
use rredcot::engine::{Builtin, Executable, StageContext};
use rredcot::evaluation::{summarize, Grader};
use rredcot::prompt_text::prompt_text;

use crate::model::FinishReason;
use crate::sampling::{finish_engine, plan_jobs, sample_jobs, split_answer, window, OnBadPrompt, SamplerParams};
use super::{load_sampler, model_core, use_threads};

/// The stage's own params beside [`SamplerParams`] (stages/eval.toml documents them).
#[derive(Debug, serde::Deserialize)]
struct EvalParams {
    /// Samples per problem.
    k: usize,
    /// The first `limit` problems of each benchmark (0 = all).
    limit: usize,
    on_bad_prompt: OnBadPrompt,
}

// Version 12: an answer on the first line (no thinking) is no longer counted as thinking_unclosed.
pub const STAGE: Builtin = Builtin { name: "eval", version: "12", runs_in: Executable::Worker, run };

pub fn run(ctx: &mut StageContext) -> Result<()> {
    let (sampling, p): (SamplerParams, EvalParams) = (ctx.params()?, ctx.params()?);
    use_threads(sampling.threads);
    let (k, thinking) = (p.k, sampling.thinking);
    if k == 0 {
        bail!("stage `{}`: k (samples per problem) must be positive", ctx.instance);
    }
    let benchmarks: Vec<(String, std::path::PathBuf)> = ctx
        .inputs
        .iter()
        .filter_map(|(name, (_, path))| Some((name.strip_prefix("benchmarks.")?.to_string(), path.clone())))
        .collect();
    if benchmarks.is_empty() {
        bail!("stage `{}`: no benchmark to evaluate (wire inputs `benchmarks.<name> = \"stage.prompts\"`)", ctx.instance);
    }
    let (sampler, tok) = load_sampler(ctx, "policy", &sampling, None)?;
    let context = sampler.context();

    let mut rows = Vec::new();
    let (mut unclosed, mut cut_unanswered, mut no_cot) = (0i64, 0i64, 0i64);
    for (bench, path) in &benchmarks {
        let prompts: Vec<PromptRow> = window(read_rows(path, Schema::Prompts)?, p.limit, 0);
        let jobs = plan_jobs(ctx, &prompts, path, &tok, context, k, p.on_bad_prompt)?;
        let gens = sample_jobs(ctx, &sampler, &tok, &jobs, &sampling, &format!("eval {bench}"), false)?;
        for (job, g) in jobs.iter().zip(gens) {
            let text = g.text.unwrap_or_default();
            let cut = g.finish_reason == FinishReason::Length;
            let a = split_answer(&tok, thinking, job.gold, &g.tokens, &text, cut).with_context(|| format!("{bench}: prompt {} sample {}", job.row.id, job.sample_idx))?;
            unclosed += a.cot_end.is_none() as i64;
            no_cot += (a.cot_end == Some(0)) as i64;
            cut_unanswered += a.cut_unanswered as i64;
            let verdict = a.verdict;
            rows.push(EvalRow {
                prompt_id: job.row.id.clone(),
                benchmark: bench.clone(),
                sample_idx: job.sample_idx as i32,
                question: prompt_text(&job.row.prompt),
                reference: job.row.answer.clone(),
                text,
                answer: verdict.extracted,
                correct_verifier: verdict.correct,
                correct_judge: None,
            });
        }
    }
    finish_engine(ctx, sampler, model_core("policy", &sampling))?;
    for s in summarize(&rows, Grader::Verifier) {
        ctx.metric(&format!("avg_at_k.{}", s.benchmark), s.mean);
        ctx.metric(&format!("stderr.{}", s.benchmark), s.stderr);
        ctx.count(&format!("problems.{}", s.benchmark), s.problems as i64);
        ctx.count(&format!("unparseable.{}", s.benchmark), s.unparseable as i64);
    }
    ctx.metric("k", k as i64);
    ctx.metric("mean_reward", rows.iter().map(|r| r.correct_verifier as u8 as f64).sum::<f64>() / rows.len().max(1) as f64);
    ctx.count("samples", rows.len() as i64);
    ctx.count("cut_unanswered", cut_unanswered);
    ctx.count("thinking_unclosed", unclosed);
    ctx.count("no_chain_of_thought", no_cot);
    write_rows(ctx.output("eval")?, Schema::Eval, &rows)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_params_struct_reads_every_param_of_the_stage_file() {
        use super::super::tests::{assert_reads_every_param, sampling_stage};
        let p: super::EvalParams = assert_reads_every_param("eval", sampling_stage);
        assert!(p.k > 0);
    }
}
