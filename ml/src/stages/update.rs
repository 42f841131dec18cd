//! `update`: one training step of the policy on the rollouts of that step (paper Eq. 11–12).
//!
//! Advantages are group-normalized outcome rewards ([`rredcot::credit::weights::advantages`]).
//! Each completion's credit is uniform 1/|o| (`credit = "uniform"`, GRPO) or σ_t/|u_t| from the
//! `scores` and `segments` inputs (`credit = "sigma"`, RREDCoT), mixed by `sigma_mix`; segments
//! cover the chain of thought only, and the answer tokens after it keep GRPO's 1/|o| (a trace
//! left unsegmented because its thinking never closed trains with uniform weights). With
//! `credit = "progress"` (seed 002) the credit stays uniform and the *advantage* is per token: the
//! outcome advantage plus `progress_coef` × the prover's progress Δ_t of the token's step (from
//! `score_progress` values), times the token's entropy normalized over its step, mixed by
//! `entropy_mix` ([`rredcot::credit::progress`]). Each row's credit is
//! [`rredcot::credit::builder::token_credit`]; the loss is [`crate::train::loss::policy_loss`];
//! the forward and backward ([`crate::train::step::TrainModel`]: precision, checkpointing) run
//! `inner_epochs` × minibatches optimizer steps of the resumable AdamW, each accumulated over
//! micro-batches (so a batch larger than memory works), with a warmup + cosine schedule over the
//! whole run (`step` of `total_steps`, usually `"{step}"` / `"{repeat}"` in a chain) and
//! gradient clipping.
//!
//! Outputs: the next policy (HF checkpoint with tokenizer), the optimizer state, and a `metrics`
//! table with one row per optimizer step. Deterministic for the same inputs, params and threads.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use rredcot::artifact::rows::{PromptRow, RolloutRow, ScoreRow, SegmentRow};
use rredcot::artifact::{read_rows, write_rows, Schema};
use rredcot::credit::segmentation::checked_ends;
use rredcot::credit::builder::{token_credit, CreditSource, TokenCredit};
use rredcot::credit::weights::{advantages, ScaleRewards};
use rredcot::engine::{Builtin, Executable, StageContext};

use super::{load_policy_f32, use_threads};
use crate::model::{self, DecoderLm, DeviceChoice, LoadOptions, Tokenizer};
use crate::traces::encode_prompt;
use crate::train::adamw::{AdamW, AdamWConfig};
use crate::train::OptimizerParams;
use crate::train::grpo::{self, Sequence, UpdateConfig};
use crate::train::loss::{check_credit_with_is, IsLevel, LossConfig, LossType};
use crate::train::step::{TrainDtype, TrainModel};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum Credit {
    Uniform,
    Sigma,
    Progress,
}

/// Params of `update`, `update_rredcot` and `update_progress` (defaults and their docs:
/// `stages/update.toml` and the files that extend it).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateParams {
    seed: i64,
    credit: Credit,
    sigma_mix: f64,
    scale_rewards: ScaleRewards,
    reward_eps: f64,
    loss_type: LossType,
    importance_sampling: IsLevel,
    epsilon_low: f64,
    epsilon_high: f64,
    beta: f64,
    kl_bias_correction: bool,
    temperature: f64,
    max_completion_length: usize,
    inner_epochs: usize,
    minibatch_size: usize,
    micro_batch_size: usize,
    step: usize,
    total_steps: usize,
    lr: f64,
    warmup_steps: usize,
    min_lr_ratio: f64,
    weight_decay: f64,
    grad_clip: f64,
    adam_beta1: f64,
    adam_beta2: f64,
    adam_eps: f64,
    allow_off_policy: bool,
    device: DeviceChoice,
    dtype: TrainDtype,
    gradient_checkpointing: bool,
    threads: i64,
    /// `update_progress` only.
    progress_coef: Option<f64>,
    entropy_mix: Option<f64>,
}

impl Credit {
    fn name(self) -> &'static str {
        match self {
            Credit::Uniform => "uniform",
            Credit::Sigma => "sigma",
            Credit::Progress => "progress",
        }
    }
}

