//! Sampling G completions per prompt, shared by `rollout` (training batches) and `eval` (avg@k):
//! which prompts can be sampled, per-row seeds, batching, the context-window clamp, progress, and
//! where a completion's chain of thought ends and its answer begins ([`split_answer`]).
//!
//! Every sampling stage samples through a [`Sampler`] (param `backend`): the model core in this
//! process, or an OpenAI-compatible inference engine ([`http`]). Both get the same
//! rows, seeds and context clamp, so on `rredcot serve` the two give the same tokens.

use anyhow::{bail, Context, Result};
use rredcot::artifact::rows::PromptRow;
use rredcot::credit::thinking::{answer_start, closed_at};
use rredcot::math::{has_final_answer, verify_response, Verdict};
use rredcot::engine::hash::sha256_hex;
use rredcot::engine::{Progress, StageContext};
use std::path::Path;
use std::time::Instant;

use crate::traces::encode_prompt;
pub mod http;
pub mod untied;

use self::http::{plan_requests, topk_entropy, Backend, HttpSampler};
use crate::model::{self, DecoderLm, DeviceChoice, DtypeChoice, Generation, SamplingParams, Tokenizer};

/// The params every sampling stage has (rollout, eval, reset_*, score_mc, score_progress): the
/// sampler, its batching, where it runs and through which backend; the stage files document them.
/// A stage reads this and its own params struct from the same params (`ctx.params()` for each),
/// so neither can deny the other's fields: the engine refuses a param the stage file does not
/// declare, and each stage's test checks that its structs read every declared one. (Not serde's
/// `flatten`: it loses the name of a mistyped param.)
#[derive(Debug, Clone, serde::Deserialize)]
pub struct SamplerParams {
    pub seed: u64,
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: i64,
    pub max_new_tokens: usize,
    pub stop_strings: Vec<String>,
    pub thinking: Thinking,
    /// Rows sampled together.
    pub batch_size: usize,
    /// `batch_size` slots refilled as rows finish instead of fixed batches.
    pub continuous_batching: bool,
    pub device: DeviceChoice,
    pub dtype: DtypeChoice,
    pub threads: i64,
    pub backend: Backend,
}

impl SamplerParams {
    /// Params that would sample nothing or nonsense, refused before a model is loaded (an empty
    /// artifact cached as a result would look like a policy that answers nothing).
    pub fn check(&self) -> anyhow::Result<()> {
        if self.max_new_tokens == 0 {
            anyhow::bail!("param max_new_tokens = 0: a completion needs at least 1 token");
        }
        if let Some(why) = self.sampling().invalid() {
            anyhow::bail!("params: {why}");
        }
        Ok(())
    }

    /// What the model core's sampler takes.
    pub fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            max_new_tokens: self.max_new_tokens,
            stop_strings: self.stop_strings.clone(),
            stop_token_ids: vec![],
        }
    }
}

/// The params of stages whose completions are training data (rollout, reset_*): the top
/// logprobs an engine returns per token and where the entropies come from ([`engine_entropies`]).
#[derive(Debug, Clone, Copy, serde::Deserialize)]
pub struct EngineLogprobs {
    pub top_logprobs: usize,
    pub entropies: Entropies,
}

/// What samples a stage's completions (param `backend`).
// One per stage: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum Sampler {
    /// The model core in this process.
    Local(DecoderLm),
    /// An inference engine over HTTP, with the policy's context window (from its config) and
    /// the top logprobs it returns per token (0: none; entropies then come from elsewhere).
    Http { engine: HttpSampler, context: usize, vocab: i64, top_logprobs: usize },
}

impl Sampler {
    /// The policy's context window (tokens).
    pub fn context(&self) -> usize {
        match self {
            Sampler::Local(m) => m.cfg.max_position_embeddings as usize,
            Sampler::Http { context, .. } => *context,
        }
    }

    /// The model core's model, when it samples.
    pub fn local(&self) -> Option<&DecoderLm> {
        match self {
            Sampler::Local(m) => Some(m),
            Sampler::Http { .. } => None,
        }
    }

    /// Stops an engine the stage started (an engine that died during the run is an error). Stages
    /// end their sampler through [`finish_engine`] or [`engine_entropies`], which check a kept
    /// engine's load; so this is not theirs to call.
    /// Returns the seconds a kept engine took to fall asleep (param `sleep`).
    fn finish(self) -> Result<Option<f64>> {
        match self {
            Sampler::Local(_) => Ok(None),
            Sampler::Http { engine, .. } => engine.stop(),
        }
    }
}

/// What to do with a prompt that cannot be sampled (no reference answer, too long).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnBadPrompt {
    Error,
    Skip,
}

/// Whether the policy writes `<think> … </think>` before its answer (param `thinking`): `auto`
/// (yes when its vocabulary has `</think>`), `on` or `off` (e.g. Qwen3-Instruct-2507, whose
/// vocabulary has the token but which never thinks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Thinking {
    Auto,
    On,
    Off,
}

