//! `judge_local`: the `judge` ensemble (same templates, votes, majority and outputs; see
//! `rredcot::stages::judge`) with the judge model run by the local model core: input `judge` is a
//! checkpoint with its tokenizer, each vote's messages go through its chat template, and votes are
//! generated in batches with their own seeds (deterministic for the same inputs, params, threads).
//!
//! A judge prompt that does not fit the judge model's context gets an empty reply (an invalid
//! vote), counted in `prompts_too_long`.

use anyhow::{Context, Result};
use rredcot::engine::{Builtin, Executable, StageContext};
use rredcot::stages::judge::{finish, prepare};

use super::{load_policy_on, use_threads};
use crate::model::{self, ChatMessage, DeviceChoice, DtypeChoice, SamplingParams};
use rredcot::judge::PlanOptions;

/// The stage's params (stages/judge_local.toml documents them); unknown or mistyped ones are
/// errors naming the stage and the param.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct JudgeLocalParams {
    templates: Vec<String>,
    samples: usize,
    seed: u64,
    temperature: f64,
    top_p: f64,
    max_tokens: usize,
    system: String,
    max_response_chars: usize,
    batch_size: usize,
    device: DeviceChoice,
    dtype: DtypeChoice,
    threads: i64,
}

pub const STAGE: Builtin = Builtin { name: "judge_local", version: "2", runs_in: Executable::Worker, run };

pub fn run(ctx: &mut StageContext) -> Result<()> {
    let p: JudgeLocalParams = ctx.params()?;
    use_threads(p.threads);
    let opts = PlanOptions { samples: p.samples, seed: p.seed, system: p.system.clone(), max_response_chars: p.max_response_chars };
    let prepared = prepare(ctx, &p.templates, opts)?;
    let batch_size = p.batch_size.max(1);
    let sampling = SamplingParams {
        temperature: p.temperature,
        top_p: p.top_p,
        top_k: 0,
        max_new_tokens: p.max_tokens,
        stop_strings: vec![],
        stop_token_ids: vec![],
    };
    let (model, tok) = load_policy_on(ctx, "judge", p.device, p.dtype)?;
    let context = model.cfg.max_position_embeddings as usize;

    // Encode every vote's conversation; those that cannot fit keep an empty reply.
    let mut replies = vec![String::new(); prepared.votes.len()];
    let mut todo: Vec<(usize, Vec<i64>)> = Vec::with_capacity(prepared.votes.len());
    let mut too_long = 0;
    for (i, v) in prepared.votes.iter().enumerate() {
        let chat: Vec<ChatMessage> = v.messages.iter().map(|m| ChatMessage::new(&m.role, &m.content)).collect();
        let ids = tok.encode_chat(&chat, true).with_context(|| format!("encoding judge prompt {i}"))?;
        if ids.len() >= context {
            too_long += 1;
        } else {
            todo.push((i, ids));
        }
    }
    ctx.count("prompts_too_long", too_long);

    let mut generated = 0i64;
    let mut progress = ctx.progress(todo.len() as u64, "judge votes");
    for (n, chunk) in todo.chunks(batch_size).enumerate() {
        let longest = chunk.iter().map(|(_, ids)| ids.len()).max().unwrap_or(0);
        let mut p = sampling.clone();
        p.max_new_tokens = p.max_new_tokens.min(context - longest);
        let prompts: Vec<Vec<i64>> = chunk.iter().map(|(_, ids)| ids.clone()).collect();
        let seeds: Vec<u64> = chunk.iter().map(|(i, _)| prepared.votes[*i].seed).collect();
        let gens = tch::no_grad(|| model::generate(&model, Some(&tok), &prompts, &seeds, &p))
            .with_context(|| format!("generating judge batch {n}"))?;
        for ((i, _), g) in chunk.iter().zip(gens) {
            generated += g.tokens.len() as i64;
            replies[*i] = g.text.unwrap_or_default();
        }
        progress.inc(chunk.len() as u64);
    }
    progress.finish();
    ctx.count("tokens_generated", generated);
    finish(ctx, prepared, &replies)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_shipped_params_are_what_the_stage_reads() {
        let shipped = super::super::tests::shipped_params("judge_local");
        let p: super::JudgeLocalParams = rredcot::engine::context::parse_params("judge_local", &shipped).unwrap();
        assert_eq!((p.samples, p.batch_size), (8, 16));
    }
}