/// How each completion's credit is built ([`token_credit`]), from the checked params.
struct CreditParams {
    kind: Credit,
    sigma_mix: f64,
    progress_coef: f64,
    entropy_mix: f64,
}

impl UpdateParams {
    /// The training and credit settings, or an error naming the stage and the bad param.
    fn checked(&self, stage: &str) -> Result<(UpdateConfig, CreditParams)> {
        let loss = LossConfig {
            loss_type: self.loss_type,
            importance_sampling: self.importance_sampling,
            epsilon_low: self.epsilon_low,
            epsilon_high: self.epsilon_high,
            beta: self.beta,
            kl_bias_correction: self.kl_bias_correction,
        };
        if self.inner_epochs == 0 || self.micro_batch_size == 0 || self.temperature <= 0.0 || self.total_steps == 0 || self.max_completion_length == 0 {
            bail!("stage `{stage}`: inner_epochs, micro_batch_size, temperature, total_steps and max_completion_length must be positive");
        }
        // Past the run's end the cosine schedule would climb again.
        if self.step >= self.total_steps {
            bail!("stage `{stage}`: param step = {} is not below total_steps = {} (steps count from 0)", self.step, self.total_steps);
        }
        for (name, v) in [("epsilon_low", self.epsilon_low), ("epsilon_high", self.epsilon_high), ("beta", self.beta), ("reward_eps", self.reward_eps)] {
            if !(v >= 0.0 && v.is_finite()) {
                bail!("stage `{stage}`: param {name} = {v} must be a finite number >= 0");
            }
        }
        OptimizerParams {
            lr: self.lr,
            min_lr_ratio: self.min_lr_ratio,
            weight_decay: self.weight_decay,
            grad_clip: self.grad_clip,
            adam: Some((self.adam_beta1, self.adam_beta2, self.adam_eps)),
        }
        .check()
        .map_err(|e| anyhow::anyhow!("stage `{stage}`: {e}"))?;
        let sigma_mix = self.sigma_mix;
        if !(0.0..=1.0).contains(&sigma_mix) {
            bail!("stage `{stage}`: sigma_mix = {sigma_mix} is outside [0, 1]");
        }
        let uniform = self.credit == Credit::Uniform || (self.credit == Credit::Sigma && sigma_mix == 0.0);
        check_credit_with_is(loss.importance_sampling, self.credit.name(), uniform).map_err(|e| anyhow::anyhow!("stage `{stage}`: {e}"))?;
        // Only the progress kind (update_progress) declares these.
        let (progress_coef, entropy_mix) = match (self.credit, self.progress_coef, self.entropy_mix) {
            (Credit::Progress, Some(c), Some(m)) => (c, m),
            (Credit::Progress, _, _) => bail!("stage `{stage}`: credit = \"progress\" needs params progress_coef and entropy_mix"),
            _ => (0.0, 0.0),
        };
        if !(0.0..=1.0).contains(&entropy_mix) || !progress_coef.is_finite() {
            bail!("stage `{stage}`: entropy_mix = {entropy_mix} must be in [0, 1] and progress_coef finite");
        }
        let cfg = UpdateConfig {
            loss,
            temperature: self.temperature,
            max_completion: self.max_completion_length,
            inner_epochs: self.inner_epochs,
            minibatch: self.minibatch_size,
            micro: self.micro_batch_size,
            train_step: self.step,
            total_steps: self.total_steps,
            lr: self.lr,
            warmup: self.warmup_steps,
            min_ratio: self.min_lr_ratio,
            clip: self.grad_clip,
        };
        Ok((cfg, CreditParams { kind: self.credit, sigma_mix, progress_coef, entropy_mix }))
    }
}

/// The update's inputs: the rollouts to train on, their prompts, and (unless credit is uniform)
/// each rollout's scores and segments.
struct Batch {
    prompts: Vec<PromptRow>,
    rollouts: Vec<RolloutRow>,
    rollouts_path: PathBuf,
    scores_of: HashMap<(String, i32), (ScoreRow, SegmentRow)>,
}

