//! Builtin stages that need the model core, one module per stage kind, each declaring itself
//! (`STAGE`). `rredcot`, which does not link libtorch, keys them from
//! `rredcot::stages::WORKER_STAGES`, generated from these declarations (test `worker_stages`).

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
use crate::sampling::{http, EngineLogprobs, Sampler, SamplerParams};
use rredcot::engine::{Builtin, Catalog, Runtime, StageContext};

use crate::model::{self, DecoderLm, LoadOptions, Tokenizer};

/// The builtins of this package, each as its module declares it (all run in the worker).
pub const STAGES: &[Builtin] = &[
    bootstrap_sft::STAGE,
    rollout::STAGE,
    score_sigma::STAGE,
    score_mc::STAGE,
    score_loo::STAGE,
    score_grad::STAGE,
    score_progress::STAGE,
    reset::STAGE,
    update::STAGE,
    eval::STAGE,
    judge_local::STAGE,
];

/// What the worker knows: the code of every builtin, light ones included.
pub const FULL_CATALOG: Catalog = Catalog { builtins: &[rredcot::stages::STAGES, STAGES], worker_builtins: &[], schemas: rredcot::artifact::SCHEMAS };

pub const FULL_RUNTIME: Runtime = Runtime { catalog: &FULL_CATALOG, worker: rredcot::stages::WORKER, versions, after_instance };

/// rredcot's versions, plus the CPU kernels ATen runs (`aten_cpu_capability`): on the CPU the
/// same inputs give other numbers under AVX2 and AVX-512 kernels.
fn versions() -> std::collections::BTreeMap<String, String> {
    let mut v = rredcot::versions();
    if let Some(kernels) = crate::aten_kernels::cpu_capability() {
        v.insert("aten_cpu_capability".into(), kernels);
    }
    v
}

/// After an instance in a warm stage process (engine/src/warm.rs): its memory is given back
/// ([`release_cached_memory`]), as the end of a process would, because the next instance may
/// start an inference server on that GPU; a build without the CUDA shim cannot, so its process
/// ends and the next instance gets a fresh one.
fn after_instance() -> bool {
    release_cached_memory()
}

/// Frees the cached CPU blocks (crate::cpu_cache) and, in a process that sees a GPU, gives the
/// CUDA caching allocator's blocks back to the driver; false where that cannot be done (a build
/// without the CUDA shim).
pub fn release_cached_memory() -> bool {
    crate::cpu_cache::release();
    !tch::Cuda::is_available() || model::cuda_graph::empty_cache()
}

/// Intra-op threads of this process (0: libtorch's default). Set by every instance, since a warm
/// stage process (engine/src/warm.rs) keeps what the previous instance chose.
fn use_threads(threads: i64) {
    static DEFAULT: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    let default = *DEFAULT.get_or_init(tch::get_num_threads);
    tch::set_num_threads(if threads > 0 { threads as i32 } else { default });
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

/// The model core over input `name` in a sampling stage's device and dtype, loaded when called:
/// what an engine's samples and loads are checked against once the engine is stopped or kept.
fn model_core<'a>(name: &'a str, p: &'a SamplerParams) -> impl FnOnce(&StageContext) -> Result<DecoderLm> + 'a {
    move |ctx| Ok(load_policy_on(ctx, name, p.device, p.dtype)?.0)
}

/// The sampler of a sampling stage (param `backend`) over the checkpoint wired to input `name`,
/// with the checkpoint's tokenizer: the model core on the stage's device in its dtype, or an
/// inference engine ([`crate::sampling::http`]; only the config and tokenizer are read here) that returns
/// `logprobs.top_logprobs` logprobs per token (`None`: a stage that keeps no logprobs).
fn load_sampler(ctx: &StageContext, name: &str, p: &SamplerParams, logprobs: Option<&EngineLogprobs>) -> Result<(Sampler, Tokenizer)> {
    p.check()?;
    let engine_params: http::HttpParams = ctx.params()?;
    let top_logprobs = logprobs.map_or(0, |l| l.top_logprobs);
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

    /// `rredcot` keys the worker's stages from a generated list: it must say what the modules
    /// declare, or keys computed there would not be the worker's (`RREDCOT_REGEN=1` rewrites it).
    #[test]
    fn worker_stages_is_what_the_stage_modules_declare() {
        use rredcot::engine::Executable;
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../src/stages/worker_stages.rs");
        let text = std::fs::read_to_string(&path).unwrap();
        let header = &text[..text.find("pub const WORKER_STAGES").expect("the list's declaration")];
        let mut want = format!("{header}pub const WORKER_STAGES: &[BuiltinInfo] = &[\n");
        for s in super::STAGES {
            assert_eq!(s.runs_in, Executable::Worker, "{}: a stage of the ML package runs in the worker", s.name);
            want += &format!("    BuiltinInfo {{ name: {:?}, version: {:?}, runs_in: Worker }},\n", s.name, s.version);
        }
        want += "];\n";
        if std::env::var_os("RREDCOT_REGEN").is_some() && text != want {
            std::fs::write(&path, &want).unwrap();
            panic!("rewrote {}: run the test again (without RREDCOT_REGEN) to check the rebuilt catalog", path.display());
        }
        assert!(text == want, "{} is not what ml/src/stages declare; rerun with RREDCOT_REGEN=1. It should read:\n{want}", path.display());
        assert_eq!(super::FULL_CATALOG.duplicate_names(), Vec::<&str>::new());
        let light = &rredcot::stages::CATALOG;
        for s in super::STAGES {
            assert!(light.code(s.name).is_none() && light.builtin(s.name) == Some(s.info()), "{}", s.name);
        }
    }

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
