//! Builtin stages that need the model core. Their names and code versions are in the engine's
//! catalog (`rredcot::stages::CATALOG`, `runs_in: Worker`) so the engine binary can key them
//! without linking libtorch.

pub mod bootstrap_sft;
pub mod eval;
pub mod judge_local;
pub mod reset;
pub mod rollout;
pub mod score_grad;
pub mod score_loo;
pub mod score_mc;
pub mod score_progress;
pub mod score_sigma;
pub mod update;

use anyhow::{Context, Result};
use crate::sampling::{http, Sampler, SamplerParams};
use rredcot::engine::{BuiltinFn, Runtime, StageContext};
use rredcot::stages::{light_builtin, CATALOG};

use crate::model::{self, DecoderLm, LoadOptions, Tokenizer};

/// Builtins of the ML worker (light ones included).
pub fn full_builtin(name: &str) -> Option<BuiltinFn> {
    Some(match name {
        "bootstrap_sft" => bootstrap_sft::run,
        "rollout" => rollout::run,
        "eval" => eval::run,
        "score_sigma" => score_sigma::run,
        "score_mc" => score_mc::run,
        "score_loo" => score_loo::run,
        "score_grad" => score_grad::run,
        "score_progress" => score_progress::run,
        "reset" => reset::run,
        "update" => update::run,
        "judge_local" => judge_local::run,
        _ => return light_builtin(name),
    })
}

pub const FULL_RUNTIME: Runtime = Runtime { catalog: &CATALOG, resolve: full_builtin, worker: rredcot::stages::WORKER, versions: rredcot::versions };

/// Intra-op threads of this process (0: libtorch's default).
fn use_threads(threads: i64) {
    if threads > 0 {
        tch::set_num_threads(threads as i32);
    }
}

/// The checkpoint wired to input `name` on `device`, in float32 whatever the stage's `dtype` (a
/// training stage keeps float32 master weights; its `dtype` sets the compute precision,
/// [`crate::train::step`]).
fn load_policy_f32(ctx: &StageContext, name: &str, device: model::DeviceChoice) -> Result<(DecoderLm, Tokenizer)> {
    load_policy_on(ctx, name, device, model::DtypeChoice::F32)
}

/// The checkpoint wired to input `name` on `device` in `dtype` (a stage's own params).
fn load_policy_on(
    ctx: &StageContext,
    name: &str,
    device: model::DeviceChoice,
    dtype: model::DtypeChoice,
) -> Result<(DecoderLm, Tokenizer)> {
    let path = ctx.input(name)?;
    let loaded = model::load(path, &LoadOptions { device, dtype }).with_context(|| format!("loading input `{name}` ({})", path.display()))?;
    let tok = loaded
        .tokenizer
        .with_context(|| format!("input `{name}` ({}): no tokenizer.json in the checkpoint", path.display()))?;
    Ok((loaded.model, tok))
}

/// The sampler of a sampling stage (param `backend`) over the checkpoint wired to input `name`,
/// with the checkpoint's tokenizer: the model core on the stage's device in its dtype, or an
/// inference engine ([`crate::sampling::http`]; only the config and tokenizer are read here) that returns
/// `top_logprobs` logprobs per token.
fn load_sampler(ctx: &StageContext, name: &str, p: &SamplerParams, top_logprobs: usize) -> Result<(Sampler, Tokenizer)> {
    let engine_params: http::HttpParams = ctx.params()?;
    match p.backend {
        http::Backend::Local => load_policy_on(ctx, name, p.device, p.dtype).map(|(m, t)| (Sampler::Local(m), t)),
        http::Backend::Http => {
            let path = ctx.input(name)?;
            let (cfg, tok) = model::load_config(path).with_context(|| format!("input `{name}` ({}): the http backend needs a checkpoint directory", path.display()))?;
            let tok = tok.with_context(|| format!("input `{name}` ({}): no tokenizer.json in the checkpoint", path.display()))?;
            let engine = http::HttpSampler::open(ctx, name, &engine_params, p.seed)?;
            Ok((Sampler::Http { engine, context: cfg.max_position_embeddings as usize, vocab: cfg.vocab_size, top_logprobs }, tok))
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    pub(crate) use rredcot::stages::shipped_defaults as shipped_params;
    use rredcot::engine::context::parse_params;

    type Params = serde_json::Map<String, serde_json::Value>;

    /// What a sampling stage reads: the shared [`SamplerParams`](super::SamplerParams),
    /// the http backend's and its own struct `P`, each from the same params.
    pub(crate) fn sampling_stage<P: serde::de::DeserializeOwned>(kind: &str, params: &Params) -> anyhow::Result<P> {
        parse_params::<super::SamplerParams>(kind, params)?;
        parse_params::<super::http::HttpParams>(kind, params)?;
        parse_params(kind, params)
    }

    /// [`sampling_stage`] for a stage that also reads a second shared struct `E` (e.g.
    /// [`EngineLogprobs`](crate::sampling::EngineLogprobs)); returns both.
    pub(crate) fn sampling_stage_and<E: serde::de::DeserializeOwned, P: serde::de::DeserializeOwned>(kind: &str, params: &Params) -> anyhow::Result<(E, P)> {
        Ok((parse_params(kind, params)?, sampling_stage(kind, params)?))
    }

    /// `parse` (a stage's params structs) reads the stage file's defaults of kind `kind`, and
    /// every param they declare: without one of them it fails for that missing field. (What
    /// serde's `deny_unknown_fields` checks, for stages that read more than one struct.)
    pub(crate) fn assert_reads_every_param<T>(kind: &str, parse: impl Fn(&str, &Params) -> anyhow::Result<T>) -> T {
        let shipped = shipped_params(kind);
        for name in shipped.keys() {
            let mut without = shipped.clone();
            without.remove(name);
            match parse(kind, &without) {
                Ok(_) => panic!("{kind}: the stage file declares param `{name}`, but no params struct of the stage reads it"),
                Err(e) => assert!(e.to_string().contains(&format!("missing field `{name}`")), "{kind} without `{name}`: {e}"),
            }
        }
        parse(kind, &shipped).unwrap_or_else(|e| panic!("{kind}: {e}"))
    }
}