impl Batch {
    /// Reads the inputs; rollouts sampled from another checkpoint than `policy` are an error
    /// unless `allow_off_policy`.
    fn read(ctx: &StageContext, credit: Credit, allow_off_policy: bool) -> Result<Batch> {
        let prompts: Vec<PromptRow> = read_rows(ctx.input("prompts")?, Schema::Prompts)?;
        let rollouts_path = ctx.input("rollouts")?.to_path_buf();
        let rollouts: Vec<RolloutRow> = read_rows(&rollouts_path, Schema::Rollouts)?;
        if rollouts.is_empty() {
            bail!("{}: no rollouts to train on", rollouts_path.display());
        }
        let policy_hash = ctx.input_hash("policy")?.to_string();
        if let Some(r) = rollouts.iter().find(|r| r.policy_ckpt != policy_hash).filter(|_| !allow_off_policy) {
            bail!(
                "{}: rollout (prompt {}, sample {}) was sampled from checkpoint {} but the policy input is {} (on-policy update; set allow_off_policy = true to train anyway)",
                rollouts_path.display(), r.prompt_id, r.sample_idx, &r.policy_ckpt[..12.min(r.policy_ckpt.len())], &policy_hash[..12]
            );
        }
        let scores_of = if credit != Credit::Uniform {
            let scores: Vec<ScoreRow> = read_rows(ctx.input("scores")?, Schema::Scores)?;
            let segs: Vec<SegmentRow> = read_rows(ctx.input("segments")?, Schema::Segments)?;
            let mut by: HashMap<(String, i32), SegmentRow> = segs.into_iter().map(|s| ((s.prompt_id.clone(), s.sample_idx), s)).collect();
            scores
                .into_iter()
                .filter_map(|sc| by.remove(&(sc.prompt_id.clone(), sc.sample_idx)).map(|sg| ((sc.prompt_id.clone(), sc.sample_idx), (sc, sg))))
                .collect()
        } else {
            HashMap::new()
        };
        Ok(Batch { prompts, rollouts, rollouts_path, scores_of })
    }