/// A completion judged after its chain of thought.
#[derive(Debug, Clone, PartialEq)]
pub struct Answered {
    /// Completion tokens of the chain of thought (see [`rredcot::credit::thinking`]); `None`:
    /// it never ended; `Some(0)`: there is none, the answer starts the completion.
    pub cot_end: Option<usize>,
    /// The verifier on the answer part only (nothing extracted when the thinking never closed;
    /// not correct when the completion was cut without a final answer).
    pub verdict: Verdict,
    /// The verifier read a correct answer, but the completion was cut at its token budget before
    /// it stated one ("the answer is", a box, `####`, ...): the number read was the text's last,
    /// not an answer, so no credit (as open-r1's reward reads anchored answers only).
    pub cut_unanswered: bool,
}

/// Splits a completion (`ids`, decoded `text`) at the end of its chain of thought and verifies
/// the answer after it against `gold`. Thinking: the answer is the text after the first `</think>`;
/// a completion without one has no answer (reward 0). Not thinking: the answer is the sentence of
/// the verifier's extraction on its line ([`answer_start`]), and `cot_end` is the token where it
/// starts (`Some(0)` when it starts the text: no chain of thought before it; `None` when nothing
/// is extracted: no answer, so the chain of thought never ended).
/// `cut`: the completion hit its token budget; it is credited only if its answer part states a
/// final answer ([`Answered::cut_unanswered`]).
pub fn split_answer(tok: &Tokenizer, thinking: Thinking, gold: &str, ids: &[i64], text: &str, cut: bool) -> Result<Answered> {
    let think_end = match thinking {
        Thinking::Auto => tok.think_end_id,
        Thinking::On => Some(tok.think_end_id.with_context(|| format!("thinking = \"on\" but the tokenizer {} has no `</think>` token", tok.source.display()))?),
        Thinking::Off => None,
    };
    let judged = |answer: &str| {
        let verdict = verify_response(gold, answer);
        let cut_unanswered = cut && verdict.correct && !has_final_answer(answer);
        (Verdict { correct: verdict.correct && !cut_unanswered, ..verdict }, cut_unanswered)
    };
    if let Some(te) = think_end {
        return Ok(match closed_at(ids, te) {
            Some(c) => {
                let (verdict, cut_unanswered) = judged(&tok.decode(&ids[c..], true)?);
                Answered { cot_end: Some(c), verdict, cut_unanswered }
            }
            None => Answered { cot_end: None, verdict: Verdict { extracted: None, correct: false }, cut_unanswered: false },
        });
    }
    let (verdict, cut_unanswered) = judged(text);
    let start = verdict.extracted.as_deref().and_then(|e| answer_start(text, e));
    let cot_end = match start {
        // The answer starts the text: an empty chain of thought, not one that never ended.
        Some(0) => Some(0),
        // Token 0 when the answer starts inside the first token: empty as well.
        Some(at) => token_at_byte(tok, ids, at)?,
        None => None,
    };
    Ok(Answered { cot_end, verdict, cut_unanswered })
}

/// The index of the token of `ids` whose decoded text holds byte `at` of the decoding of `ids`
/// (binary search over decoded prefixes; `None` past the end).
fn token_at_byte(tok: &Tokenizer, ids: &[i64], at: usize) -> Result<Option<usize>> {
    let (mut lo, mut hi) = (0usize, ids.len());
    if tok.decode(ids, true)?.len() <= at {
        return Ok(None);
    }
    // Invariant: decode(ids[..lo]) ends at or before `at`, decode(ids[..hi]) past it.
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if tok.decode(&ids[..mid], true)?.len() > at {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(Some(lo))
}

/// The sampling seed of one row.
pub fn row_seed(seed: u64, prompt_id: &str, sample_idx: usize) -> u64 {
    let h = sha256_hex(format!("{seed}\u{0}{prompt_id}\u{0}{sample_idx}").as_bytes());
    u64::from_str_radix(&h[..16], 16).expect("hex")
}

/// One completion to sample: (prompt, sample index) with the prompt's token ids.
pub struct Job<'a> {
    pub row: &'a PromptRow,
    pub gold: &'a str,
    pub ids: Vec<i64>,
    pub sample_idx: usize,
}

/// `group` jobs per prompt of `prompts` (read from `path`, named in errors). A prompt without a
/// reference answer or not shorter than `context` is an error or a skip counted in the stage's
/// `prompts_skipped_*` counters.
pub fn plan_jobs<'a>(
    ctx: &mut StageContext,
    prompts: &'a [PromptRow],
    path: &Path,
    tok: &Tokenizer,
    context: usize,
    group: usize,
    on_bad: OnBadPrompt,
) -> Result<Vec<Job<'a>>> {
    let mut jobs = Vec::with_capacity(prompts.len() * group);
    let (mut no_answer, mut too_long) = (0i64, 0i64);
    for (i, row) in prompts.iter().enumerate() {
        let at = || format!("{} row {i} (prompt {})", path.display(), row.id);
        let Some(gold) = row.answer.as_deref().filter(|a| !a.trim().is_empty()) else {
            match on_bad {
                OnBadPrompt::Error => bail!("{}: no reference answer, so no reward (set on_bad_prompt = \"skip\" to drop such prompts)", at()),
                OnBadPrompt::Skip => {
                    no_answer += 1;
                    continue;
                }
            }
        };
        let ids = encode_prompt(tok, row).with_context(at)?;
        if ids.len() >= context {
            match on_bad {
                OnBadPrompt::Error => bail!("{}: prompt is {} tokens, the policy's context is {context}", at(), ids.len()),
                OnBadPrompt::Skip => {
                    too_long += 1;
                    continue;
                }
            }
        }
        for sample_idx in 0..group {
            jobs.push(Job { row, gold, ids: ids.clone(), sample_idx });
        }
    }
    ctx.count("prompts_skipped_no_answer", no_answer);
    ctx.count("prompts_skipped_too_long", too_long);
    Ok(jobs)
}

