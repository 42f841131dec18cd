//! `score_grad`: gradient attribution (paper §4, Fig. 4; appendix D.2). One forward and one
//! backward pass per trace of log p(target | x, u_1..u_T) with respect to the input embeddings
//! ([`crate::model::embedding_grad_l1`]); the value of segment t is the L1 norm of the gradient
//! at each of its tokens, averaged over the segment.
//!
//! `target = "answer"`: y* (`answer_template` filled with the reference answer, joined as
//! [`crate::traces::JoinedTarget`] says) after the whole trace; `target = "rest"` (the paper's "logprobs of the selected completion tokens"): the
//! completion's own tokens followed by y*. Output: `R` = the per-segment mean L1 norms and `v` =
//! zeros (T values each), σ = `normalize`(R), `method = "grad"`. A segment that is only the
//! trailing stop token (not part of the scored trace) gets 0.

use anyhow::Result;
use rredcot::engine::{Builtin, Executable, StageContext};

use super::score_loo::Target;
use crate::traces::{score_attribution, JoinedTarget, Attribution, Trace};
use super::{load_policy_on, use_threads};
use crate::model::{embedding_grad_l1, DecoderLm, DeviceChoice, DtypeChoice, Tokenizer};
use rredcot::credit::sigma::Normalize;

/// Mean gradient L1 norm per segment.
fn segment_norms(model: &DecoderLm, tok: &Tokenizer, trace: &Trace, template: &str, target: Target) -> Result<Attribution> {
    let tt = trace.tokens(tok)?;
    let y = JoinedTarget::answer(tok, template, trace.answer()?)?;
    let p = tt.prompt.len();
    let mut seq = tt.prefix(tt.completion.len());
    seq.extend_from_slice(y.after(tok, &seq)?);
    let start = match target {
        Target::Answer => p + tt.completion.len(),
        Target::Rest => p,
    };
    let g = embedding_grad_l1(model, &seq, start)?;
    let values = tt
        .bounds
        .iter()
        .map(|&(s, e)| if e > s { g[p + s..p + e].iter().sum::<f64>() / (e - s) as f64 } else { 0.0 })
        .collect();
    Ok(Attribution { values, credit: None, sequences: 1, positions: seq.len() })
}

/// The stage's params (stages/score_grad.toml documents them); unknown or mistyped ones are errors
/// naming the stage and the param.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GradParams {
    target: Target,
    answer_template: String,
    normalize: Normalize,
    device: DeviceChoice,
    dtype: DtypeChoice,
    threads: i64,
}

pub const STAGE: Builtin = Builtin { name: "score_grad", version: "4", runs_in: Executable::Worker, run };

pub fn run(ctx: &mut StageContext) -> Result<()> {
    let p: GradParams = ctx.params()?;
    use_threads(p.threads);
    let (model, tok) = load_policy_on(ctx, "policy", p.device, p.dtype)?;
    let mut backward = 0i64;
    score_attribution(ctx, "grad", p.normalize, |trace| {
        backward += 1;
        segment_norms(&model, &tok, trace, &p.answer_template, p.target)
    })?;
    ctx.count("backward_passes", backward);
    Ok(())
}
