//! `reset`: credit assignment with resets (seed 004). A trace x, u_1..u_T is reset to the state
//! before step t — the prompt followed by u_1..u_{t−1} — and the policy samples `k` fresh
//! continuations from there. The continuations form a group of their own, so their group-normalized
//! outcome advantages credit the decisions made from step t on: outcome differences are
//! attributed to that point rather than spread over the whole trace.
//!
//! - `mode = "random"` (RRPO): t uniform over 1..T, seeded per trace.
//! - `mode = "self"` (SRPO): the policy itself localizes the first wrong step of the trace. It is
//!   shown `localize_prompt` (the problem and the numbered steps) and t is the step number whose
//!   answer `localize_answer` it finds most likely (scored in prefill over t = 1..T, so the choice
//!   is always a valid step and deterministic; a tiny model's free-form answer would often not be).
//!
//! `traces = "incorrect"` resets only traces with reward 0 (SRPO's setting), `"all"` every trace.
//! A reset group's prompt row copies the original with id `<prompt id>#<sample>@<t>` and carries
//! the prefix ids in its `meta` (`reset_prefix_ids`), which [`crate::traces::encode_prompt`] appends, so
//! `update`, the scorers and a later `rollout` all see prompt + prefix as the context and the
//! continuation as the completion. Outputs: `prompts` and `rollouts` (the originals, then the reset
//! groups; `include_original = false` keeps only the resets) and a `resets` table. Resets fall
//! inside the chain of thought (segments cover only it); a continuation is judged like a rollout,
//! on the answer after its end of thinking (param `thinking`), and its `cot_end` is counted from
//! the continuation's first token.

use std::collections::HashSet;

use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rredcot::artifact::rows::{PromptRow, RolloutRow};
use rredcot::artifact::{write_rows, write_table, Schema};
use rredcot::credit::thinking::continuation_cot_end;
use rredcot::engine::{Builtin, Executable, StageContext};
use rredcot::prompt_text::prompt_text;
use serde::Serialize;

use crate::sampling::{engine_entropies, row_seed, sample_seeded, split_answer, EngineLogprobs, Sampler, SamplerParams};
use crate::traces::{Trace, TraceInputs, TraceTokens};
use super::{load_policy_on, load_sampler, model_core, use_threads};
use crate::traces::RESET_PREFIX_KEY;
use crate::model::{logprob, ChatMessage, DecoderLm, FinishReason, Tokenizer};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Random,
    #[serde(rename = "self")]
    Own,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum Which {
    All,
    Incorrect,
}

/// The own params of both reset kinds beside [`SamplerParams`] and [`EngineLogprobs`]
/// (stages/reset_random.toml documents them; reset_self.toml extends it).
#[derive(Debug, serde::Deserialize)]
struct ResetParams {
    mode: Mode,
    traces: Which,
    /// Continuations per reset point.
    k: usize,
    include_original: bool,
    /// SRPO's localization prompt (`{question}`, `{steps}`) and answer (`{t}`).
    localize_prompt: String,
    localize_answer: String,
}

/// One row of the `resets` table.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct ResetRow {
    pub prompt_id: String,
    pub sample_idx: i32,
    /// The reset group's prompt id.
    pub reset_id: String,
    pub mode: String,
    /// Step t (1-based): the continuations replace u_t..u_T.
    pub reset_step: i32,
    pub steps: i32,
    pub prefix_tokens: i32,
    pub original_reward: f64,
    pub continuation_mean_reward: f64,
}

/// The step SRPO resets to: argmax over t = 1..T of log p(`answer`(t) | `prompt`(question, steps)),
/// and the token positions that cost.
fn localize(model: &DecoderLm, tok: &Tokenizer, trace: &Trace, tt: &TraceTokens, prompt: &str, answer: &str, batch: usize) -> Result<(usize, usize)> {
    let mut steps = String::new();
    for (i, &(s, e)) in tt.bounds.iter().enumerate() {
        steps.push_str(&format!("Step {}: {}\n", i + 1, tok.decode(&tt.completion[s..e], true)?.trim()));
    }
    let ask = prompt.replace("{question}", &prompt_text(&trace.prompt.prompt)).replace("{steps}", steps.trim_end());
    let context = tok.encode_chat(&[ChatMessage::new("user", &ask)], true)?;
    let pairs: Vec<(Vec<i64>, Vec<i64>)> =
        (1..=tt.bounds.len()).map(|t| Ok((context.clone(), tok.encode(&answer.replace("{t}", &t.to_string()))?))).collect::<Result<_>>()?;
    let lps = logprob(model, &pairs, batch)?;
    let score = |lp: &Vec<f32>| lp.iter().map(|&x| x as f64).sum::<f64>();
    // Ties go to the earliest step: the first error is what SRPO asks for.
    let best = lps.iter().enumerate().fold((0, f64::NEG_INFINITY), |b, (i, lp)| if score(lp) > b.1 { (i, score(lp)) } else { b });
    Ok((best.0 + 1, pairs.iter().map(|(p, c)| p.len() + c.len()).sum()))
}