/// Samples every job in batches of `batch_size` rows (in job order, so the result does not
/// depend on timing) and returns one generation per job; row seeds from (`seed`, prompt id,
/// sample index), or with `group_seeds` the seed of sample 0 plus the sample index (an engine then
/// samples a prompt's group in one request). See [`sample_seeded`].
pub fn sample_jobs(
    ctx: &mut StageContext,
    sampler: &Sampler,
    tok: &Tokenizer,
    jobs: &[Job],
    p: &SamplerParams,
    label: &str,
    group_seeds: bool,
) -> Result<Vec<Generation>> {
    let seed = p.seed;
    let seed_of = |j: &Job| {
        if group_seeds {
            row_seed(seed, &j.row.id, 0).wrapping_add(j.sample_idx as u64)
        } else {
            row_seed(seed, &j.row.id, j.sample_idx)
        }
    };
    let rows: Vec<(&[i64], u64)> = jobs.iter().map(|j| (j.ids.as_slice(), seed_of(j))).collect();
    Ok(sample_seeded(ctx, sampler, tok, &rows, p, label, |i| format!("prompt {} sample {}", jobs[i].row.id, jobs[i].sample_idx))?.0)
}

/// Puts the bar at `rows` rows done, with the decode rate of `tokens` sampled since `t0`.
fn show_rate(progress: &mut Progress, label: &str, rows: usize, tokens: i64, t0: Instant) {
    let rate = tokens as f64 / t0.elapsed().as_secs_f64().max(1e-9);
    progress.set(rows as u64, &format!("{label} {rate:.0} tok/s"));
}

/// Samples `rows` = (prompt ids, row seed) in batches of `batch_size` rows, in order (or, with
/// `continuous_batching`, in `batch_size` slots refilled as rows finish), and returns
/// one generation per row (`name(i)` names row i in errors) and the prompt positions prefilled
/// for them. Counts `tokens_generated`, `prompt_positions_prefilled` and
/// `rows_max_new_tokens_clamped`, sets the `decode_tok_s` metric and shows a progress bar.
///
/// The positions prefilled are the model core's measured count (a run of rows with one prompt
/// prefills it once; a static batch prefills its padding too), or, through an engine, the prompts
/// of the requests sent (a request's `n` samples share a prefill; an engine's own prefix cache
/// may do less). A stage adds the tokens generated to report its forward cost.
///
/// With an engine ([`Sampler::Http`]) the rows go out as requests with the same seeds and the same
/// per-row token budget (the clamp the batches above would apply), and come back with the engine's
/// token ids and chosen-token logprobs; entropies are estimated from the top `top_logprobs`
/// logprobs when that is positive, else left empty (the rollout fills them in).
pub fn sample_seeded(
    ctx: &mut StageContext,
    sampler: &Sampler,
    tok: &Tokenizer,
    rows: &[(&[i64], u64)],
    p: &SamplerParams,
    label: &str,
    name: impl Fn(usize) -> String,
) -> Result<(Vec<Generation>, u64)> {
    let batch_size = p.batch_size;
    if batch_size == 0 {
        bail!("stage `{}`: batch_size must be positive", ctx.instance);
    }
    let sampling = &p.sampling();
    let model = match sampler {
        Sampler::Local(m) => m,
        Sampler::Http { engine, context, vocab, top_logprobs } => {
            let batching = (batch_size, p.continuous_batching);
            return sample_http(ctx, engine, (*context, *vocab, *top_logprobs), tok, rows, batching, sampling, label, name);
        }
    };
    let context = model.cfg.max_position_embeddings as usize;
    let prefilled_before = model::prefilled_positions();
    let mut out = Vec::with_capacity(rows.len());
    let (mut generated, mut clamped) = (0i64, 0i64);
    let t0 = Instant::now();
    let mut progress = ctx.progress(rows.len() as u64, label);
    if p.continuous_batching {
        // One request, `batch_size` slots: a finished row's slot takes the next row. Each row
        // is clamped to what the context leaves after its own prompt.
        clamped = rows.iter().filter(|r| r.0.len() + sampling.max_new_tokens > context).count() as i64;
        let prompts: Vec<Vec<i64>> = rows.iter().map(|r| r.0.to_vec()).collect();
        let seeds: Vec<u64> = rows.iter().map(|r| r.1).collect();
        let mut show = |x: model::generate::Progress| show_rate(&mut progress, label, x.rows_done, x.tokens as i64, t0);
        let gens = tch::no_grad(|| model::generate_continuous_within_context(model, Some(tok), &prompts, &seeds, sampling, batch_size, Some(&mut show)))
            .with_context(|| format!("sampling {} .. {}", name(0), name(rows.len().saturating_sub(1))))?;
        generated = gens.iter().map(|g| g.tokens.len() as i64).sum::<i64>();
        out = gens;
        progress.set(out.len() as u64, label);
    }
    let static_batches = if out.is_empty() { rows.chunks(batch_size) } else { rows[..0].chunks(batch_size) };
    for chunk in static_batches {
        let longest = chunk.iter().map(|r| r.0.len()).max().unwrap_or(0);
        // Never sample past the context window: shorten this batch's budget and count it.
        let mut budget = sampling.clone();
        if longest + budget.max_new_tokens > context {
            budget.max_new_tokens = context.saturating_sub(longest);
            clamped += chunk.len() as i64;
        }
        let prompts: Vec<Vec<i64>> = chunk.iter().map(|r| r.0.to_vec()).collect();
        let seeds: Vec<u64> = chunk.iter().map(|r| r.1).collect();
        let first = out.len();
        // Rows finished and tokens sampled so far, within a batch too: one batch of long
        // completions (Table 2's rollout) decodes for minutes.
        let mut show = |x: model::generate::Progress| {
            show_rate(&mut progress, label, first + x.rows_done, generated + x.tokens as i64, t0)
        };
        let gens = tch::no_grad(|| model::generate_with_progress(model, Some(tok), &prompts, &seeds, &budget, Some(&mut show)))
            .with_context(|| format!("sampling {} .. {}", name(first), name(first + chunk.len() - 1)))?;
        generated += gens.iter().map(|g| g.tokens.len() as i64).sum::<i64>();
        out.extend(gens);
        show_rate(&mut progress, label, out.len(), generated, t0);
    }
    progress.finish();
    let prefilled = model::prefilled_positions() - prefilled_before;
    ctx.count("tokens_generated", generated);
    ctx.count("prompt_positions_prefilled", prefilled as i64);
    ctx.count("rows_max_new_tokens_clamped", clamped);
    ctx.metric("decode_tok_s", generated as f64 / t0.elapsed().as_secs_f64().max(1e-9));
    Ok((out, prefilled))
}

