//! `score_progress`: the prover's success probability after every step (seed 002's progress
//! reward). For a trace x, u_1..u_T, V_t estimates the probability that the *prover* (input
//! `prover`: a separate checkpoint, e.g. a stronger or earlier policy) reaches the reference
//! answer from x, u_1..u_t, t = 0..T; the progress reward of step t is Δ_t = V_t − V_{t−1}
//! ([`rredcot::credit::progress`]), which `update_progress` turns into per-token advantages.
//!
//! `estimate = "mc"`: V_t = fraction of `k` prover completions from the prefix that the verifier
//! finds correct, V_T = the trace's own reward (the `score_mc` machinery, seeds and truncation
//! rules, with the prover sampling). `estimate = "prefill"`: V_t = p_prover(y* | x, u_1..u_t)
//! with y* = `answer_template` filled with the reference answer (joined to each prefix as
//! [`crate::traces::JoinedTarget`] says): no sampling, T + 1 teacher-forced
//! sequences per trace.
//!
//! Output: `scores` with `R` = V_0..V_T, `v` = zeros, σ = `normalize`(Δ) (so it can also serve
//! as σ credit), `method = "progress"`.

use anyhow::Result;
use rredcot::engine::{Builtin, Executable, StageContext};

use super::score_mc::mc_values;
use crate::traces::{score_attribution, JoinedTarget, Attribution, Trace};
use crate::sampling::SamplerParams;
use super::score_mc::McParams;
use super::{load_policy_on, use_threads};
use crate::model::{logprob, DecoderLm, Tokenizer};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum Estimate {
    Mc,
    Prefill,
}

/// The stage's own params beside [`SamplerParams`] and score_mc's [`McParams`]
/// (stages/score_progress.toml documents them): which estimate and, for `prefill`, the answer y*
/// it scores.
#[derive(Debug, serde::Deserialize)]
struct ProgressParams {
    estimate: Estimate,
    answer_template: String,
}

/// V_t = p(y* | x, u_1..u_t) for t = 0..T, and Δ_t as the credit.
fn prefill_values(model: &DecoderLm, tok: &Tokenizer, trace: &Trace, template: &str, batch: usize) -> Result<Attribution> {
    let tt = trace.tokens(tok)?;
    let y = JoinedTarget::answer(tok, template, trace.answer()?)?;
    let cuts = std::iter::once(0).chain(tt.bounds.iter().map(|&(_, e)| e));
    let pairs = cuts
        .map(|upto| {
            let prefix = tt.prefix(upto);
            let y = y.after(tok, &prefix)?.to_vec();
            Ok((prefix, y))
        })
        .collect::<Result<Vec<(Vec<i64>, Vec<i64>)>>>()?;
    let lps = logprob(model, &pairs, batch)?;
    let values: Vec<f64> = lps.iter().map(|lp| lp.iter().map(|&x| x as f64).sum::<f64>().exp()).collect();
    let credit = rredcot::credit::progress::step_progress(&values);
    Ok(Attribution { values, credit: Some(credit), sequences: pairs.len(), positions: pairs.iter().map(|(p, c)| p.len() + c.len()).sum() })
}

pub const STAGE: Builtin = Builtin { name: "score_progress", version: "12", runs_in: Executable::Worker, run };

pub fn run(ctx: &mut StageContext) -> Result<()> {
    let (s, mc, p): (SamplerParams, McParams, ProgressParams) = (ctx.params()?, ctx.params()?, ctx.params()?);
    match p.estimate {
        Estimate::Mc => mc_values(ctx, &s, &mc, "prover", "progress", false),
        Estimate::Prefill => {
            use_threads(s.threads);
            let (model, tok) = load_policy_on(ctx, "prover", s.device, s.dtype)?;
            score_attribution(ctx, "progress", mc.normalize, |trace| prefill_values(&model, &tok, trace, &p.answer_template, s.batch_size))
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_params_struct_reads_every_param_of_the_stage_file() {
        use super::super::tests::{assert_reads_every_param, sampling_stage_and};
        let (_, p) = assert_reads_every_param("score_progress", sampling_stage_and::<super::McParams, super::ProgressParams>);
        assert_eq!(p.estimate, super::Estimate::Mc);
    }
}