    /// Every non-empty rollout as a [`Sequence`]: the prompt as the policy sees it, the
    /// completion, its group-normalized advantage and per-token credit. Counts groups, empty
    /// completions and unscored traces on `ctx`.
    fn sequences(&self, ctx: &mut StageContext, model: &DecoderLm, tok: &Tokenizer, p: &UpdateParams, credit: &CreditParams) -> Result<Vec<Sequence>> {
        let context = model.cfg.max_position_embeddings as usize;
        let by_id: HashMap<&str, &PromptRow> = self.prompts.iter().map(|p| (p.id.as_str(), p)).collect();
        let rollouts_path = &self.rollouts_path;

        // Advantages over groups of the same prompt.
        let mut group_of: HashMap<&str, usize> = HashMap::new();
        let groups: Vec<usize> = self.rollouts.iter().map(|r| { let n = group_of.len(); *group_of.entry(r.prompt_id.as_str()).or_insert(n) }).collect();
        let rewards: Vec<f64> = self.rollouts.iter().map(|r| r.reward).collect();
        if let Some(i) = rewards.iter().position(|r| !r.is_finite()) {
            bail!("{} row {i}: reward is {}", rollouts_path.display(), rewards[i]);
        }
        let (adv, flat_groups) = advantages(&rewards, &groups, p.scale_rewards, p.reward_eps);
        ctx.count("groups", group_of.len() as i64);
        ctx.count("groups_all_rewards_equal", flat_groups as i64);

        let mut seqs = Vec::with_capacity(self.rollouts.len());
        let (mut empty, mut unclosed_uniform, mut no_cot_uniform) = (0i64, 0i64, 0i64);
        for (i, r) in self.rollouts.iter().enumerate() {
            let at = || format!("{} row {i} (prompt {}, sample {})", rollouts_path.display(), r.prompt_id, r.sample_idx);
            let n = r.completion_ids.len();
            if n == 0 {
                empty += 1;
                continue;
            }
            let prompt = by_id.get(r.prompt_id.as_str()).with_context(|| format!("{}: prompt not in the wired prompts", at()))?;
            let pids = encode_prompt(tok, prompt).with_context(at)?;
            if pids.len() + n > context {
                bail!("{}: prompt + completion = {} tokens exceed the policy's context of {context}", at(), pids.len() + n);
            }
            if let Some(bad) = r.completion_ids.iter().find(|&&t| t < 0 || t as i64 >= model.cfg.vocab_size) {
                bail!("{}: token id {bad} outside the policy's vocabulary ({}): rollouts and checkpoint disagree", at(), model.cfg.vocab_size);
            }
            let key = (r.prompt_id.clone(), r.sample_idx);
            let scored = || -> Result<(&ScoreRow, Vec<usize>)> {
                let (sc, sg) = self.scores_of.get(&key).with_context(|| format!("{}: no score/segments row for this rollout", at()))?;
                // Segments tile the chain of thought; a malformed row is an error here, not a panic
                // in token_weights.
                let ends = checked_ends(&sg.seg_starts, &sg.seg_ends, r.cot_len()).map_err(|e| anyhow::anyhow!("{}: {e}", at()))?;
                Ok((sc, ends))
            };
            // Traces `segment` gave no segments have no credit scores and train with GRPO's
            // uniform weights, counted: a thinking that never closed under on_unclosed = "skip",
            // and an empty chain of thought (cot_end = 0: the answer on the first line; σ over
            // no segments is uniform credit too, token_weights' c = 0).
            let no_cot = r.cot_end == Some(0);
            let unscored = credit.kind != Credit::Uniform && (r.cot_end.is_none() || no_cot) && !self.scores_of.contains_key(&key);
            unclosed_uniform += (unscored && !no_cot) as i64;
            no_cot_uniform += (unscored && no_cot) as i64;
            let scored_row = if credit.kind != Credit::Uniform && !unscored { Some(scored()?) } else { None };
            let source = match (credit.kind, &scored_row) {
                (Credit::Sigma, Some((sc, ends))) => CreditSource::Sigma { sigma: &sc.sigma, ends, mix: credit.sigma_mix },
                (Credit::Progress, Some((sc, ends))) => CreditSource::Progress {
                    values: &sc.r,
                    ends,
                    entropies: &r.entropies,
                    coef: credit.progress_coef,
                    entropy_mix: credit.entropy_mix,
                },
                _ => CreditSource::Uniform,
            };
            let TokenCredit { weights, advantages, sigma_entropy } = token_credit(n, adv[i], source).map_err(|e| anyhow::anyhow!("{}: {e}", at()))?;
            seqs.push(Sequence {
                ids: pids.iter().copied().chain(r.completion_ids.iter().map(|&t| t as i64)).collect(),
                prompt_len: pids.len(),
                credit: weights,
                advantage: advantages,
                reward: r.reward,
                sigma_entropy,
            });
        }
        ctx.count("empty_completions_skipped", empty);
        ctx.count("unclosed_uniform_credit", unclosed_uniform);
        ctx.count("no_cot_uniform_credit", no_cot_uniform);
        if seqs.is_empty() {
            bail!("{}: every rollout has an empty completion; nothing to train on", rollouts_path.display());
        }
        Ok(seqs)
    }
}

// Version 5: the policy checkpoint keeps its source's tokenizer_config.json and chat template.
pub const STAGE: Builtin = Builtin { name: "update", version: "5", runs_in: Executable::Worker, run };