/// The token budget of each row: `max_new_tokens`, shortened to what the context leaves after
/// the longest prompt of its batch (of `batch_size` rows, or of all rows with continuous
/// batching), as [`sample_seeded`]'s model-core path applies it. Returns the budgets and how many
/// rows were clamped.
fn row_budgets(rows: &[(&[i64], u64)], batch_size: usize, continuous: bool, max_new_tokens: usize, context: usize) -> (Vec<usize>, i64) {
    let per = if continuous { rows.len().max(1) } else { batch_size };
    let mut budgets = Vec::with_capacity(rows.len());
    let mut clamped = 0i64;
    for chunk in rows.chunks(per) {
        let longest = chunk.iter().map(|r| r.0.len()).max().unwrap_or(0);
        let budget = if longest + max_new_tokens > context {
            clamped += chunk.len() as i64;
            context.saturating_sub(longest)
        } else {
            max_new_tokens
        };
        budgets.extend(std::iter::repeat_n(budget, chunk.len()));
    }
    (budgets, clamped)
}

/// [`sample_seeded`] through an inference engine.
#[allow(clippy::too_many_arguments)]
fn sample_http(
    ctx: &mut StageContext,
    engine: &HttpSampler,
    (context, vocab, top): (usize, i64, usize),
    tok: &Tokenizer,
    rows: &[(&[i64], u64)],
    (batch_size, continuous): (usize, bool),
    sampling: &SamplingParams,
    label: &str,
    name: impl Fn(usize) -> String,
) -> Result<(Vec<Generation>, u64)> {
    let (budgets, clamped) = row_budgets(rows, batch_size, continuous, sampling.max_new_tokens, context);
    let mut stop_ids = sampling.stop_token_ids.clone();
    stop_ids.extend(&tok.eos_ids);
    let t0 = Instant::now();
    let planned: Vec<(&[i64], u64, usize)> = rows.iter().zip(&budgets).map(|(r, &b)| (r.0, r.1, b)).collect();
    // A row with no budget left (a prompt that fills the context) is not sent: it ends at once.
    let sendable: Vec<usize> = (0..rows.len()).filter(|&i| budgets[i] > 0).collect();
    if let Some(&first) = sendable.first() {
        let seeded = engine.probe(rows[first].0, budgets[first], sampling, &stop_ids, top)?;
        ctx.metric("engine_follows_seeds", seeded);
        if !seeded {
            tracing::warn!(
                "stage `{}`: the engine at {} sampled other tokens for the same request and seed: its samples do not follow the rows' seeds, and a rerun would sample anew (SGLang: start it with --enable-deterministic-inference)",
                ctx.instance,
                engine.url()
            );
        }
    }
    let requests = plan_requests(&sendable.iter().map(|&i| planned[i]).collect::<Vec<_>>(), engine.max_choices(), |k| name(sendable[k]));
    let progress = std::sync::Mutex::new(ctx.progress(rows.len() as u64, label));
    let done = std::sync::atomic::AtomicU64::new(0);
    let on_done = |n: usize| {
        let d = done.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed) + n as u64;
        if let Ok(mut p) = progress.lock() {
            p.set(d, label);
        }
    };
    let prefilled: u64 = requests.iter().map(|r| r.prompt.len() as u64).sum();
    let replies = engine.sample(&requests, sampling, &stop_ids, top, &on_done);
    if let Ok(mut p) = progress.into_inner() {
        p.finish();
    }
    ctx.count("http_requests", engine.requests.swap(0, std::sync::atomic::Ordering::Relaxed));
    ctx.count("http_retries", engine.retried.swap(0, std::sync::atomic::Ordering::Relaxed));
    let replies = replies?;
    let mut sampled = replies.into_iter().flatten();
    let mut out = Vec::with_capacity(rows.len());
    let mut generated = 0i64;
    for (i, &budget) in budgets.iter().enumerate() {
        if budget == 0 {
            out.push(Generation { tokens: vec![], logprobs: vec![], entropies: vec![], finish_reason: model::FinishReason::Length, text: Some(String::new()) });
            continue;
        }
        let s = sampled.next().context("fewer replies than rows")?;
        if s.tokens.len() > budget {
            bail!("stage `{}`: {} at {}: the engine returned {} tokens for max_tokens = {budget}", ctx.instance, name(i), engine.url(), s.tokens.len());
        }
        if let Some(bad) = s.tokens.iter().find(|&&t| t < 0 || t >= vocab) {
            bail!("stage `{}`: {} at {}: token id {bad} is outside the policy's vocabulary of {vocab}: the engine serves another model", ctx.instance, name(i), engine.url());
        }
        generated += s.tokens.len() as i64;
        let mut text = tok.decode(&s.tokens, true)?;
        if let Some(cut) = sampling.stop_strings.iter().filter_map(|st| text.find(st.as_str())).min() {
            text.truncate(cut);
        }
        let entropies = if top > 0 { s.top.iter().map(|t| topk_entropy(t)).collect() } else { vec![] };
        out.push(Generation { tokens: s.tokens, logprobs: s.logprobs, entropies, finish_reason: s.finish_reason, text: Some(text) });
    }
    ctx.count("tokens_generated", generated);
    ctx.count("prompt_positions_prefilled", prefilled as i64);
    ctx.count("rows_max_new_tokens_clamped", clamped);
    ctx.metric("decode_tok_s", generated as f64 / t0.elapsed().as_secs_f64().max(1e-9));
    ctx.metric("engine", engine.engine.clone());
    ctx.metric("engine_version", engine.engine_version.clone());
    ctx.metric("engine_url", engine.url().to_string());
    ctx.metric("engine_model", engine.model().to_string());
    ctx.metric("engine_startup_s", engine.startup_s);
    ctx.metric("engine_reused", engine.reused);
    ctx.metric("engine_reload_s", engine.reload_s);
    ctx.metric("engine_wake_s", engine.wake_s);
    ctx.metric("engine_untied_view", engine.untied_view);
    Ok((out, prefilled))
}