/// A chosen reset: trace index, step t and the prefix (completion tokens before step t).
struct Reset {
    trace: usize,
    step: usize,
    steps: usize,
    prefix: Vec<i64>,
    prefix_text: String,
    context: Vec<i64>,
    row: PromptRow,
}

// Version 13: a continuation whose chain of thought ended inside its prefix (or that answered on
// its first line) has cot_end 0, an empty chain of thought, not null (never ended).
pub const STAGE: Builtin = Builtin { name: "reset", version: "13", runs_in: Executable::Worker, run };

pub fn run(ctx: &mut StageContext) -> Result<()> {
    let (sampling, logprobs): (SamplerParams, EngineLogprobs) = (ctx.params()?, ctx.params()?);
    let p: ResetParams = ctx.params()?;
    use_threads(sampling.threads);
    let (mode, which, k, include_original) = (p.mode, p.traces, p.k, p.include_original);
    let (seed, batch, thinking) = (sampling.seed, sampling.batch_size, sampling.thinking);
    let (loc_prompt, loc_answer) = (&p.localize_prompt, &p.localize_answer);
    if k == 0 {
        bail!("stage `{}`: k must be positive", ctx.instance);
    }
    if mode == Mode::Own && !(loc_prompt.contains("{steps}") && loc_answer.contains("{t}")) {
        bail!("stage `{}`: localize_prompt must contain {{steps}} and localize_answer {{t}}", ctx.instance);
    }
    let inputs = TraceInputs::read(ctx)?;
    let traces = inputs.traces()?;
    let policy_hash = ctx.input_hash("policy")?.to_string();
    if let Some(tr) = traces.iter().find(|t| t.rollout.policy_ckpt != policy_hash) {
        bail!("{}: sampled from checkpoint {} but the policy input is {}: resets continue the policy's own traces", tr.at, &tr.rollout.policy_ckpt[..12.min(tr.rollout.policy_ckpt.len())], &policy_hash[..12]);
    }
    let (sampler, tok) = load_sampler(ctx, "policy", &sampling, Some(&logprobs))?;
    // Localizing the first wrong step is a prefill in the model core, whatever samples.
    let own_model = match (&sampler, mode) {
        (Sampler::Http { .. }, Mode::Own) => Some(load_policy_on(ctx, "policy", sampling.device, sampling.dtype)?.0),
        _ => None,
    };

    let t0 = std::time::Instant::now();
    let mut localize_tokens = 0usize;
    let mut resets = Vec::new();
    let mut progress = ctx.progress(traces.len() as u64, "reset points");
    for (i, tr) in traces.iter().enumerate() {
        progress.set(i as u64 + 1, "reset points");
        if which == Which::Incorrect && tr.rollout.reward > 0.0 {
            continue;
        }
        tr.answer()?;
        let tt = tr.tokens(&tok)?;
        let steps = tt.bounds.len();
        let step = match mode {
            Mode::Random => ChaCha8Rng::seed_from_u64(row_seed(seed, &tr.seg.prompt_id, tr.seg.sample_idx as usize)).random_range(1..=steps),
            Mode::Own => {
                let model = own_model.as_ref().or(sampler.local()).context("a model for localization")?;
                let (t, cost) = localize(model, &tok, tr, &tt, loc_prompt, loc_answer, batch)?;
                localize_tokens += cost;
                t
            }
        };
        let upto = tt.bounds[step - 1].0;
        let prefix = tt.completion[..upto].to_vec();
        let id = format!("{}#{}@{step}", tr.seg.prompt_id, tr.seg.sample_idx);
        let mut meta = match serde_json::from_str::<serde_json::Value>(&tr.prompt.meta) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => Default::default(),
        };
        meta.insert("reset_of".into(), tr.seg.prompt_id.clone().into());
        meta.insert("reset_sample".into(), tr.seg.sample_idx.into());
        meta.insert("reset_step".into(), step.into());
        meta.insert("reset_mode".into(), serde_json::to_value(mode)?);
        meta.insert(RESET_PREFIX_KEY.into(), prefix.clone().into());
        let row = PromptRow { id, meta: serde_json::Value::Object(meta).to_string(), ..tr.prompt.clone() };
        resets.push(Reset { trace: i, step, steps, prefix_text: tok.decode(&prefix, true)?, context: tt.prefix(upto), prefix, row });
    }
    progress.finish();

    let rows: Vec<(&[i64], u64)> =
        resets.iter().flat_map(|r| (0..k).map(move |j| (r.context.as_slice(), row_seed(seed, &r.row.id, j)))).collect();
    let name = |i: usize| format!("reset {} continuation {}", resets[i / k].row.id, i % k);
    let (mut gens, prefilled) = sample_seeded(ctx, &sampler, &tok, &rows, &sampling, "continuations", name)?;
    let prompts: Vec<&[i64]> = rows.iter().map(|r| r.0).collect();
    engine_entropies(ctx, sampler, model_core("policy", &sampling), &prompts, &mut gens, &sampling, logprobs, name)?;

    let seconds = t0.elapsed().as_secs_f64();
    let localize_sequences: usize = if mode == Mode::Own { resets.iter().map(|r| r.steps).sum() } else { 0 };
    // A reset's k continuations share its context's prefill: positions run, not k contexts.
    let continuation_tokens = prefilled as usize + gens.iter().map(|g| g.tokens.len()).sum::<usize>();
    let mut out_prompts: Vec<PromptRow> = Vec::new();
    let mut out_rollouts: Vec<RolloutRow> = Vec::new();
    if include_original {
        // Each prompt the traces use, once, in first-use order.
        let mut seen = HashSet::new();
        for t in &traces {
            if seen.insert(t.prompt.id.as_str()) {
                out_prompts.push(t.prompt.clone());
            }
            out_rollouts.push(t.rollout.clone());
        }
    }
    let mut table = Vec::with_capacity(resets.len());
    let mut gens = gens.into_iter();
    let (mut mixed, mut cont_reward) = (0i64, 0.0);
    for r in &resets {
        let tr = &traces[r.trace];
        let gold = tr.answer()?;
        let mut rewards = Vec::with_capacity(k);
        for j in 0..k {
            let g = gens.next().expect("one generation per continuation");
            let text = g.text.clone().unwrap_or_default();
            let ids: Vec<i64> = r.prefix.iter().chain(&g.tokens).copied().collect();
            let a = split_answer(&tok, thinking, gold, &ids, &format!("{}{text}", r.prefix_text), g.finish_reason == FinishReason::Length)
                .with_context(|| format!("reset {} continuation {j}", r.row.id))?;
            let verdict = a.verdict;
            let cot_end = continuation_cot_end(a.cot_end, r.prefix.len());
            let reward = if verdict.correct { 1.0 } else { 0.0 };
            rewards.push(reward);
            out_rollouts.push(RolloutRow {
                prompt_id: r.row.id.clone(),
                sample_idx: j as i32,
                completion_ids: g.tokens.iter().map(|&t| t as i32).collect(),
                text,
                logprobs: g.logprobs,
                entropies: g.entropies,
                answer_extracted: verdict.extracted,
                reward,
                finish_reason: g.finish_reason.as_str().to_string(),
                policy_ckpt: policy_hash.clone(),
                cot_end: cot_end.map(|c| c as i32),
            });
        }
        let mean = rewards.iter().sum::<f64>() / k as f64;
        mixed += (mean > 0.0 && mean < 1.0) as i64;
        cont_reward += mean;
        table.push(ResetRow {
            prompt_id: tr.seg.prompt_id.clone(),
            sample_idx: tr.seg.sample_idx,
            reset_id: r.row.id.clone(),
            mode: serde_json::to_value(mode)?.as_str().unwrap_or_default().to_string(),
            reset_step: r.step as i32,
            steps: r.steps as i32,
            prefix_tokens: r.prefix.len() as i32,
            original_reward: tr.rollout.reward,
            continuation_mean_reward: mean,
        });
        out_prompts.push(r.row.clone());
    }
    ctx.count("traces", traces.len() as i64);
    ctx.count("resets", resets.len() as i64);
    ctx.count("continuations", (resets.len() * k) as i64);
    ctx.count("forward_sequences", (localize_sequences + rows.len()) as i64);
    ctx.count("forward_tokens", (localize_tokens + continuation_tokens) as i64);
    // Localization + sampling, per trace read (model load and process start excluded).
    ctx.metric("scoring_s_per_trace", seconds / traces.len().max(1) as f64);
    // Groups with both outcomes: the only ones whose advantages are not all 0.
    ctx.count("reset_groups_mixed", mixed);
    ctx.metric("continuation_mean_reward", cont_reward / resets.len().max(1) as f64);
    ctx.metric("mean_reset_fraction", resets.iter().map(|r| (r.step - 1) as f64 / r.steps as f64).sum::<f64>() / resets.len().max(1) as f64);
    if out_rollouts.is_empty() {
        bail!("stage `{}`: no trace to reset ({} traces, traces = {which:?}) and include_original = false: nothing to write", ctx.instance, traces.len());
    }
    write_rows(ctx.output("prompts")?, Schema::Prompts, &out_prompts)?;
    write_rows(ctx.output("rollouts")?, Schema::Rollouts, &out_rollouts)?;
    write_table(ctx.output("resets")?, &table)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_params_struct_reads_every_param_of_both_stage_files() {
        use super::super::tests::{assert_reads_every_param, sampling_stage_and};
        let read = sampling_stage_and::<super::EngineLogprobs, super::ResetParams>;
        let (_, random) = assert_reads_every_param("reset_random", read);
        let (_, own) = assert_reads_every_param("reset_self", read);
        assert_eq!((random.mode, own.mode), (super::Mode::Random, super::Mode::Own));
    }
}
