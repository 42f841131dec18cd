//! Builtin stages that need the model core. Their names and code versions are in the engine's
//! catalog (`rredcot::stages::CATALOG`, `runs_in: Worker`) so the engine binary can key them
//! without linking libtorch.

pub mod bootstrap_sft;
pub mod eval;
pub mod http_backend;
pub mod judge_local;
pub mod reset;
pub mod rollout;
pub mod sampling;
pub mod score_grad;
pub mod score_loo;
pub mod score_mc;
pub mod score_progress;
pub mod score_sigma;
pub mod update;

use anyhow::{Context, Result};
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

/// Applies the stage's `threads` param (0 = libtorch's default).
fn set_threads(ctx: &StageContext) -> Result<()> {
    use_threads(ctx.param("threads")?);
    Ok(())
}

/// Intra-op threads of this process (0: libtorch's default).
fn use_threads(threads: i64) {
    if threads > 0 {
        tch::set_num_threads(threads as i32);
    }
}

/// The stage's `device`/`dtype` params.
fn load_options(ctx: &StageContext) -> Result<LoadOptions> {
    serde_json::from_value(serde_json::json!({
        "device": ctx.param::<String>("device")?,
        "dtype": ctx.param::<String>("dtype")?,
    }))
    .with_context(|| format!("stage `{}`: params device/dtype", ctx.instance))
}

/// Loads the checkpoint wired to input `name` with the stage's `device`/`dtype` params; it must
/// carry its tokenizer.
fn load_policy(ctx: &StageContext, name: &str) -> Result<(DecoderLm, Tokenizer)> {
    load_checkpoint(ctx, name, &load_options(ctx)?)
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
    load_checkpoint(ctx, name, &LoadOptions { device, dtype })
}

fn load_checkpoint(ctx: &StageContext, name: &str, opts: &LoadOptions) -> Result<(DecoderLm, Tokenizer)> {
    let path = ctx.input(name)?;
    let loaded = model::load(path, opts).with_context(|| format!("loading input `{name}` ({})", path.display()))?;
    let tok = loaded
        .tokenizer
        .with_context(|| format!("input `{name}` ({}): no tokenizer.json in the checkpoint", path.display()))?;
    Ok((loaded.model, tok))
}

/// The sampler of a sampling stage (param `backend`) over the checkpoint wired to input `name`,
/// with the checkpoint's tokenizer: the model core (loaded as [`load_policy`] does) or an
/// inference engine ([`http_backend`]; only the config and tokenizer are read here).
fn load_sampler(ctx: &StageContext, name: &str) -> Result<(sampling::Sampler, Tokenizer)> {
    match ctx.param::<http_backend::Backend>("backend")? {
        http_backend::Backend::Local => load_policy(ctx, name).map(|(m, t)| (sampling::Sampler::Local(m), t)),
        http_backend::Backend::Http => {
            let path = ctx.input(name)?;
            let (cfg, tok) = model::load_config(path).with_context(|| format!("input `{name}` ({}): the http backend needs a checkpoint directory", path.display()))?;
            let tok = tok.with_context(|| format!("input `{name}` ({}): no tokenizer.json in the checkpoint", path.display()))?;
            let engine = http_backend::HttpSampler::open(ctx, name)?;
            Ok((sampling::Sampler::Http { engine, context: cfg.max_position_embeddings as usize, vocab: cfg.vocab_size }, tok))
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    pub(crate) use rredcot::stages::shipped_defaults as shipped_params;

}