/// How far (mean nats per token) a kept engine's logprobs may be from the model core's before its
/// checkpoint load is taken to have failed: `KEPT_GAP_FACTOR` × the gap the same engine showed in
/// the stage that started it (its precision's own noise: 2e-7 for `rredcot serve`, ≤ 1e-5 for
/// vLLM's f32 CPU build; a bf16 engine's is larger), at least `KEPT_GAP_FLOOR` and at most
/// `KEPT_GAP_MAX`. A wrong load measured 0.54 (vLLM 0.32's CPU build on a tied checkpoint); an
/// engine that kept the previous step's weights is off by about one training step's change of
/// the policy, which an f32 engine shows far above its floor, and a bf16 engine's noise may hide.
const KEPT_GAP_FACTOR: f64 = 4.0;
const KEPT_GAP_FLOOR: f64 = 1e-3;
const KEPT_GAP_MAX: f64 = 0.25;

/// How far (mean nats per token, in the model core) a new checkpoint must move the canary's
/// logprobs ([`http::Canary`]) for an engine that answers it unchanged after the load to be taken
/// as one that did not load: far above a deterministic model core's zero, below any real training
/// step's change.
const CANARY_SHIFT_MIN: f64 = 1e-6;

/// The largest mean logprob gap a kept engine may show, given the gap it showed when started.
fn kept_gap_limit(fresh_gap: Option<f64>) -> f64 {
    fresh_gap.map_or(KEPT_GAP_MAX, |g| (KEPT_GAP_FACTOR * g).clamp(KEPT_GAP_FLOOR, KEPT_GAP_MAX))
}

/// Where the entropies of an engine's completions come from (param `entropies`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Entropies {
    /// Exact: one prefill of each finished completion in the model core.
    Prefill,
    /// Estimated from the engine's top `top_logprobs` logprobs (a lower bound).
    Topk,
    /// NaN per token (entropy-based segmentation refuses them).
    None,
}

/// What a stage knows of its engine before stopping it, for checking a kept engine's load
/// ([`EngineState::check`]) once the model core is loaded.
struct EngineState {
    /// The engine was kept from an earlier stage.
    kept: bool,
    /// It will be kept for the next stage (param `reload`).
    keeps: bool,
    fresh_gap: Option<f64>,
    url: String,
    canary: Option<http::Canary>,
    after_load: Option<http::CanaryAfterLoad>,
}