pub fn run(ctx: &mut StageContext) -> Result<()> {
    let p: UpdateParams = ctx.params()?;
    use_threads(p.threads);
    tch::manual_seed(p.seed);
    let (cfg, credit) = p.checked(&ctx.instance)?;
    let batch = Batch::read(ctx, p.credit, p.allow_off_policy)?;
    // Float32 master weights whatever `dtype` says (it sets the compute precision).
    let (model, tok) = load_policy_f32(ctx, "policy", p.device)?;
    let device = model.device();
    let seqs = batch.sequences(ctx, &model, &tok, &p, &credit)?;
    let reference = if cfg.loss.beta > 0.0 {
        let path = ctx.input("reference")?;
        // On the policy's device (not `auto`: device = "cpu" on a CUDA host put it on the GPU).
        let opts = LoadOptions { device: DeviceChoice::of(device), dtype: model::DtypeChoice::F32 };
        Some(model::load(path, &opts).with_context(|| format!("loading the reference policy {}", path.display()))?.model)
    } else {
        None
    };

    let train = TrainModel::new(model, p.dtype, p.gradient_checkpointing);
    let adam = AdamWConfig { beta1: p.adam_beta1, beta2: p.adam_beta2, eps: p.adam_eps, weight_decay: p.weight_decay };
    let mut opt = AdamW::load_or_new(ctx.input("optimizer")?, adam, device)?;
    let mut progress = ctx.progress(cfg.optimizer_steps(seqs.len()) as u64, "update");
    let metrics = grpo::update(&train, &mut opt, reference.as_ref(), &seqs, &cfg, |done, loss, norm| {
        progress.set(done as u64, &format!("update loss {loss:.4} |g| {norm:.3}"));
    })?;
    progress.finish();

    let last = metrics.last().expect("at least one optimizer step");
    ctx.metric("loss", last.loss);
    ctx.metric("grad_norm", last.grad_norm);
    ctx.metric("kl", last.kl);
    ctx.metric("clip_fraction", last.clip_fraction);
    ctx.metric("lr", last.lr);
    ctx.metric("mean_reward", batch.rollouts.iter().map(|r| r.reward).sum::<f64>() / batch.rollouts.len() as f64);
    ctx.count("optimizer_steps", metrics.len() as i64);
    ctx.count("tokens_trained", seqs.iter().map(|s| s.completion_len() as i64).sum::<i64>() * p.inner_epochs as i64);
    let out = ctx.output("policy")?.to_path_buf();
    std::fs::create_dir_all(&out)?;
    model::save(train.master(), Some(&tok), &out)?;
    model::copy_tokenizer_files(ctx.input("policy")?, &out)?;
    opt.save(ctx.output("optimizer")?)?;
    write_rows(ctx.output("metrics")?, Schema::Table, &metrics)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::tests::shipped_params as shipped;

    #[test]
    fn the_shipped_update_files_params_are_what_update_reads() {
        use rredcot::engine::context::parse_params;
        for kind in ["update", "update_rredcot", "update_progress"] {
            let p: UpdateParams = parse_params(kind, &shipped(kind)).unwrap();
            assert_eq!(p.progress_coef.is_some(), kind == "update_progress", "{kind}");
        }
        let mut typo = shipped("update");
        typo.insert("micro_batchsize".into(), 4.into());
        let e = parse_params::<UpdateParams>("update", &typo).unwrap_err().to_string();
        assert!(e.contains("unknown field `micro_batchsize`"), "{e}");
    }

    /// An update that would not train as asked is refused naming the param: gradient ascent,
    /// betas outside [0, 1), a clip range turned inside out, a step past the run's end (the
    /// cosine would climb again), dr_grpo's normalizer 0.
    #[test]
    fn update_params_that_would_not_train_are_refused_naming_the_param() {
        use rredcot::engine::context::parse_params;
        let check = |edit: (&str, serde_json::Value)| {
            let mut p = shipped("update");
            p.insert(edit.0.into(), edit.1);
            parse_params::<UpdateParams>("update", &p).unwrap().checked("grpo.update[0]").map(|_| ()).map_err(|e| e.to_string())
        };
        assert_eq!(check(("seed", 1.into())), Ok(()));
        for (edit, says) in [
            (("lr", (-1.0).into()), "param lr = -1 must be positive"),
            (("adam_beta1", 1.5.into()), "param adam_beta1 = 1.5 is outside [0, 1)"),
            (("adam_eps", 0.0.into()), "param adam_eps = 0 must be positive"),
            (("epsilon_low", (-0.5).into()), "param epsilon_low = -0.5"),
            (("step", 5.into()), "param step = 5 is not below total_steps = 1"),
            (("max_completion_length", 0.into()), "max_completion_length must be positive"),
        ] {
            let e = check(edit.clone()).unwrap_err();
            assert!(e.contains("stage `grpo.update[0]`") && e.contains(says), "{edit:?}: {e}");
        }
    }
}
