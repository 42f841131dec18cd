//! `score_loo`: leave-one-out attribution (paper §4, Fig. 4; appendix D.2). For a trace
//! x, u_1..u_T the value of segment t is its pointwise mutual information with the target:
//!
//!   PMI_t = log p(target_t | x, u_1..u_T) − log p(target_t | x, trace without u_t)
//!
//! with `target = "answer"`: target_t = y* after the whole trace (y* = `answer_template` filled
//! with the reference answer, joined to each sequence as [`crate::traces::JoinedTarget`] says), or `target = "rest"` (the paper's choice): target_t = the
//! subsequent segments u_{t+1}..u_T followed by y*, so PMI_t = log p(u_{>t}, y* | x, u_{≤t}) −
//! log p(u_{>t}, y* | x, u_{<t}).
//!
//! All "with" terms come from one teacher-forced pass over x, u, y* (suffix sums of its per-token
//! log-probabilities); the T "without" sequences are one batched [`crate::model::logprob`] call per
//! trace. Output: `R` = PMI_t and `v` = zeros (T values each), σ = `normalize`(PMI), `method = "loo"`.

use anyhow::Result;
use rredcot::engine::{Builtin, Executable, StageContext};

use crate::traces::{score_attribution, JoinedTarget, Attribution, Trace};
use super::{load_policy_on, use_threads};
use crate::model::{logprob, DecoderLm, DeviceChoice, DtypeChoice, Tokenizer};
use rredcot::credit::sigma::Normalize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    Answer,
    Rest,
}

/// The stage's params (stages/score_loo.toml documents them); unknown or mistyped ones are errors
/// naming the stage and the param.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LooParams {
    target: Target,
    answer_template: String,
    normalize: Normalize,
    batch_size: usize,
    device: DeviceChoice,
    dtype: DtypeChoice,
    threads: i64,
}

/// PMI_t for t = 1..T.
fn pmi(model: &DecoderLm, tok: &Tokenizer, trace: &Trace, template: &str, target: Target, batch: usize) -> Result<Attribution> {
    let tt = trace.tokens(tok)?;
    let y = JoinedTarget::answer(tok, template, trace.answer()?)?;
    let n = tt.completion.len();
    // y* after a sequence, joined to how that sequence ends.
    let with_answer = |mut seq: Vec<i64>| -> Result<Vec<i64>> {
        let y = y.after(tok, &seq)?;
        seq.extend_from_slice(y);
        Ok(seq)
    };
    // One pass over x, u, y*: per-token log p of every completion and answer token.
    let p = tt.prompt.len();
    let mut pairs = vec![(tt.prompt.clone(), with_answer(tt.prefix(n))?.split_off(p))];
    for &(s, e) in &tt.bounds {
        let without: Vec<i64> = tt.prefix(s).into_iter().chain(tt.completion[e..].iter().copied()).collect();
        let cut = match target {
            Target::Answer => without.len(),
            Target::Rest => p + s,
        };
        let mut seq = with_answer(without)?;
        let continuation = seq.split_off(cut);
        pairs.push((seq, continuation));
    }
    let lps = logprob(model, &pairs, batch)?;
    let sum = |lp: &[f32]| lp.iter().map(|&x| x as f64).sum::<f64>();
    let values = tt
        .bounds
        .iter()
        .zip(&lps[1..])
        .map(|(&(_, e), without)| sum(&lps[0][if target == Target::Answer { n } else { e }..]) - sum(without))
        .collect();
    Ok(Attribution { values, credit: None, sequences: pairs.len(), positions: pairs.iter().map(|(p, c)| p.len() + c.len()).sum() })
}

pub const STAGE: Builtin = Builtin { name: "score_loo", version: "4", runs_in: Executable::Worker, run };

pub fn run(ctx: &mut StageContext) -> Result<()> {
    let p: LooParams = ctx.params()?;
    use_threads(p.threads);
    let (model, tok) = load_policy_on(ctx, "policy", p.device, p.dtype)?;
    score_attribution(ctx, "loo", p.normalize, |trace| pmi(&model, &tok, trace, &p.answer_template, p.target, p.batch_size))
}

#[cfg(test)]
mod tests {
    use rredcot::engine::context::parse_params;

    /// score_loo's and score_grad's shipped files parse into their params; a typo is an error.
    #[test]
    fn the_shipped_params_are_what_the_attribution_stages_read() {
        let loo = super::super::tests::shipped_params("score_loo");
        let p: super::LooParams = parse_params("score_loo", &loo).unwrap();
        assert_eq!((p.target, p.batch_size), (super::Target::Answer, 64));
        let grad = super::super::tests::shipped_params("score_grad");
        parse_params::<super::super::score_grad::GradParams>("score_grad", &grad).unwrap();
        let mut typo = loo;
        typo.insert("batch".into(), 8.into());
        let e = parse_params::<super::LooParams>("loo", &typo).unwrap_err().to_string();
        assert!(e.contains("unknown field `batch`"), "{e}");
    }
}