/// The mean and the largest |a − b| over paired logprobs; `None` when there are none.
fn logprob_gap(a: &[f32], b: &[f32]) -> Option<(f64, f32)> {
    let (mut sum, mut max, mut n) = (0f64, 0f32, 0usize);
    for d in a.iter().zip(b).map(|(x, y)| (x - y).abs()) {
        sum += d as f64;
        max = max.max(d);
        n += 1;
    }
    (n > 0).then(|| (sum / n as f64, max))
}

impl EngineState {
    /// Stops `sampler` (recording `engine_sleep_s` when its kept engine went to sleep); what its
    /// engine was, or `None` for the model core.
    fn stop(ctx: &mut StageContext, sampler: Sampler) -> Result<Option<EngineState>> {
        let state = match &sampler {
            Sampler::Http { engine, .. } => EngineState {
                kept: engine.reused,
                keeps: engine.keeps_engine(),
                fresh_gap: engine.fresh_gap,
                url: engine.url().to_string(),
                canary: engine.canary(),
                after_load: engine.after_load.clone(),
            },
            Sampler::Local(_) => return Ok(None),
        };
        if let Some(slept) = sampler.finish()? {
            ctx.metric("engine_sleep_s", slept);
        }
        Ok(Some(state))
    }

    /// With `reload`: the load checks of a kept engine, on the model core `model` of this stage's
    /// checkpoint, and what the next stage checks against (the engine's own gap to the model
    /// core, the canary's logprobs in the model core). `samples_gap`: the mean gap over the
    /// stage's samples when it prefilled them; else the probe reply's gap stands for it.
    fn check(&self, ctx: &mut StageContext, model: &DecoderLm, samples_gap: Option<(f64, f32)>) -> Result<()> {
        if !self.keeps {
            return Ok(());
        }
        let instance = ctx.instance.clone();
        let core_of = |c: &http::Canary| -> Result<Vec<f32>> {
            Ok(model::prefill_completion(model, &c.prompt, &c.reply.tokens, &c.sampling, 0)
                .with_context(|| format!("stage `{instance}`: prefill of the engine's probe reply"))?
                .logprobs)
        };
        let mut probe_gap = None;
        if let Some(c) = &self.canary {
            let core = core_of(c)?;
            probe_gap = logprob_gap(&core, &c.reply.logprobs);
            http::note_canary_core(&self.url, &c.reply.tokens, core);
        }
        let Some((mean, max, what)) = samples_gap.map(|(m, x)| (m, x, "its samples")).or(probe_gap.map(|(m, x)| (m, x, "its probe reply"))) else {
            return Ok(());
        };
        if samples_gap.is_none() {
            ctx.metric("engine_probe_logprob_gap_mean", mean);
        }
        if !self.kept {
            http::note_fresh_gap(&self.url, mean);
            return Ok(());
        }
        let limit = kept_gap_limit(self.fresh_gap);
        ctx.metric("engine_logprob_gap_limit", limit);
        if mean > limit {
            http::release_parked();
            bail!(
                "stage `{}`: the engine kept from an earlier stage (param reload) samples with logprobs {mean:.2e} nats (mean over {what}; max {max:.3}) away from this stage's checkpoint in the model core, above the {limit:.2e} allowed ({KEPT_GAP_FACTOR}× the {} it showed when started, within [{KEPT_GAP_FLOOR}, {KEPT_GAP_MAX}]): its load of the checkpoint did not take; the engine is stopped, nothing is cached; set reload = \"none\"",
                ctx.instance,
                self.fresh_gap.map_or("(unmeasured)".to_string(), |g| format!("{g:.2e}"))
            );
        }
        if let Some(a) = &self.after_load {
            let after = core_of(&a.before)?;
            let shift = logprob_gap(&after, a.before.core.as_deref().unwrap_or_default()).map_or(0.0, |(mean, _)| mean);
            ctx.metric("engine_canary_unchanged", a.unchanged);
            ctx.metric("engine_canary_core_shift", shift);
            if a.unchanged && shift > CANARY_SHIFT_MIN {
                http::release_parked();
                bail!(
                    "stage `{}`: the engine kept from an earlier stage (param reload) answered the earlier stage's probe ({} tokens, one seed) after loading this stage's checkpoint exactly as before, to the bit, while the model core says this checkpoint moves those tokens' logprobs by {shift:.2e} nats (mean; its logprob gap over {what}, {mean:.2e}, was within the {limit:.2e} allowed): its load of the checkpoint did not take; the engine is stopped, nothing is cached; set reload = \"none\"",
                    ctx.instance,
                    a.before.reply.tokens.len()
                );
            }
        }
        Ok(())
    }
}

/// Stops the sampler of a stage that keeps no logprobs of its samples (eval, MC continuations).
/// With `reload`, the engine's load is checked against the model core of the checkpoint wired
/// as the sampler's (`load_model`, loaded once the engine is kept, so the two never sample on
/// the device at once): its probe reply's logprobs, and the earlier stage's probe sent again
/// ([`EngineState::check`]).
pub fn finish_engine(ctx: &mut StageContext, sampler: Sampler, load_model: impl FnOnce(&StageContext) -> Result<DecoderLm>) -> Result<()> {
    let Some(state) = EngineState::stop(ctx, sampler)? else { return Ok(()) };
    if state.keeps {
        let model = load_model(ctx)?;
        state.check(ctx, &model, None)?;
    }
    Ok(())
}

/// Stops the sampler and, when an engine sampled `gens` (after `prompts`), gives them entropies
/// as `logprobs.entropies` says: `prefill` loads the policy (`load_policy`) once the engine is
/// stopped (so the two never share the device) and records `engine_logprob_gap_max`, the largest
/// difference between the engine's logprobs and the model core's; the metric `entropies` names
/// the source (`topk-estimate` for estimates). With `reload`, the engine's load is checked as
/// [`finish_engine`] does, on all the samples' gap under `prefill`. The model core's own samples
/// are left as they are.
#[allow(clippy::too_many_arguments)]
pub fn engine_entropies(
    ctx: &mut StageContext,
    sampler: Sampler,
    load_policy: impl FnOnce(&StageContext) -> Result<DecoderLm>,
    prompts: &[&[i64]],
    gens: &mut [Generation],
    p: &SamplerParams,
    logprobs: EngineLogprobs,
    name: impl Fn(usize) -> String,
) -> Result<()> {
    let Some(state) = EngineState::stop(ctx, sampler)? else { return Ok(()) };
    let sampling = &p.sampling();
    let model = if logprobs.entropies == Entropies::Prefill || state.keeps { Some(load_policy(ctx)?) } else { None };
    let mut samples_gap = None;
    match logprobs.entropies {
        Entropies::Prefill => {
            let model = model.as_ref().context("the model core for the prefill")?;
            let mut gap = 0f32;
            let (mut gap_sum, mut tokens) = (0f64, 0usize);
            let mut progress = ctx.progress(gens.len() as u64, "entropies (prefill)");
            for (i, (prompt, g)) in prompts.iter().zip(gens.iter_mut()).enumerate() {
                let f = model::prefill_completion(model, prompt, &g.tokens, sampling, 0)
                    .with_context(|| format!("stage `{}`: prefill of {}", ctx.instance, name(i)))?;
                for d in f.logprobs.iter().zip(&g.logprobs).map(|(a, b)| (a - b).abs()) {
                    gap = gap.max(d);
                    gap_sum += d as f64;
                    tokens += 1;
                }
                g.entropies = f.entropies;
                progress.set(i as u64 + 1, "entropies (prefill)");
            }
            progress.finish();
            ctx.metric("entropies", "prefill");
            ctx.metric("engine_logprob_gap_max", gap as f64);
            let mean = gap_sum / tokens.max(1) as f64;
            ctx.metric("engine_logprob_gap_mean", mean);
            samples_gap = Some((mean, gap));
        }
        Entropies::Topk => {
            if logprobs.top_logprobs == 0 {
                bail!("stage `{}`: entropies = \"topk\" needs top_logprobs > 0", ctx.instance);
            }
            ctx.metric("entropies", "topk-estimate");
        }
        Entropies::None => {
            for g in gens.iter_mut() {
                g.entropies = vec![f32::NAN; g.tokens.len()];
            }
            ctx.metric("entropies", "none");
        }
    }
    match &model {
        Some(model) => state.check(ctx, model, samples_gap),
        None => Ok(()),
    }
}

/// The first `limit` prompts (0 = all) of window `batch_index`, wrapping around the set (one
/// window per training step).
pub fn window(prompts: Vec<PromptRow>, limit: usize, batch_index: usize) -> Vec<PromptRow> {
    if limit == 0 || prompts.is_empty() {
        return prompts;
    }
    let start = (batch_index * limit) % prompts.len();
    prompts.iter().cycle().skip(start).take(limit.min(prompts.len())).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Params that sample nothing (no token, a stop in every text) or that no sampler takes are
    /// refused naming the param, for every sampling stage (they share these params).
    #[test]
    fn sampler_params_that_sample_nothing_are_refused_naming_the_param() {
        for kind in ["rollout", "eval", "score_mc", "reset_random"] {
            let shipped = crate::stages::tests::shipped_params(kind);
            let read = |edit: (&str, serde_json::Value)| {
                let mut p = shipped.clone();
                p.insert(edit.0.into(), edit.1);
                serde_json::from_value::<SamplerParams>(serde_json::Value::Object(p)).unwrap().check()
            };
            assert!(read(("seed", 1.into())).is_ok(), "{kind}: shipped params");
            for (edit, says) in [
                (("max_new_tokens", 0.into()), "max_new_tokens = 0"),
                (("stop_strings", serde_json::json!(["</answer>", ""])), "stop_strings[1] is empty"),
                (("top_p", 1.5.into()), "top_p 1.5 is outside (0, 1]"),
                (("temperature", (-0.5).into()), "temperature -0.5"),
                (("top_k", (-1).into()), "top_k -1 is negative"),
            ] {
                let e = read(edit.clone()).unwrap_err().to_string();
                assert!(e.contains(says), "{kind} {edit:?}: {e}");
            }
        }
    }

    /// A byte-level BPE trained on the default world's (thinking) solutions, as the quickstart's.
    fn tokenizer() -> Tokenizer {
        let texts: Vec<String> = (0..50)
            .map(|i| format!("<think>\nStart with {i}.\nAdd 3: {i} + 3 = {}\n</think>\nThe answer is {}.", i + 3, i + 3))
            .collect();
        Tokenizer::trained_on(&texts)
    }

    #[test]
    fn a_thinking_answer_is_read_only_after_the_end_of_thinking() {
        let tok = tokenizer();
        let te = tok.think_end_id.expect("the world's tokenizer has </think>");
        let ids = tok.encode("<think>\nStart with 5.\nAdd 3: 5 + 3 = 8\n</think>\nThe answer is 8.<|im_end|>").unwrap();
        let text = tok.decode(&ids, true).unwrap();
        let a = split_answer(&tok, Thinking::Auto, "8", &ids, &text, false).unwrap();
        let c = a.cot_end.unwrap();
        assert_eq!(ids[c - 1], te, "cot_end is the index after </think>");
        assert!(a.verdict.correct && a.verdict.extracted.as_deref() == Some("8"));
        // The same thinking without its end: no answer, although "= 8" is in it.
        let open = tok.encode("<think>\nStart with 5.\nAdd 3: 5 + 3 = 8\n").unwrap();
        let a = split_answer(&tok, Thinking::On, "8", &open, &tok.decode(&open, true).unwrap(), false).unwrap();
        assert_eq!((a.cot_end, a.verdict.extracted, a.verdict.correct), (None, None, false));
        // The answer after the end of thinking is what counts, not a number inside it.
        let wrong = tok.encode("<think>\nAdd 3: 5 + 3 = 8\n</think>\nThe answer is 9.").unwrap();
        assert!(!split_answer(&tok, Thinking::Auto, "8", &wrong, &tok.decode(&wrong, true).unwrap(), false).unwrap().verdict.correct);
    }

    #[test]
    fn without_thinking_the_chain_of_thought_ends_at_the_answer_sentence() {
        let tok = tokenizer();
        let ids = tok.encode("Start with 5.\nAdd 3: 5 + 3 = 8\nThe answer is 8.").unwrap();
        let text = tok.decode(&ids, true).unwrap();
        let a = split_answer(&tok, Thinking::Off, "8", &ids, &text, false).unwrap();
        let c = a.cot_end.unwrap();
        assert!(a.verdict.correct);
        assert_eq!(tok.decode(&ids[c..], true).unwrap().trim_start(), "The answer is 8.", "the answer line starts at cot_end");
        assert!(tok.decode(&ids[..c], true).unwrap().trim_end().ends_with("= 8"));
        // An answer on the first line leaves an empty chain of thought (0: closed, nothing in it),
        // not a never-ended one; nothing extracted: no answer line, so it never ended (None).
        let first = tok.encode("The answer is 8.").unwrap();
        let a = split_answer(&tok, Thinking::Off, "8", &first, "The answer is 8.", false).unwrap();
        assert_eq!((a.cot_end, a.verdict.correct), (Some(0), true));
        // Reasoning and answer in one line: the chain of thought ends before the answer sentence.
        let one = tok.encode("Add 3: 5 + 3 = 8. The answer is 8.").unwrap();
        let a = split_answer(&tok, Thinking::Off, "8", &one, &tok.decode(&one, true).unwrap(), false).unwrap();
        let c = a.cot_end.unwrap();
        assert_eq!(tok.decode(&one[c..], true).unwrap().trim_start(), "The answer is 8.");
        assert_eq!(tok.decode(&one[..c], true).unwrap().trim_end(), "Add 3: 5 + 3 = 8.");
        let none = tok.encode("Start with\n").unwrap();
        assert_eq!(split_answer(&tok, Thinking::Off, "8", &none, "Start with\n", false).unwrap().cot_end, None);
        let err = split_answer(&Tokenizer { think_end_id: None, ..tok.clone() }, Thinking::On, "8", &ids, &text, false).unwrap_err().to_string();
        assert!(err.contains("</think>"), "{err}");
    }

    /// A completion cut at its token budget is credited only when it stated its answer: the
    /// number it happened to end on ("10-foot" of the question, in a SmolLM2 rollout cut mid-
    /// sentence) is read by the verifier's fallback, but it is no answer.
    #[test]
    fn a_cut_completion_is_credited_only_for_a_stated_answer() {
        let tok = tokenizer();
        for (text, thinking, credited) in [
            ("Start with 5.\nAdd 3: 5 + 3 = 8", Thinking::Off, false),
            ("Start with 5.\nAdd 3: 5 + 3 = 8\nThe answer is 8.\nStart with", Thinking::Off, true),
            ("<think>\nAdd 3: 5 + 3 = 8\n</think>\nSo 8", Thinking::Auto, false),
            ("<think>\nAdd 3: 5 + 3 = 8\n</think>\nThe answer is 8.", Thinking::Auto, true),
        ] {
            let ids = tok.encode(text).unwrap();
            let decoded = tok.decode(&ids, true).unwrap();
            let whole = split_answer(&tok, thinking, "8", &ids, &decoded, false).unwrap();
            assert!(whole.verdict.correct && !whole.cut_unanswered, "{text:?}: not cut, the verifier's verdict stands");
            let cut = split_answer(&tok, thinking, "8", &ids, &decoded, true).unwrap();
            assert_eq!((cut.verdict.correct, cut.cut_unanswered), (credited, !credited), "{text:?}");
            assert_eq!(cut.verdict.extracted, whole.verdict.extracted, "what was read is still recorded");
        }
    }
}
