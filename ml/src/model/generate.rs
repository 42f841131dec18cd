//! Batched sampling with a preallocated KV cache, as a static batch ([`generate`]) or with
//! continuous batching ([`generate_continuous`]).
//!
//! Static batch: prompts are left-padded into one batch; positions come from the attention mask
//! (as in `transformers`' `generate`), so padded and unpadded rows produce the same tokens.
//! Continuous batching: `slots` rows decode at once, each at its own cache columns and positions
//! (no padding); a finished row's slot takes the next waiting prompt, so a few long completions
//! do not hold the batch. Each row draws its uniforms from its own ChaCha stream seeded by the
//! row's seed, so a row's sample is a deterministic function of (model, prompt, seed, params) and
//! independent of the global torch RNG and of which rows share its batch: both ways give the same
//! tokens (up to float rounding of the batch shape).
//!
//! Host synchronisation: per step the device produces `[B, 4]` numbers (token, logprob, entropy,
//! finite flag); the host reads them back every [`sync_every`] steps (every step on the CPU,
//! where ops are synchronous anyway) to check stop conditions. Uniforms for those steps are
//! uploaded in one copy. Rows that finished between reads run on and their extra tokens are
//! discarded, so the output does not depend on the read interval.
//!
//! `logprobs`/`entropies` are those of the *sampling distribution*: softmax(logits / T) after
//! top-k and top-p filtering. For greedy decoding (`temperature == 0`) they are those of the
//! unmodified model distribution softmax(logits).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::decoder::{DecoderLm, MASKED};
use super::error::{check_finite, rows_finite, ModelError, Result};
use super::head;
use super::layers::{AttnMask, FusedProjections, KvCache};
use super::nucleus;
use super::static_decode::StaticStep;
use super::tokenizer::Tokenizer;

/// Sampling parameters shared by all rows of a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f64,
    /// Nucleus mass in (0, 1]; 1 = off.
    pub top_p: f64,
    /// Keep the k most likely tokens; 0 = off.
    pub top_k: i64,
    pub max_new_tokens: usize,
    /// Generation stops after a token that completes one of these strings (needs a tokenizer).
    pub stop_strings: Vec<String>,
    /// Generation stops after one of these tokens (the tokenizer's EOS ids are added).
    pub stop_token_ids: Vec<i64>,
}

impl SamplingParams {
    /// What makes these params unsampleable, naming the param; `None` when they can be sampled.
    pub fn invalid(&self) -> Option<String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Some(format!("temperature {} is not a finite number >= 0 (0 = greedy)", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Some(format!("top_p {} is outside (0, 1]", self.top_p));
        }
        if self.top_k < 0 {
            return Some(format!("top_k {} is negative (0 = off)", self.top_k));
        }
        // An empty string is in every text: every row would stop at its first token.
        if let Some(i) = self.stop_strings.iter().position(String::is_empty) {
            return Some(format!("stop_strings[{i}] is empty"));
        }
        None
    }
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            max_new_tokens: 256,
            stop_strings: vec![],
            stop_token_ids: vec![],
        }
    }
}

/// Why a row stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// A stop token or stop string.
    Stop,
    /// `max_new_tokens` reached.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// One generated completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Generation {
    /// New tokens, including the stop token if one ended the row.
    pub tokens: Vec<i64>,
    pub logprobs: Vec<f32>,
    pub entropies: Vec<f32>,
    pub finish_reason: FinishReason,
    /// Decoded completion without special tokens, cut before a matched stop string (when a
    /// tokenizer was given).
    pub text: Option<String>,
}

impl Generation {
    /// A row before its first token (or one with no budget): nothing sampled, ended by length.
    fn unsampled() -> Self {
        Generation { tokens: vec![], logprobs: vec![], entropies: vec![], finish_reason: FinishReason::Length, text: None }
    }
}

/// Log-probabilities `[.., V]` (float32) of the sampling distribution over `logits: [.., V]` (any
/// float dtype): softmax of logits / T after top-k and top-p filtering (filtered tokens get
/// -inf); for greedy decoding (`temperature == 0`) those of the unmodified distribution. The
/// flag says whether some may be -inf for finite logits (filtered tokens, or logits / T
/// overflowing), which [`entropy_of`] must not multiply by their zero probability.
/// The plain distribution (greedy, or T = 1 without filters) is one log-softmax straight from
/// the logits: at batch 256 with a 152k vocabulary each float32 pass over `[B, V]` moves 156 MB,
/// more than one layer's bf16 weights of the 1.5B model (94 MB).
fn sampling_logp(logits: &Tensor, p: &SamplingParams) -> (Tensor, bool) {
    let v = *logits.size().last().expect("logits have a vocabulary dimension");
    let top_k = p.top_k > 0 && p.top_k < v;
    if p.temperature <= 0.0 || (p.temperature == 1.0 && !top_k && p.top_p >= 1.0) {
        return (logits.log_softmax(-1, Kind::Float), false);
    }
    // Out-of-place ops only: `to_kind` of float32 logits is the caller's tensor itself.
    let scaled = logits.to_kind(Kind::Float);
    let mut scaled = if p.temperature == 1.0 { scaled } else { scaled / p.temperature };
    if top_k {
        let (vals, _) = scaled.topk(p.top_k, -1, true, true);
        let kth = vals.narrow(-1, p.top_k - 1, 1);
        scaled = scaled.masked_fill(&scaled.lt_tensor(&kth), f64::NEG_INFINITY);
    }
    if p.top_p < 1.0 {
        scaled = scaled.masked_fill(&nucleus::top_p_drop(&scaled, p.top_p), f64::NEG_INFINITY);
    }
    (scaled.log_softmax(-1, Kind::Float), true)
}

/// Entropy of each distribution of `logp: [.., V]` (its last dimension), given its
/// probabilities `probs` (`logp.exp()`) where already at hand; `may_be_inf` from
/// [`sampling_logp`]. Where no log-probability of a finite row is -inf the clamp is left out: it
/// would change nothing.
fn entropy_of(logp: &Tensor, probs: Option<&Tensor>, may_be_inf: bool) -> Tensor {
    let exp;
    let probs = match probs {
        Some(p) => p,
        None => {
            exp = logp.exp();
            &exp
        }
    };
    let terms = if may_be_inf { probs * logp.clamp_min(MASKED) } else { probs * logp };
    -terms.sum_dim_intlist(-1, false, Kind::Float)
}

/// Samples the next token of every row from `logits: [B, V]` (any float dtype, computed in
/// float32); `uniforms: [B]`. Returns `(tokens [B], logprobs [B], entropies [B], finite [B])`.
/// A row whose logits are not all finite gets some valid token id (never an index out of the
/// vocabulary) and `finite` false, which fails its request.
fn sample_step(
    logits: &Tensor,
    p: &SamplingParams,
    uniforms: &Tensor,
) -> (Tensor, Tensor, Tensor, Tensor) {
    let finite = rows_finite(logits);
    let (logp, may_be_inf) = sampling_logp(logits, p);
    let (token, probs) = if p.temperature <= 0.0 {
        (logits.argmax(-1, false), None)
    } else {
        let probs = logp.exp();
        let token = if logits.device().is_cuda() && logits.size()[0] > 1 {
            inverse_cdf_chunked(&probs, uniforms, CDF_CHUNK)
        } else {
            inverse_cdf(&probs, uniforms)
        };
        (token, Some(probs))
    };
    let chosen = logp.gather(-1, &token.unsqueeze(-1), false).squeeze_dim(-1);
    let entropy = entropy_of(&logp, probs.as_ref(), may_be_inf);
    (token, chosen, entropy, finite)
}

/// Inverse-CDF sampling: per row of `probs: [B, V]`, the first token whose cumulative
/// probability reaches the row's uniform `u: [B]`. The clamp guards the cdf's last value falling
/// a rounding error below u.
pub fn inverse_cdf(probs: &Tensor, u: &Tensor) -> Tensor {
    let v = probs.size()[1];
    probs
        .cumsum(-1, Kind::Float)
        .lt_tensor(&u.unsqueeze(-1))
        .sum_dim_intlist(-1, false, Kind::Int64)
        .clamp_max(v - 1)
}

/// Vocabulary chunk of [`inverse_cdf_chunked`].
const CDF_CHUNK: i64 = 1024;

/// [`inverse_cdf`] in two levels: the cumulative mass of `chunk`-token chunks picks the chunk,
/// a cumsum within it the token. The same distribution; the choice differs from the one-level
/// cdf only where `u` falls within a rounding error of a cdf step. Why: PyTorch's CUDA scan of
/// many long rows runs each row through one block; on [256, 151936] the one-level sampler took
/// 0.62 ms on an H200, this one 0.28 ms (b64: 0.34 vs 0.14; bench/results/gpu.json `sampler_ms_*`).
/// A single row keeps PyTorch's one-row scan (0.05 vs 0.20 ms), and the CPU the one-level scan,
/// a sequential loop either way (its results unchanged).
pub fn inverse_cdf_chunked(probs: &Tensor, u: &Tensor, chunk: i64) -> Tensor {
    let (b, v, dev) = (probs.size()[0], probs.size()[1], probs.device());
    let (whole, n) = (v / chunk, (v + chunk - 1) / chunk);
    // Each chunk's mass: the whole chunks through a view of the rows, the part-chunk at the end
    // apart (a padded copy of `probs` cost one more pass over [B, V]).
    let mut parts = Vec::with_capacity(2);
    if whole > 0 {
        parts.push(probs.narrow(1, 0, whole * chunk).view([b, whole, chunk]).sum_dim_intlist(-1, false, Kind::Float));
    }
    if n > whole {
        parts.push(probs.narrow(1, whole * chunk, v - whole * chunk).sum_dim_intlist(-1, true, Kind::Float));
    }
    let mass = if parts.len() == 1 { parts.remove(0) } else { Tensor::cat(&parts, 1) };
    let upto = mass.cumsum(-1, Kind::Float);
    let u = u.unsqueeze(-1);
    let c = upto.lt_tensor(&u).sum_dim_intlist(-1, true, Kind::Int64).clamp_max(n - 1);
    // The uniform's remainder after the chunks before `c`.
    let rest = &u - (upto.gather(-1, &c, false) - mass.gather(-1, &c, false));
    // The chosen chunk's probabilities; the columns past the vocabulary (in the last chunk)
    // get 0.
    let idx = &c * chunk + Tensor::arange(chunk, (Kind::Int64, dev)).unsqueeze(0);
    let inside = probs
        .gather(1, &idx.clamp_max(v - 1), false)
        .masked_fill(&idx.ge(v), 0.0);
    let j = inside
        .cumsum(-1, Kind::Float)
        .lt_tensor(&rest)
        .sum_dim_intlist(-1, false, Kind::Int64)
        .clamp_max(chunk - 1);
    (c.squeeze_dim(-1) * chunk + j).clamp_max(v - 1)
}

/// A finished completion scored by one prefill: per completion token, its logprob and the entropy
/// of the sampling distribution it was drawn from (as [`generate`] records them), and the `top`
/// most likely tokens of that distribution with their logprobs (filtered tokens left out).
#[derive(Debug, Clone, PartialEq)]
pub struct Prefilled {
    pub logprobs: Vec<f32>,
    pub entropies: Vec<f32>,
    pub top: Vec<Vec<(i64, f32)>>,
}

/// Scores `completion` after `prompt` under the sampling distribution of `p` in one forward pass
/// (the exact entropies of a completion sampled elsewhere, e.g. by an inference engine).
pub fn prefill_completion(
    model: &DecoderLm,
    prompt: &[i64],
    completion: &[i64],
    p: &SamplingParams,
    top: usize,
) -> Result<Prefilled> {
    if prompt.is_empty() {
        return Err(ModelError::Request("empty prompt".into()));
    }
    if completion.is_empty() {
        return Ok(Prefilled { logprobs: vec![], entropies: vec![], top: vec![] });
    }
    model.check_ids(prompt, 0, completion.len())?;
    model.check_ids(completion, 0, prompt.len())?;
    let dev = model.device();
    let ids: Vec<i64> = prompt.iter().chain(completion).copied().collect();
    let len = ids.len() as i64;
    let c = completion.len() as i64;
    tch::no_grad(|| {
        let input = Tensor::from_slice(&ids).view([1, len]).to_device(dev);
        let pos = Tensor::arange(len, (Kind::Int64, dev)).view([1, len]);
        let h = model.hidden(&input, &pos, &AttnMask::Causal, None).narrow(1, len - c - 1, c).squeeze_dim(0);
        let target = Tensor::from_slice(completion).to_device(dev);
        let to_vec = |t: Tensor| Vec::<f32>::try_from(t.to_device(Device::Cpu).view([-1]))
            .map_err(|e| ModelError::Request(format!("reading prefill logprobs: {e}")));
        let k = (top as i64).min(model.cfg.vocab_size);
        let (mut chosen, mut entropy, mut top_rows) = (Vec::new(), Vec::new(), Vec::with_capacity(completion.len()));
        // The LM head in pieces of positions (super::head): a long completion's [c, V] logits,
        // their log-probabilities and probabilities never exist at once.
        for (s, n) in head::row_pieces(model, c) {
            let logits = model.logits(&h.narrow(0, s, n)).to_kind(Kind::Float);
            check_finite(&logits, 0)?;
            let (logp, may_be_inf) = sampling_logp(&logits, p);
            chosen.extend(to_vec(logp.gather(-1, &target.narrow(0, s, n).unsqueeze(-1), false))?);
            entropy.extend(to_vec(entropy_of(&logp, None, may_be_inf))?);
            if k > 0 {
                let (vals, idx) = logp.topk(k, -1, true, true);
                let vals = to_vec(vals)?;
                let idx = Vec::<i64>::try_from(idx.to_device(Device::Cpu).view([-1]))
                    .map_err(|e| ModelError::Request(format!("reading prefill top tokens: {e}")))?;
                for i in 0..n as usize {
                    let at = i * k as usize;
                    top_rows.push((at..at + k as usize).filter(|&j| vals[j].is_finite()).map(|j| (idx[j], vals[j])).collect());
                }
            } else {
                top_rows.extend((0..n).map(|_| Vec::new()));
            }
        }
        Ok(Prefilled { logprobs: chosen, entropies: entropy, top: top_rows })
    })
}

/// Steps between host reads of the sampled tokens on `dev`: a read waits for the device queue,
/// so CUDA reads every 16 steps; CPU ops are synchronous, so there every step (stops earliest).
pub fn sync_every(dev: Device) -> usize {
    match dev {
        Device::Cpu => 1,
        _ => 16,
    }
}

/// Checks a request; `Some` is the answer of an empty one (no prompts or no new tokens).
fn check_request(
    model: &DecoderLm,
    tokenizer: Option<&Tokenizer>,
    prompts: &[Vec<i64>],
    seeds: &[u64],
    p: &SamplingParams,
) -> Result<Option<Vec<Generation>>> {
    check_rows(model, tokenizer, prompts, seeds, p, &vec![p.max_new_tokens; prompts.len()])
}

/// [`check_request`] with each row's own token budget (`limits`, one per prompt): every prompt
/// and its budget must fit the context; `Some` when no row has a token to sample.
fn check_rows(
    model: &DecoderLm,
    tokenizer: Option<&Tokenizer>,
    prompts: &[Vec<i64>],
    seeds: &[u64],
    p: &SamplingParams,
    limits: &[usize],
) -> Result<Option<Vec<Generation>>> {
    if prompts.len() != seeds.len() {
        return Err(ModelError::Request(format!(
            "{} prompts but {} seeds",
            prompts.len(),
            seeds.len()
        )));
    }
    check_params(tokenizer, p)?;
    if limits.iter().all(|&l| l == 0) {
        return Ok(Some(
            prompts
                .iter()
                .map(|_| Generation { text: tokenizer.map(|_| String::new()), ..Generation::unsampled() })
                .collect(),
        ));
    }
    for (row, pr) in prompts.iter().enumerate() {
        check_row(model, row, pr, limits[row])?;
    }
    Ok(None)
}

/// The sampling params a request may have: temperature, top-p, top-k, stop strings (which need
/// a tokenizer).
fn check_params(tokenizer: Option<&Tokenizer>, p: &SamplingParams) -> Result<()> {
    if let Some(why) = p.invalid() {
        return Err(ModelError::Request(format!("invalid sampling params: {why}")));
    }
    check_stop_strings(tokenizer, &p.stop_strings)
}

/// Stop strings are matched in decoded text: they need a tokenizer.
fn check_stop_strings(tokenizer: Option<&Tokenizer>, strings: &[String]) -> Result<()> {
    if !strings.is_empty() && tokenizer.is_none() {
        return Err(ModelError::Request("stop strings need a tokenizer".into()));
    }
    Ok(())
}

/// Row `row`'s prompt: not empty, ids in the vocabulary, and with `limit` new tokens within the
/// context.
fn check_row(model: &DecoderLm, row: usize, prompt: &[i64], limit: usize) -> Result<()> {
    if prompt.is_empty() {
        return Err(ModelError::Request(format!("row {row}: empty prompt")));
    }
    model.check_ids(prompt, row, limit)
}

/// How far a request is: reported after each read-back of sampled tokens (every step on the
/// CPU, every [`sync_every`] steps on a GPU), so a stage can show a progress bar while one batch
/// of long completions decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Rows finished (a stop, or their token budget).
    pub rows_done: usize,
    /// Tokens sampled so far, over all rows.
    pub tokens: usize,
}

/// Called with each [`Progress`] of a request.
pub type OnProgress<'a> = &'a mut dyn FnMut(Progress);

/// What ends a row before its budget: a stop token (its own ids and the tokenizer's EOS ids) or
/// a stop string completed by its last token.
#[derive(Debug, Clone, PartialEq)]
pub struct StopRules {
    ids: Vec<i64>,
    strings: Vec<String>,
    /// The longest stop string, in characters: how far back a new token can complete one.
    max_chars: usize,
}

impl StopRules {
    /// The rules of `strings` and `token_ids`, with the EOS ids of `tokenizer`.
    pub fn new(tokenizer: Option<&Tokenizer>, strings: &[String], token_ids: &[i64]) -> Self {
        let mut ids = token_ids.to_vec();
        if let Some(t) = tokenizer {
            ids.extend(&t.eos_ids);
        }
        let max_chars = strings.iter().map(|s| s.chars().count()).max().unwrap_or(0);
        StopRules { ids, strings: strings.to_vec(), max_chars }
    }

    /// The rules of a request's params.
    fn of(tokenizer: Option<&Tokenizer>, p: &SamplingParams) -> Self {
        StopRules::new(tokenizer, &p.stop_strings, &p.stop_token_ids)
    }
}

/// The host side of a request: the completions so far and each row's stop rules.
struct Completions<'a> {
    tokenizer: Option<&'a Tokenizer>,
    p: &'a SamplingParams,
    /// The rules of the request's params, which a row takes unless it brings its own.
    stops: StopRules,
    /// Each row's rules, where it brought its own ([`FedRow::stops`]).
    row_stops: Vec<Option<StopRules>>,
    /// Each row's token budget (`max_new_tokens`, or less where the context leaves less:
    /// [`generate_continuous_within_context`]).
    limits: Vec<usize>,
    out: Vec<Generation>,
    progress: Progress,
    on_progress: Option<OnProgress<'a>>,
}

impl<'a> Completions<'a> {
    fn new(tokenizer: Option<&'a Tokenizer>, p: &'a SamplingParams, rows: usize) -> Self {
        let mut c = Completions {
            tokenizer,
            p,
            stops: StopRules::of(tokenizer, p),
            row_stops: Vec::with_capacity(rows),
            limits: Vec::with_capacity(rows),
            out: Vec::with_capacity(rows),
            progress: Progress { rows_done: 0, tokens: 0 },
            on_progress: None,
        };
        for _ in 0..rows {
            c.add_row(p.max_new_tokens, None);
        }
        c
    }

    /// Row `row`'s stop rules.
    fn stops_of(&self, row: usize) -> &StopRules {
        self.row_stops[row].as_ref().unwrap_or(&self.stops)
    }

    fn observed(mut self, on_progress: Option<OnProgress<'a>>) -> Self {
        self.on_progress = on_progress;
        self
    }

    /// Tells the observer how far the request is (after a chunk of steps was read back).
    fn report(&mut self) {
        if let Some(f) = self.on_progress.as_mut() {
            f(self.progress);
        }
    }

    /// [`Self::push_token`], counted in the request's progress.
    fn push(&mut self, row: usize, r: &[f64]) -> Result<bool> {
        let finished = self.push_token(row, r)?;
        self.progress.tokens += 1;
        self.progress.rows_done += finished as usize;
        Ok(finished)
    }

    /// Records `row`'s next sampled token (`r` = token, logprob, entropy, finite flag); true
    /// when the row is finished (a stop token or string, or `max_new_tokens` reached).
    fn push_token(&mut self, row: usize, r: &[f64]) -> Result<bool> {
        let g = &mut self.out[row];
        if r[3] == 0.0 {
            return Err(ModelError::NonFinite {
                row,
                step: g.tokens.len(),
            });
        }
        let t = r[0] as i64;
        g.tokens.push(t);
        g.logprobs.push(r[1] as f32);
        g.entropies.push(r[2] as f32);
        let stopped = self.stopped(row, t)?;
        if stopped {
            self.out[row].finish_reason = FinishReason::Stop;
        }
        Ok(stopped || self.out[row].tokens.len() >= self.limits[row])
    }

    /// Whether row `row`'s last token `t` is a stop token or completes a stop string.
    fn stopped(&self, row: usize, t: i64) -> Result<bool> {
        let stops = self.stops_of(row);
        if stops.ids.contains(&t) {
            return Ok(true);
        }
        let (Some(tk), false) = (self.tokenizer, stops.strings.is_empty()) else { return Ok(false) };
        let tokens = &self.out[row].tokens;
        let text = tk.decode(&tokens[tokens.len().saturating_sub(stops.max_chars + 8)..], false)?;
        Ok(stops.strings.iter().any(|s| text.contains(s.as_str())))
    }

    /// The completions, with their text decoded and cut before a matched stop string.
    fn finish(mut self) -> Result<Vec<Generation>> {
        for row in 0..self.out.len() {
            self.decode_text(row)?;
        }
        Ok(self.out)
    }

    /// Row `row`'s text (with a tokenizer): decoded, cut before a matched stop string.
    fn decode_text(&mut self, row: usize) -> Result<()> {
        if let Some(tk) = self.tokenizer {
            let mut text = tk.decode(&self.out[row].tokens, true)?;
            if let Some(cut) = self.stops_of(row).strings.iter().filter_map(|s| text.find(s.as_str())).min() {
                text.truncate(cut);
            }
            self.out[row].text = Some(text);
        }
        Ok(())
    }

    /// A new row with token budget `limit` and its own stop rules (`None`: the request's); its
    /// index.
    fn add_row(&mut self, limit: usize, stops: Option<StopRules>) -> usize {
        self.out.push(Generation::unsampled());
        self.limits.push(limit);
        self.row_stops.push(stops);
        self.out.len() - 1
    }

    /// Finished row `row`'s completion, with its text; the row keeps an empty one.
    fn take(&mut self, row: usize) -> Result<Generation> {
        self.decode_text(row)?;
        Ok(std::mem::replace(&mut self.out[row], Generation::unsampled()))
    }
}

/// `[steps, rows]` uniforms on `dev`, one upload: step-major, each row's from its own stream
/// (`None`: an idle slot, which gets 0.5).
fn uniforms(rngs: &mut [Option<&mut ChaCha8Rng>], steps: usize, dev: Device) -> Tensor {
    let mut u = Vec::with_capacity(steps * rngs.len());
    for _ in 0..steps {
        u.extend(
            rngs.iter_mut()
                .map(|r| r.as_mut().map_or(0.5, |r| r.random::<f64>())),
        );
    }
    Tensor::from_slice(&u)
        .view([steps as i64, rngs.len() as i64])
        .to_kind(Kind::Float)
        .to_device(dev)
}

/// One step's `[B, 4]` (token, logprob, entropy, finite) as float64, and the tokens `[B]`.
pub(super) fn sample_record(logits: &Tensor, p: &SamplingParams, u: &Tensor) -> (Tensor, Tensor) {
    let (tok, lp, ent, finite) = sample_step(logits, p, u);
    let rec = Tensor::stack(
        &[
            tok.to_kind(Kind::Double),
            lp.to_kind(Kind::Double),
            ent.to_kind(Kind::Double),
            finite.to_kind(Kind::Double),
        ],
        1,
    );
    (rec, tok)
}

/// Reads back `[steps, B, 4]` records (the one host synchronisation of a chunk).
fn read_back(records: &[Tensor]) -> Result<Vec<f64>> {
    let host = Tensor::stack(records, 0).to_device(Device::Cpu);
    Vec::<f64>::try_from(host.view([-1]))
        .map_err(|e| ModelError::Request(format!("reading sampled tokens: {e}")))
}

/// Feeds a chunk of `[B, 4]` records (read back in one synchronisation) to the rows not yet
/// finished; true when every row is.
fn absorb(records: &[Tensor], rows: &mut Completions, done: &mut [bool]) -> Result<bool> {
    let host = read_back(records)?;
    let n_rows = done.len();
    for j in 0..records.len() {
        for (row, finished) in done.iter_mut().enumerate() {
            if !*finished {
                let at = (j * n_rows + row) * 4;
                *finished = rows.push(row, &host[at..at + 4])?;
            }
        }
    }
    rows.report();
    Ok(done.iter().all(|&d| d))
}

/// How a static batch (after its prefill) or continuous batching's slots run their decode steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Steps {
    /// Each step as its own ops, reading the cache as far as it is filled (the CPU's path).
    Eager,
    /// [`super::static_decode::StaticStep`]s, captured as a CUDA graph after a warm-up where
    /// this build can (`graph`), else run as they are.
    Static { graph: bool },
}

/// The decode steps on `dev`: the eager steps, or with
/// `RREDCOT_DECODE_GRAPHS=1` a CUDA graph where this build has the capture
/// (`RREDCOT_CUDA_GRAPHS=1` at build time, see ml/build.rs). Opt-in until it has run on a GPU.
fn steps_on(dev: Device) -> Steps {
    let on = std::env::var("RREDCOT_DECODE_GRAPHS").is_ok_and(|v| v == "1");
    if dev.is_cuda() && super::cuda_graph::AVAILABLE && on {
        Steps::Static { graph: true }
    } else {
        Steps::Eager
    }
}

/// Generates completions for `prompts` (token ids), one seed per row, as one static batch.
pub fn generate(
    model: &DecoderLm,
    tokenizer: Option<&Tokenizer>,
    prompts: &[Vec<i64>],
    seeds: &[u64],
    p: &SamplingParams,
) -> Result<Vec<Generation>> {
    generate_with_progress(model, tokenizer, prompts, seeds, p, None)
}

/// [`generate`], telling `on_progress` how far it is after each read-back of sampled tokens.
pub fn generate_with_progress<'a>(
    model: &DecoderLm,
    tokenizer: Option<&'a Tokenizer>,
    prompts: &[Vec<i64>],
    seeds: &[u64],
    p: &'a SamplingParams,
    on_progress: Option<OnProgress<'a>>,
) -> Result<Vec<Generation>> {
    let rows = Completions::new(tokenizer, p, prompts.len()).observed(on_progress);
    generate_static(
        model,
        rows,
        prompts,
        seeds,
        sync_every(model.device()),
        steps_on(model.device()),
    )
}

/// [`generate`] into `rows` (the request's completions, tokenizer and params), reading the
/// sampled tokens back every `every` steps.
fn generate_static(
    model: &DecoderLm,
    mut rows: Completions,
    prompts: &[Vec<i64>],
    seeds: &[u64],
    every: usize,
    steps: Steps,
) -> Result<Vec<Generation>> {
    let (tokenizer, p) = (rows.tokenizer, rows.p);
    if let Some(empty) = check_request(model, tokenizer, prompts, seeds, p)? {
        return Ok(empty);
    }
    let pad_id = tokenizer.map_or(0, |t| t.pad_id);
    let dev = model.device();
    let b = prompts.len() as i64;
    let plen = prompts.iter().map(Vec::len).max().unwrap_or(0) as i64;
    let padded = prompts.iter().any(|x| x.len() as i64 != plen);
    let mut ids = Vec::with_capacity((b * plen) as usize);
    let mut mask = Vec::with_capacity((b * plen) as usize);
    for pr in prompts {
        let pad = plen as usize - pr.len();
        ids.extend(std::iter::repeat_n(pad_id, pad).chain(pr.iter().copied()));
        mask.extend(std::iter::repeat_n(0i64, pad).chain(std::iter::repeat_n(1, pr.len())));
    }
    let ids = Tensor::from_slice(&ids).view([b, plen]).to_device(dev);
    let key_mask = Tensor::from_slice(&mask).view([b, plen]).to_device(dev);
    let mut rngs: Vec<ChaCha8Rng> = seeds
        .iter()
        .map(|&s| ChaCha8Rng::seed_from_u64(s))
        .collect();
    let mut done = vec![false; prompts.len()];
    let max_new = p.max_new_tokens;

    tch::no_grad(|| -> Result<()> {
        let fused = model.decode_projections();
        let mut cache = model.new_cache(b, plen + max_new as i64);
        let positions = (key_mask.cumsum(-1, Kind::Int64) - 1).clamp_min(0);
        let prefill_mask = if padded {
            AttnMask::Bias(crate::model::decoder::causal_bias(
                b,
                plen,
                0,
                Some(&key_mask),
                model.kind(),
                dev,
            ))
        } else {
            AttnMask::Causal
        };
        count_prefilled(b * plen);
        let h = model.hidden(&ids, &positions, &prefill_mask, Some(&mut cache));
        let mut logits = model.logits(&h.narrow(1, plen - 1, 1).squeeze_dim(1));
        let mut next_pos = positions.narrow(1, plen - 1, 1) + 1;
        // Padding bias over every column the cache will hold, made once: the prompt's padding
        // is hidden, new keys are always visible. Each step reads a prefix of it.
        let bias = padded.then(|| {
            let pad_bias = Tensor::zeros([b, 1, 1, plen], (model.kind(), dev))
                .masked_fill(&key_mask.eq(0).view([b, 1, 1, plen]), MASKED);
            let fresh = Tensor::zeros([b, 1, 1, max_new as i64], (model.kind(), dev));
            Tensor::cat(&[&pad_bias, &fresh], -1)
        });
        if let Steps::Static { graph } = steps {
            let mut step = StaticStep::new(model, fused, p, cache, logits, &next_pos, plen, bias);
            let mut runner = super::cuda_graph::Runner::new(graph)?;
            decode_chunks(&mut rngs, &mut rows, &mut done, max_new, every, dev, |u, _| {
                step.set_uniforms(u);
                runner.step(|| step.run())
            })?;
            return runner.finish();
        }
        decode_chunks(&mut rngs, &mut rows, &mut done, max_new, every, dev, |u, last| {
            let (rec, tok) = sample_record(&logits, p, u);
            if !last {
                let mask = match &bias {
                    Some(bias) => AttnMask::Bias(bias.narrow(3, 0, cache.len() + 1)),
                    None => AttnMask::Full,
                };
                let h = model.hidden_decode(&tok.unsqueeze(-1), &next_pos, &mask, Some(&mut cache), fused.as_deref());
                logits = model.logits(&h.squeeze_dim(1));
                next_pos += 1;
            }
            Ok(rec)
        })
    })?;
    rows.finish()
}

/// A static batch's decode loop around `step` (this step's uniforms `[B]`, whether it is the
/// last; returns its `[B, 4]` record): uniforms drawn `every` steps at once, the records read
/// back then ([`absorb`]), until every row is finished or `max_new` steps ran. The fixed-shape
/// steps ([`StaticStep`]) come through a [`super::cuda_graph::Runner`], which replays a graph.
#[allow(clippy::too_many_arguments)]
fn decode_chunks(
    rngs: &mut [ChaCha8Rng],
    rows: &mut Completions,
    done: &mut [bool],
    max_new: usize,
    every: usize,
    dev: Device,
    mut step: impl FnMut(&Tensor, bool) -> Result<Tensor>,
) -> Result<()> {
    let mut taken = 0;
    while taken < max_new {
        let n = every.min(max_new - taken);
        let mut streams: Vec<Option<&mut ChaCha8Rng>> = rngs.iter_mut().map(Some).collect();
        let u = uniforms(&mut streams, n, dev);
        let mut records = Vec::with_capacity(n);
        for j in 0..n {
            records.push(step(&u.get(j as i64), taken + j + 1 == max_new)?);
        }
        taken += n;
        if absorb(&records, rows, done)? {
            break;
        }
    }
    Ok(())
}

/// How many distinct prompts [`HeldPrompts`] remembers: enough for requests of one prompt that
/// reach a server a few places apart (clients in flight finish out of order), bounded because
/// each keeps a `[1, V]` logits row.
const PROMPTS_HELD: usize = 8;

/// The prompts that slots hold in their first cache columns (which decoding never rewrites: a
/// row writes from its prompt's end on, a freed slot at the column it stopped at), each with the
/// slots that hold it and its last logits `[1, V]`, most recent last. The samples of one prompt
/// come one after another, or, through a server, a few requests apart: each after the first
/// copies a slot that holds it instead of running the prefill again.
#[derive(Default)]
pub(super) struct HeldPrompts {
    held: Vec<Held>,
}

struct Held {
    prompt: Vec<i64>,
    slots: Vec<usize>,
    logits: Tensor,
}

impl HeldPrompts {
    /// Slot `s` is about to be overwritten: it holds none of the prompts any more (a prompt no
    /// slot holds is forgotten).
    fn vacate(&mut self, s: usize) {
        for h in &mut self.held {
            h.slots.retain(|&t| t != s);
        }
        self.held.retain(|h| !h.slots.is_empty());
    }

    /// Slot `s` now holds `prompt` (a new entry with its `logits`, or one more slot for a prompt
    /// held already), which becomes the most recent.
    fn hold(&mut self, prompt: &[i64], s: usize, logits: impl FnOnce() -> Tensor) {
        let mut h = match self.held.iter().position(|h| h.prompt == prompt) {
            Some(i) => self.held.remove(i),
            None => Held { prompt: prompt.to_vec(), slots: vec![], logits: logits() },
        };
        if !h.slots.contains(&s) {
            h.slots.push(s);
        }
        self.held.push(h);
        if self.held.len() > PROMPTS_HELD {
            self.held.remove(0);
        }
    }
}

/// Fills slot `s` with `prompt` (its cache columns from 0 and its logits row); returns the prompt's
/// length. When a slot holds the same prompt ([`HeldPrompts`]), its columns `0..len` and the
/// prompt's logits are copied instead of prefilled again: the same values, as the prefill of a
/// prompt alone is deterministic, for a copy of its keys and values.
pub(super) fn fill_slot(model: &DecoderLm, prompt: &[i64], s: usize, cache: &mut KvCache, logits: &mut Tensor, held: &mut HeldPrompts) -> i64 {
    let len = prompt.len() as i64;
    if let Some(h) = held.held.iter().find(|h| h.prompt == prompt).filter(|_| share_prefills()) {
        if !h.slots.contains(&s) {
            cache.copy_row_prefix(h.slots[0] as i64, s as i64, len);
        }
        logits.narrow(0, s as i64, 1).copy_(&h.logits);
        // Only now is `s` overwritten: it may have been the one slot that held the prompt.
        let kept = h.logits.shallow_clone();
        held.vacate(s);
        held.hold(prompt, s, || kept);
        return len;
    }
    held.vacate(s);
    let len = prefill_slot(model, prompt, s, cache, logits);
    held.hold(prompt, s, || logits.narrow(0, s as i64, 1).copy());
    len
}

/// Whether a prompt's samples share its prefill: on unless `RREDCOT_SHARE_PREFILL=0` (each row
/// prefilled alone, the code before: the baseline of bench/prefill_share.sh).
fn share_prefills() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("RREDCOT_SHARE_PREFILL").map_or(true, |v| v != "0"))
}

#[cfg(test)]
thread_local! {
    /// Prompts prefilled on this thread (tests count them).
    static PREFILLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

thread_local! {
    /// Prompt positions run through the model on this thread by the decode loops' prefills
    /// (padding included; a prompt whose prefill is shared counts once): what a stage reports as
    /// its forward cost.
    static PREFILLED_POSITIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Prompt positions prefilled on this thread so far ([`PREFILLED_POSITIONS`]); a caller takes
/// the difference around its generation.
pub fn prefilled_positions() -> u64 {
    PREFILLED_POSITIONS.with(|n| n.get())
}

fn count_prefilled(positions: i64) {
    PREFILLED_POSITIONS.with(|n| n.set(n.get() + positions as u64));
}

/// Prefills `prompt` alone into slot `s` of `cache` (from column 0) and puts its next-token
/// logits in row `s` of `logits`; returns the slot's next column (the prompt length).
pub(super) fn prefill_slot(
    model: &DecoderLm,
    prompt: &[i64],
    s: usize,
    cache: &mut KvCache,
    logits: &mut Tensor,
) -> i64 {
    #[cfg(test)]
    PREFILLS.with(|n| n.set(n.get() + 1));
    let dev = model.device();
    let len = prompt.len() as i64;
    count_prefilled(len);
    let ids = Tensor::from_slice(prompt).view([1, len]).to_device(dev);
    let pos = Tensor::arange(len, (Kind::Int64, dev)).view([1, len]);
    let mut view = cache.row_view(s as i64);
    let h = model.hidden(&ids, &pos, &AttnMask::Causal, Some(&mut view));
    logits
        .narrow(0, s as i64, 1)
        .copy_(&model.logits(&h.narrow(1, len - 1, 1).squeeze_dim(1)));
    len
}

/// Generates completions for `prompts`, one seed per row, decoding at most `slots` rows at a
/// time: when a row finishes, its slot takes the next waiting prompt (prefilled alone into the
/// slot's cache columns). Rows are independent, so each row gets the tokens [`generate`] gives
/// it in any static batch. `slots = 0` means one slot per prompt.
pub fn generate_continuous(
    model: &DecoderLm,
    tokenizer: Option<&Tokenizer>,
    prompts: &[Vec<i64>],
    seeds: &[u64],
    p: &SamplingParams,
    slots: usize,
) -> Result<Vec<Generation>> {
    generate_continuous_with_progress(model, tokenizer, prompts, seeds, p, slots, None)
}

/// [`generate_continuous`], telling `on_progress` how far it is after each read-back of
/// sampled tokens.
pub fn generate_continuous_with_progress<'a>(
    model: &DecoderLm,
    tokenizer: Option<&'a Tokenizer>,
    prompts: &[Vec<i64>],
    seeds: &[u64],
    p: &'a SamplingParams,
    slots: usize,
    on_progress: Option<OnProgress<'a>>,
) -> Result<Vec<Generation>> {
    let rows = Completions::new(tokenizer, p, prompts.len()).observed(on_progress);
    continuous(model, rows, prompts, seeds, slots, sync_every(model.device()), steps_on(model.device()))
}

/// [`generate_continuous_with_progress`] where a prompt too long for `max_new_tokens` more
/// tokens is not an error: each row samples at most what the model's context leaves after its
/// own prompt (none for a prompt that fills it), the others their full `max_new_tokens`. A static
/// batch can only clamp all its rows to its longest prompt; here rows do not share a budget.
pub fn generate_continuous_within_context<'a>(
    model: &DecoderLm,
    tokenizer: Option<&'a Tokenizer>,
    prompts: &[Vec<i64>],
    seeds: &[u64],
    p: &'a SamplingParams,
    slots: usize,
    on_progress: Option<OnProgress<'a>>,
) -> Result<Vec<Generation>> {
    let context = model.cfg.max_position_embeddings as usize;
    let mut rows = Completions::new(tokenizer, p, prompts.len()).observed(on_progress);
    for (limit, pr) in rows.limits.iter_mut().zip(prompts) {
        *limit = p.max_new_tokens.min(context.saturating_sub(pr.len()));
    }
    continuous(model, rows, prompts, seeds, slots, sync_every(model.device()), steps_on(model.device()))
}

/// Continuous batching's slots between read-backs: filled with a prompt, freed, stepped.
trait Slots {
    /// Prefills `prompt` alone into slot `s` (its cache columns from 0); it decodes from the
    /// next step on, sampling from `own`'s distribution if given, else from the session's.
    fn fill(&mut self, s: usize, prompt: &[i64], own: Option<SamplingParams>);
    /// Whether slots may sample from distributions other than the session's.
    fn mixes(&self) -> bool;
    /// Slot `s`'s row finished: the slot decodes nothing until it is filled again.
    fn free(&mut self, s: usize);
    /// `n` steps, step `j` sampling with uniforms `u[j]` (`[slots]`): each step's `[slots, 4]`
    /// record.
    fn steps(&mut self, u: &Tensor, n: usize) -> Result<Vec<Tensor>>;
    /// Done: the device's work is ordered before what the caller does next.
    fn finish(self: Box<Self>) -> Result<()>;
}

/// Slots stepped eagerly (the CPU's path): a step reads the cache only as far as the furthest
/// live slot has written, with a bias made for that width.
struct EagerSlots<'a> {
    model: &'a DecoderLm,
    fused: Option<Vec<FusedProjections>>,
    p: &'a SamplingParams,
    cache: KvCache,
    /// Next-token logits `[slots, V]`.
    logits: Tensor,
    /// Each slot's next cache column, whether it decodes a row, and the distribution its row
    /// samples from where that is not the session's.
    column: Vec<i64>,
    live: Vec<bool>,
    own: Vec<Option<SamplingParams>>,
    held: HeldPrompts,
}

impl<'a> EagerSlots<'a> {
    fn new(model: &'a DecoderLm, fused: Option<Vec<FusedProjections>>, p: &'a SamplingParams, cache: KvCache) -> Self {
        let b = cache.batch();
        EagerSlots {
            model,
            fused,
            p,
            logits: Tensor::zeros([b, model.cfg.vocab_size], (model.kind(), model.device())),
            cache,
            column: vec![0; b as usize],
            live: vec![false; b as usize],
            own: vec![None; b as usize],
            held: HeldPrompts::default(),
        }
    }

    /// One step's `[b, 4]` records and `[b]` tokens for slots `lo..lo + b` from their `logits`
    /// and uniforms `u`: one sampler call when every live slot among them samples from the same
    /// distribution (a free slot samples from any), else one per distribution over its slots'
    /// rows, which gives each row what it gets alone (the sampler works row by row).
    fn sample(&self, logits: &Tensor, u: &Tensor, lo: usize, b: usize) -> (Tensor, Tensor) {
        let mut groups: Vec<(&SamplingParams, Vec<i64>)> = Vec::new();
        for i in 0..b {
            let s = lo + i;
            let Some(p) = self.live[s].then(|| self.own[s].as_ref().unwrap_or(self.p)) else { continue };
            match groups.iter_mut().find(|(q, _)| same_distribution(q, p)) {
                Some((_, rows)) => rows.push(i as i64),
                None => groups.push((p, vec![i as i64])),
            }
        }
        if groups.len() <= 1 {
            return sample_record(logits, groups.first().map_or(self.p, |g| g.0), u);
        }
        let dev = logits.device();
        let (mut rec, mut tok) = (Tensor::zeros([b as i64, 4], (Kind::Double, dev)), Tensor::zeros([b as i64], (Kind::Int64, dev)));
        for (p, rows) in groups {
            let idx = Tensor::from_slice(&rows).to_device(dev);
            let (r, t) = sample_record(&logits.index_select(0, &idx), p, &u.index_select(0, &idx));
            rec = rec.index_copy(0, &idx, &r);
            tok = tok.index_copy(0, &idx, &t);
        }
        (rec, tok)
    }
}

/// Whether `a` and `b` sample from the same distribution (temperature, top-p, top-k; their
/// budgets and stop rules aside).
pub fn same_distribution(a: &SamplingParams, b: &SamplingParams) -> bool {
    a.temperature == b.temperature && a.top_p == b.top_p && a.top_k == b.top_k
}

impl Slots for EagerSlots<'_> {
    fn fill(&mut self, s: usize, prompt: &[i64], own: Option<SamplingParams>) {
        self.column[s] = fill_slot(self.model, prompt, s, &mut self.cache, &mut self.logits, &mut self.held);
        self.live[s] = true;
        self.own[s] = own;
    }

    fn mixes(&self) -> bool {
        true
    }

    fn free(&mut self, s: usize) {
        self.live[s] = false;
    }

    fn steps(&mut self, u: &Tensor, n: usize) -> Result<Vec<Tensor>> {
        let (model, dev) = (self.model, self.model.device());
        let slots = self.column.len() as i64;
        // Only the slots from the first live one to the last are stepped (a lone request on a
        // server's 16 slots, or the tail of a rollout, does not pay for the free ones around
        // it); free slots inside that range stay at their column (they write there, unread by
        // any live row).
        let first = self.live.iter().position(|&l| l).unwrap_or(0);
        let last = self.live.iter().rposition(|&l| l).unwrap_or(0);
        let (lo, b) = (first as i64, (last - first + 1) as i64);
        let advance: Vec<i64> = self.live[first..=last].iter().map(|&l| l as i64).collect();
        let advance = Tensor::from_slice(&advance).to_device(dev);
        let mut cols = Tensor::from_slice(&self.column[first..=last]).to_device(dev);
        let keys_from = (first..=last).filter(|&s| self.live[s]).map(|s| self.column[s]).max().unwrap_or(0);
        let mut cache = self.cache.rows_view(lo, b);
        let mut logits = self.logits.narrow(0, lo, b);
        let mut records = Vec::with_capacity(n);
        for j in 0..n {
            let (rec, tok) = self.sample(&logits, &u.get(j as i64).narrow(0, lo, b), first, b as usize);
            // Every slot's row of the record, as the caller reads it.
            records.push(if b == slots {
                rec
            } else {
                let full = Tensor::zeros([slots, 4], (rec.kind(), dev));
                full.narrow(0, lo, b).copy_(&rec);
                full
            });
            // Slot s sees its columns 0..=cols[s]: its prompt, its tokens, this one.
            let read = keys_from + j as i64 + 1;
            let keys = Tensor::arange(read, (Kind::Int64, dev)).view([1, 1, 1, read]);
            let hidden = keys.gt_tensor(&cols.view([b, 1, 1, 1]));
            let bias = Tensor::zeros([b, 1, 1, read], (model.kind(), dev)).masked_fill(&hidden, MASKED);
            cache.write_rows_at(&cols, read);
            let h = model.hidden_decode(&tok.unsqueeze(-1), &cols.unsqueeze(-1), &AttnMask::Bias(bias), Some(&mut cache), self.fused.as_deref());
            logits = model.logits(&h.squeeze_dim(1));
            // A new tensor: the cache's write index still views the old one.
            cols = &cols + &advance;
        }
        if b == slots {
            self.logits = logits;
        } else {
            self.logits.narrow(0, lo, b).copy_(&logits);
        }
        for (c, &l) in self.column.iter_mut().zip(&self.live) {
            *c += if l { n as i64 } else { 0 };
        }
        Ok(records)
    }

    fn finish(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

/// Slots stepped by fixed-shape [`StaticStep`]s through a [`super::cuda_graph::Runner`], which
/// replays one captured graph per step where it can: refills happen in place between steps.
struct FixedSlots<'a> {
    step: StaticStep<'a>,
    runner: super::cuda_graph::Runner,
}

impl Slots for FixedSlots<'_> {
    /// `own` is the session's distribution here ([`Occupants::refill`] checks it).
    fn fill(&mut self, s: usize, prompt: &[i64], _own: Option<SamplingParams>) {
        self.step.fill(s, prompt);
    }

    /// A captured step samples from the one distribution it was captured with.
    fn mixes(&self) -> bool {
        false
    }

    fn free(&mut self, s: usize) {
        self.step.free(s);
    }

    fn steps(&mut self, u: &Tensor, n: usize) -> Result<Vec<Tensor>> {
        (0..n)
            .map(|j| {
                self.step.set_uniforms(&u.get(j as i64));
                self.runner.step(|| self.step.run())
            })
            .collect()
    }

    fn finish(self: Box<Self>) -> Result<()> {
        self.runner.finish()
    }
}

/// Where continuous batching takes its rows from, between read-backs, and gives them back as
/// they finish: a fixed list ([`generate_continuous`]) or requests still arriving (`rredcot
/// serve`, which answers each request as soon as its rows are done).
pub trait RowFeed {
    /// The next row to decode if one is waiting now. Its prompt and budget together must fit the
    /// session's `fits` tokens ([`generate_fed`]); a row with budget 0 finishes at once.
    fn next_row(&mut self) -> Option<FedRow>;
    /// Row `id` finished (rows are numbered from 0 in the order [`Self::next_row`] gave them).
    fn finished(&mut self, id: usize, g: Generation);
    /// Called after every read-back, whether or not a slot is free (a server answers what needs
    /// no generation here, so a long decode does not hold it up).
    fn between_reads(&mut self) {}
    /// Row `id` has these tokens after a read-back and goes on (a server streams their text).
    /// False stops it: it is [`Self::finished`] with the tokens it has (the client has gone).
    fn progressed(&mut self, _id: usize, _tokens: &[i64]) -> bool {
        true
    }
}

/// A row for [`RowFeed::next_row`]: prompt ids, the row's seed, its token budget and, where it
/// has its own (a server's requests may each have theirs; `None`: the session's params'), its
/// stop rules and the distribution it samples from (`sampling`'s temperature, top-p and top-k;
/// its other fields are not read). Only the eager steps mix distributions
/// ([`fed_rows_may_mix_distributions`]).
pub struct FedRow {
    pub prompt: Vec<i64>,
    pub seed: u64,
    pub limit: usize,
    pub stops: Option<StopRules>,
    pub sampling: Option<SamplingParams>,
}

/// Whether [`generate_fed`] on `dev` takes rows whose distributions differ (the eager steps do; a
/// captured CUDA-graph step samples from one).
pub fn fed_rows_may_mix_distributions(dev: Device) -> bool {
    steps_on(dev) == Steps::Eager
}

/// Continuous batching over rows that `feed` gives while the decode runs: at most `slots` rows
/// decode at a time, each prompt with its budget at most `fits` tokens, and a row whose slot is
/// free when it arrives starts at the next read-back. The session ends when no row decodes and
/// the feed has none waiting. Each row gets the tokens [`generate`] gives it in any batch.
pub fn generate_fed(
    model: &DecoderLm,
    tokenizer: Option<&Tokenizer>,
    p: &SamplingParams,
    slots: usize,
    fits: usize,
    feed: &mut dyn RowFeed,
) -> Result<()> {
    check_params(tokenizer, p)?;
    let dev = model.device();
    fed(model, Completions::new(tokenizer, p, 0), feed, slots.max(1), fits, sync_every(dev), steps_on(dev))
}

/// Feeds a fixed list of rows, in order, and keeps what comes back.
struct ListFeed<'a> {
    prompts: &'a [Vec<i64>],
    seeds: &'a [u64],
    limits: Vec<usize>,
    out: Vec<Option<Generation>>,
}

impl RowFeed for ListFeed<'_> {
    fn next_row(&mut self) -> Option<FedRow> {
        let r = self.out.len();
        let prompt = self.prompts.get(r)?.clone();
        self.out.push(None);
        Some(FedRow { prompt, seed: self.seeds[r], limit: self.limits[r], stops: None, sampling: None })
    }

    fn finished(&mut self, id: usize, g: Generation) {
        self.out[id] = Some(g);
    }
}

/// [`generate_continuous`] into `rows` (the request's completions, tokenizer, params and each
/// row's budget), reading the sampled tokens back (and refilling slots) every `every` steps,
/// stepping the slots as `steps` says. A row whose budget is 0 gets no slot and no tokens.
fn continuous(
    model: &DecoderLm,
    mut rows: Completions,
    prompts: &[Vec<i64>],
    seeds: &[u64],
    slots: usize,
    every: usize,
    steps: Steps,
) -> Result<Vec<Generation>> {
    let (tokenizer, p) = (rows.tokenizer, rows.p);
    if let Some(empty) = check_rows(model, tokenizer, prompts, seeds, p, &rows.limits)? {
        return Ok(empty);
    }
    let n_slots = if slots == 0 {
        prompts.len()
    } else {
        slots.min(prompts.len())
    };
    let longest = prompts.iter().zip(&rows.limits).map(|(pr, l)| pr.len() + l).max().unwrap_or(0);
    // The feed numbers the rows again, in the same order.
    let limits = std::mem::take(&mut rows.limits);
    rows.out.clear();
    rows.row_stops.clear();
    let mut feed = ListFeed { prompts, seeds, limits, out: Vec::with_capacity(prompts.len()) };
    fed(model, rows, &mut feed, n_slots, longest, every, steps)?;
    Ok(feed.out.into_iter().map(|g| g.expect("every row finishes")).collect())
}

/// Continuous batching's slots on the host: which row each decodes and that row's random
/// stream; `fits` = the most prompt + budget tokens a row may have.
struct Occupants {
    occupant: Vec<Option<usize>>,
    streams: Vec<Option<ChaCha8Rng>>,
    fits: usize,
}

impl Occupants {
    /// Slot `s`'s row is done (it ended, or its feed stopped it): the slot is free.
    fn release(&mut self, s: usize, decoder: &mut dyn Slots) {
        self.occupant[s] = None;
        self.streams[s] = None;
        decoder.free(s);
    }

    /// Free slots take the rows waiting in `feed`, in slot order (a row without budget finishes
    /// at once and takes no slot).
    fn refill(&mut self, model: &DecoderLm, decoder: &mut dyn Slots, rows: &mut Completions, feed: &mut dyn RowFeed) -> Result<()> {
        for s in 0..self.occupant.len() {
            while self.occupant[s].is_none() {
                let Some(next) = feed.next_row() else { return Ok(()) };
                if let Some(stops) = &next.stops {
                    check_stop_strings(rows.tokenizer, &stops.strings)?;
                }
                if let Some(own) = &next.sampling {
                    check_params(rows.tokenizer, own)?;
                    if !decoder.mixes() && !same_distribution(own, rows.p) {
                        return Err(ModelError::Request(format!(
                            "row {}: its sampling distribution differs from the session's, which these decode steps (CUDA graphs) cannot mix",
                            rows.out.len()
                        )));
                    }
                }
                let row = rows.add_row(next.limit, next.stops);
                if next.limit == 0 {
                    rows.progress.rows_done += 1;
                    feed.finished(row, rows.take(row)?);
                    continue;
                }
                check_row(model, row, &next.prompt, next.limit)?;
                if next.prompt.len() + next.limit > self.fits {
                    return Err(ModelError::Request(format!(
                        "row {row}: {} prompt and {} new tokens are more than the session's {}",
                        next.prompt.len(),
                        next.limit,
                        self.fits
                    )));
                }
                decoder.fill(s, &next.prompt, next.sampling);
                self.occupant[s] = Some(row);
                self.streams[s] = Some(ChaCha8Rng::seed_from_u64(next.seed));
            }
        }
        Ok(())
    }
}

/// The continuous batching loop: `n_slots` slots over a cache of `fits` tokens (plus the
/// columns a finished row writes until the next read-back), refilled from `feed` after each
/// read-back of `every` steps.
fn fed(
    model: &DecoderLm,
    mut rows: Completions,
    feed: &mut dyn RowFeed,
    n_slots: usize,
    fits: usize,
    every: usize,
    steps: Steps,
) -> Result<()> {
    let (p, dev) = (rows.p, model.device());
    let mut slots = Occupants { occupant: vec![None; n_slots], streams: (0..n_slots).map(|_| None).collect(), fits };
    tch::no_grad(|| -> Result<()> {
        // A row that finished between reads writes up to `every` more columns.
        let cache = model.new_cache(n_slots as i64, (fits + every) as i64);
        let fused = model.decode_projections();
        let mut decoder: Box<dyn Slots> = match steps {
            Steps::Eager => Box::new(EagerSlots::new(model, fused, p, cache)),
            Steps::Static { graph } => Box::new(FixedSlots {
                step: StaticStep::slots(model, fused, p, cache),
                runner: super::cuda_graph::Runner::new(graph)?,
            }),
        };
        slots.refill(model, decoder.as_mut(), &mut rows, feed)?;
        loop {
            let active: Vec<usize> = (0..n_slots).filter(|&s| slots.occupant[s].is_some()).collect();
            if active.is_empty() {
                break;
            }
            // No more steps than the longest remaining budget of a decoding row.
            let budget = active
                .iter()
                .map(|&s| {
                    let row = slots.occupant[s].expect("active");
                    rows.limits[row] - rows.out[row].tokens.len()
                })
                .max()
                .unwrap_or(0);
            let n = every.min(budget);
            let u = uniforms(&mut slots.streams.iter_mut().map(|r| r.as_mut()).collect::<Vec<_>>(), n, dev);
            let records = decoder.steps(&u, n)?;
            let host = read_back(&records)?;
            for &s in &active {
                let row = slots.occupant[s].expect("active");
                for j in 0..n {
                    let at = (j * n_slots + s) * 4;
                    if rows.push(row, &host[at..at + 4])? {
                        slots.release(s, decoder.as_mut());
                        feed.finished(row, rows.take(row)?);
                        break;
                    }
                }
                if slots.occupant[s].is_some() && !feed.progressed(row, &rows.out[row].tokens) {
                    slots.release(s, decoder.as_mut());
                    rows.progress.rows_done += 1;
                    feed.finished(row, rows.take(row)?);
                }
            }
            rows.report();
            feed.between_reads();
            slots.refill(model, decoder.as_mut(), &mut rows, feed)?;
        }
        decoder.finish()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::Arch;
    use crate::model::score::tests::tiny_model;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The decode loop before issue 17 (a host read every step, the mask concatenated every step),
    /// kept as the oracle the static batch must equal exactly.
    fn generate_before(
        model: &DecoderLm,
        tokenizer: Option<&Tokenizer>,
        prompts: &[Vec<i64>],
        seeds: &[u64],
        p: &SamplingParams,
    ) -> Result<Vec<Generation>> {
        if prompts.len() != seeds.len() {
            return Err(ModelError::Request(format!(
                "{} prompts but {} seeds",
                prompts.len(),
                seeds.len()
            )));
        }
        if !(p.top_p > 0.0 && p.top_p <= 1.0) || p.temperature < 0.0 || p.top_k < 0 {
            return Err(ModelError::Request(format!(
                "invalid sampling params: temperature {}, top_p {}, top_k {}",
                p.temperature, p.top_p, p.top_k
            )));
        }
        if !p.stop_strings.is_empty() && tokenizer.is_none() {
            return Err(ModelError::Request("stop strings need a tokenizer".into()));
        }
        if prompts.is_empty() || p.max_new_tokens == 0 {
            return Ok(prompts
                .iter()
                .map(|_| Generation {
                    tokens: vec![],
                    logprobs: vec![],
                    entropies: vec![],
                    finish_reason: FinishReason::Length,
                    text: tokenizer.map(|_| String::new()),
                })
                .collect());
        }
        for (row, pr) in prompts.iter().enumerate() {
            if pr.is_empty() {
                return Err(ModelError::Request(format!("row {row}: empty prompt")));
            }
            model.check_ids(pr, row, p.max_new_tokens)?;
        }
        let mut stop_ids = p.stop_token_ids.clone();
        if let Some(t) = tokenizer {
            stop_ids.extend(&t.eos_ids);
        }
        let pad_id = tokenizer.map_or(0, |t| t.pad_id);
        let dev = model.device();
        let b = prompts.len() as i64;
        let plen = prompts.iter().map(Vec::len).max().unwrap_or(0) as i64;
        let padded = prompts.iter().any(|x| x.len() as i64 != plen);
        let mut ids = Vec::with_capacity((b * plen) as usize);
        let mut mask = Vec::with_capacity((b * plen) as usize);
        for pr in prompts {
            let pad = plen as usize - pr.len();
            ids.extend(std::iter::repeat_n(pad_id, pad).chain(pr.iter().copied()));
            mask.extend(std::iter::repeat_n(0i64, pad).chain(std::iter::repeat_n(1, pr.len())));
        }
        let ids = Tensor::from_slice(&ids).view([b, plen]).to_device(dev);
        let key_mask = Tensor::from_slice(&mask).view([b, plen]).to_device(dev);
        let mut rngs: Vec<ChaCha8Rng> = seeds
            .iter()
            .map(|&s| ChaCha8Rng::seed_from_u64(s))
            .collect();
        let mut out: Vec<Generation> = (0..prompts.len())
            .map(|_| Generation {
                tokens: vec![],
                logprobs: vec![],
                entropies: vec![],
                finish_reason: FinishReason::Length,
                text: None,
            })
            .collect();
        let mut done = vec![false; prompts.len()];
        let max_stop_chars = p
            .stop_strings
            .iter()
            .map(|s| s.chars().count())
            .max()
            .unwrap_or(0);

        tch::no_grad(|| -> Result<()> {
            let mut cache = model.new_cache(b, plen + p.max_new_tokens as i64);
            let positions = (key_mask.cumsum(-1, Kind::Int64) - 1).clamp_min(0);
            let prefill_mask = if padded {
                AttnMask::Bias(crate::model::decoder::causal_bias(
                    b,
                    plen,
                    0,
                    Some(&key_mask),
                    model.kind(),
                    dev,
                ))
            } else {
                AttnMask::Causal
            };
            let h = model.hidden(&ids, &positions, &prefill_mask, Some(&mut cache));
            let mut logits = model.logits(&h.narrow(1, plen - 1, 1).squeeze_dim(1));
            let mut next_pos = positions.narrow(1, plen - 1, 1) + 1;
            // Padding bias over the prompt keys; new keys are always visible.
            let pad_bias = Tensor::zeros([b, 1, 1, plen], (model.kind(), dev))
                .masked_fill(&key_mask.eq(0).view([b, 1, 1, plen]), MASKED);
            for step in 0..p.max_new_tokens {
                let u: Vec<f64> = rngs.iter_mut().map(|r| r.random::<f64>()).collect();
                let u = Tensor::from_slice(&u).to_kind(Kind::Float).to_device(dev);
                let (tok, lp, ent, finite) = sample_step(&logits.to_kind(Kind::Float), p, &u);
                let host = Tensor::stack(
                    &[
                        tok.to_kind(Kind::Double),
                        lp.to_kind(Kind::Double),
                        ent.to_kind(Kind::Double),
                        finite.to_kind(Kind::Double),
                    ],
                    1,
                )
                .to_device(tch::Device::Cpu);
                let host = Vec::<f64>::try_from(host.view([-1]))
                    .map_err(|e| ModelError::Request(format!("reading sampled tokens: {e}")))?;
                for row in 0..prompts.len() {
                    if done[row] {
                        continue;
                    }
                    let r = &host[row * 4..row * 4 + 4];
                    if r[3] == 0.0 {
                        return Err(ModelError::NonFinite { row, step });
                    }
                    let t = r[0] as i64;
                    let g = &mut out[row];
                    g.tokens.push(t);
                    g.logprobs.push(r[1] as f32);
                    g.entropies.push(r[2] as f32);
                    if stop_ids.contains(&t) {
                        g.finish_reason = FinishReason::Stop;
                        done[row] = true;
                    } else if let (Some(tk), false) = (tokenizer, p.stop_strings.is_empty()) {
                        let tail = &g.tokens[g.tokens.len().saturating_sub(max_stop_chars + 8)..];
                        let text = tk.decode(tail, false)?;
                        if p.stop_strings.iter().any(|s| text.contains(s.as_str())) {
                            g.finish_reason = FinishReason::Stop;
                            done[row] = true;
                        }
                    }
                }
                if done.iter().all(|&d| d) || step + 1 == p.max_new_tokens {
                    break;
                }
                let step_ids = tok.unsqueeze(-1);
                let mask = if padded {
                    let s = cache.len() + 1;
                    let fresh = Tensor::zeros([b, 1, 1, s - plen], (model.kind(), dev));
                    AttnMask::Bias(Tensor::cat(&[&pad_bias, &fresh], -1))
                } else {
                    AttnMask::Full
                };
                let h = model.hidden(&step_ids, &next_pos, &mask, Some(&mut cache));
                logits = model.logits(&h.squeeze_dim(1));
                next_pos += 1;
            }
            Ok(())
        })?;

        if let Some(tk) = tokenizer {
            for g in &mut out {
                let mut text = tk.decode(&g.tokens, true)?;
                if let Some(cut) = p
                    .stop_strings
                    .iter()
                    .filter_map(|s| text.find(s.as_str()))
                    .min()
                {
                    text.truncate(cut);
                }
                g.text = Some(text);
            }
        }
        Ok(out)
    }

    /// Prompts of several lengths (so the static batch pads) and one seed per row.
    fn ragged_prompts(n: usize, vocab: i64) -> (Vec<Vec<i64>>, Vec<u64>) {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let prompts = (0..n)
            .map(|i| {
                (0..2 + (i * 3) % 7)
                    .map(|_| rng.random_range(1..vocab))
                    .collect()
            })
            .collect();
        (prompts, (0..n as u64).map(|i| 100 + i).collect())
    }

    /// A stop token that ends some rows early and not others: the first token (in row order)
    /// of the free generations that some rows produce and some never do. Chosen from the
    /// generations themselves, not fixed, because which tokens a random tiny model emits
    /// moves with the CPU's float kernels (a fixed choice stopped every row on another machine).
    fn stop_params(
        m: &DecoderLm,
        prompts: &[Vec<i64>],
        seeds: &[u64],
        p: &SamplingParams,
    ) -> SamplingParams {
        let free = generate_before(m, None, prompts, seeds, p).unwrap();
        let stop = free
            .iter()
            .flat_map(|g| g.tokens.iter().copied())
            .find(|t| free.iter().any(|g| !g.tokens.contains(t)))
            .unwrap_or_else(|| panic!("every row emits the same tokens: {free:?}"));
        SamplingParams {
            stop_token_ids: vec![stop],
            ..p.clone()
        }
    }

    /// Eager steps (the CPU's) give the loop before issue 17's completions bit for bit; the
    /// fixed-shape steps a CUDA graph captures (run as they are here) the same tokens and finish
    /// reasons, log-probabilities and entropies within 1e-5 (their attention reads the whole
    /// cache, the columns not yet written hidden, which rounds otherwise).
    #[test]
    fn static_batch_equals_the_loop_before_issue_17_for_any_read_interval() {
        for (arch, seed) in [(Arch::Qwen2, 31), (Arch::Qwen3, 32), (Arch::Llama, 33)] {
            let m = tiny_model(arch, seed);
            let (prompts, seeds) = ragged_prompts(5, m.cfg.vocab_size);
            for t in [0.0, 1.0] {
                let p = stop_params(&m, &prompts, &seeds, &params(t));
                let before = generate_before(&m, None, &prompts, &seeds, &p).unwrap();
                assert!(before.iter().any(|g| g.finish_reason == FinishReason::Stop));
                assert!(before
                    .iter()
                    .any(|g| g.finish_reason == FinishReason::Length));
                for every in [1, 3, 16] {
                    let now = generate_static(&m, Completions::new(None, &p, prompts.len()), &prompts, &seeds, every, Steps::Eager).unwrap();
                    assert_eq!(now, before, "{arch:?} temperature {t}, reads every {every} steps");
                    let fixed = generate_static(&m, Completions::new(None, &p, prompts.len()), &prompts, &seeds, every, Steps::Static { graph: false }).unwrap();
                    for (row, (a, b)) in fixed.iter().zip(&before).enumerate() {
                        let at = format!("{arch:?} temperature {t}, reads every {every}, fixed-shape steps, row {row}");
                        assert_eq!((&a.tokens, a.finish_reason), (&b.tokens, b.finish_reason), "{at}");
                        for (x, y) in a.logprobs.iter().zip(&b.logprobs).chain(a.entropies.iter().zip(&b.entropies)) {
                            assert!((x - y).abs() < 1e-5, "{at}: {x} vs {y}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_prefill_of_a_finished_completion_gives_its_sampling_logprobs_and_entropies() {
        let m = tiny_model(Arch::Qwen2, 51);
        let (prompts, seeds) = ragged_prompts(4, m.cfg.vocab_size);
        for t in [0.0, 0.7, 1.0] {
            let p = params(t);
            let gens = generate(&m, None, &prompts, &seeds, &p).unwrap();
            for (row, (pr, g)) in prompts.iter().zip(&gens).enumerate() {
                let f = prefill_completion(&m, pr, &g.tokens, &p, 5).unwrap();
                assert_eq!((f.logprobs.len(), f.entropies.len(), f.top.len()), (g.tokens.len(), g.tokens.len(), g.tokens.len()));
                // The LM head in pieces of 3 positions gives the same.
                head::TEST_LOGITS_AT_ONCE.set(Some(3 * m.cfg.vocab_size));
                let pieced = prefill_completion(&m, pr, &g.tokens, &p, 5);
                head::TEST_LOGITS_AT_ONCE.set(None);
                let pieced = pieced.unwrap();
                assert_eq!(pieced.top.iter().map(|r| r.iter().map(|x| x.0).collect::<Vec<_>>()).collect::<Vec<_>>(),
                           f.top.iter().map(|r| r.iter().map(|x| x.0).collect::<Vec<_>>()).collect::<Vec<_>>(), "T={t} row {row}");
                for (x, y) in pieced.logprobs.iter().zip(&f.logprobs).chain(pieced.entropies.iter().zip(&f.entropies)) {
                    assert!((x - y).abs() < 1e-6, "T={t} row {row}, head in pieces: {x} vs {y}");
                }
                for (x, y) in f.logprobs.iter().zip(&g.logprobs).chain(f.entropies.iter().zip(&g.entropies)) {
                    assert!((x - y).abs() < 1e-4, "T={t} row {row}: {x} vs {y}");
                }
                for (i, top) in f.top.iter().enumerate() {
                    assert!(!top.is_empty() && top.len() <= 5 && top.windows(2).all(|w| w[0].1 >= w[1].1), "T={t} row {row} token {i}: {top:?}");
                    if t == 0.0 {
                        assert_eq!(top[0].0, g.tokens[i], "greedy: the chosen token is the most likely");
                    }
                }
            }
        }
        assert!(prefill_completion(&m, &[], &[1], &params(1.0), 0).is_err());
    }

    #[test]
    fn progress_is_reported_after_each_read_back_and_ends_at_every_row_and_token() {
        let m = tiny_model(Arch::Qwen2, 41);
        let (prompts, seeds) = ragged_prompts(7, m.cfg.vocab_size);
        let p = stop_params(&m, &prompts, &seeds, &params(1.0));
        let check = |seen: &[Progress], gens: &[Generation], what: &str| {
            let tokens: usize = gens.iter().map(|g| g.tokens.len()).sum();
            assert!(seen.len() > 1, "{what}: {seen:?}");
            assert!(seen.windows(2).all(|w| w[0].rows_done <= w[1].rows_done && w[0].tokens < w[1].tokens), "{what}: {seen:?}");
            assert_eq!(seen.last(), Some(&Progress { rows_done: prompts.len(), tokens }), "{what}");
        };
        let mut seen = Vec::new();
        let gens = generate_with_progress(&m, None, &prompts, &seeds, &p, Some(&mut |x| seen.push(x))).unwrap();
        // The CPU reads every step back: one report per step of the longest row.
        let longest = gens.iter().map(|g| g.tokens.len()).max().unwrap();
        assert_eq!(seen.len(), longest);
        check(&seen, &gens, "static");
        assert_eq!(gens, generate(&m, None, &prompts, &seeds, &p).unwrap(), "observing changes nothing");
        let mut seen = Vec::new();
        let gens = generate_continuous_with_progress(&m, None, &prompts, &seeds, &p, 3, Some(&mut |x| seen.push(x))).unwrap();
        check(&seen, &gens, "continuous");
    }

    /// Logits that are not all finite fail the request, naming the row and the step, on every
    /// decode path (static batch eager and fixed-shape, continuous batching) and in a prefill:
    /// a NaN embedding reached from a prompt (step 0) or from a sampled token (a later step).
    #[test]
    fn non_finite_logits_fail_the_request_naming_row_and_step() {
        // Untied embeddings: a NaN row reaches only the rows that read the token.
        let clean = tiny_model(Arch::Qwen3, 51);
        // `clean`'s weights (copied: tests beside this one draw from libtorch's global generator
        // too), one embedding row NaN.
        let poisoned = |token: i64| {
            let m = tiny_model(Arch::Qwen3, 51);
            tch::no_grad(|| {
                for ((name, mut to), (_, from)) in m.sorted_variables().into_iter().zip(clean.sorted_variables()) {
                    to.copy_(&from);
                    if name.contains("embed_tokens") {
                        let _ = to.get(token).fill_(f64::NAN);
                    }
                }
            });
            m
        };
        let (mut prompts, seeds) = ragged_prompts(4, clean.cfg.vocab_size);
        for t in [0.0, 1.0] {
            let p = SamplingParams { temperature: t, max_new_tokens: 12, ..Default::default() };
            let free = generate(&clean, None, &prompts, &seeds, &p).unwrap();
            // A token one row samples before its last step that no other row and no prompt holds:
            // that row's logits turn NaN at the step after it.
            let (row, step, token) = free
                .iter()
                .enumerate()
                .flat_map(|(r, g)| g.tokens[..g.tokens.len() - 1].iter().enumerate().map(move |(s, &tok)| (r, s, tok)))
                .find(|&(r, _, tok)| {
                    free.iter().enumerate().all(|(o, g)| o == r || !g.tokens.contains(&tok))
                        && prompts.iter().all(|pr| !pr.contains(&tok))
                })
                .unwrap_or_else(|| panic!("T={t}: no token sampled by one row only: {free:?}"));
            let m = poisoned(token);
            let expect = |got: Result<Vec<Generation>>, what: &str| match got {
                Err(ModelError::NonFinite { row: r, step: s }) => assert_eq!((r, s), (row, step + 1), "T={t} {what}"),
                other => panic!("T={t} {what}: expected non-finite logits at row {row}, step {}: {other:?}", step + 1),
            };
            expect(generate(&m, None, &prompts, &seeds, &p), "static batch");
            let fixed = generate_static(&m, Completions::new(None, &p, prompts.len()), &prompts, &seeds, 3, Steps::Static { graph: false });
            expect(fixed, "fixed-shape steps");
            for slots in [1, 2, 0] {
                expect(generate_continuous(&m, None, &prompts, &seeds, &p, slots), &format!("continuous, {slots} slots"));
            }
            let mut completion = free[row].tokens.clone();
            completion.truncate(step + 2);
            assert!(
                matches!(prefill_completion(&m, &prompts[row], &completion, &p, 0), Err(ModelError::NonFinite { .. })),
                "T={t}: a prefill through the NaN token"
            );
        }
        // The NaN token in a prompt: its row fails at step 0.
        let token = clean.cfg.vocab_size - 1;
        prompts.iter_mut().for_each(|pr| pr.retain(|&x| x != token));
        prompts[2].push(token);
        let m = poisoned(token);
        let p = SamplingParams { temperature: 1.0, max_new_tokens: 4, ..Default::default() };
        for slots in [None, Some(1), Some(0)] {
            let got = match slots {
                None => generate(&m, None, &prompts, &seeds, &p),
                Some(s) => generate_continuous(&m, None, &prompts, &seeds, &p, s),
            };
            assert!(matches!(got, Err(ModelError::NonFinite { row: 2, step: 0 })), "{slots:?}: {got:?}");
        }
        // σ scoring through it: a cut after the NaN token.
        let trace: Vec<i64> = prompts[2].iter().copied().chain([1, 2, 3, 4]).collect();
        let cut = prompts[2].len() + 1;
        let scored = crate::model::score::score_cuts(&m, &trace, &[cut], &[vec![5, 6]]);
        assert!(matches!(scored, Err(ModelError::NonFinite { .. })), "{scored:?}");
        assert!(crate::model::score::score_cuts(&clean, &trace, &[cut], &[vec![5, 6]]).is_ok());
    }

    #[test]
    fn continuous_batching_gives_every_row_its_static_batch_tokens() {
        for (arch, seed) in [(Arch::Qwen2, 41), (Arch::Llama, 43)] {
            let m = tiny_model(arch, seed);
            let (prompts, seeds) = ragged_prompts(7, m.cfg.vocab_size);
            for t in [0.0, 1.0] {
                let p = stop_params(&m, &prompts, &seeds, &params(t));
                let batch = generate(&m, None, &prompts, &seeds, &p).unwrap();
                let lens: Vec<usize> = batch.iter().map(|g| g.tokens.len()).collect();
                assert!(
                    lens.iter().min() < lens.iter().max(),
                    "rows should finish at different steps: {lens:?}"
                );
                for ((slots, every), steps) in [(1, 1), (2, 1), (3, 4), (0, 16)].into_iter().flat_map(|x| [(x, Steps::Eager), (x, Steps::Static { graph: false })]) {
                    let cont = continuous(&m, Completions::new(None, &p, prompts.len()), &prompts, &seeds, slots, every, steps).unwrap();
                    for (row, (c, b)) in cont.iter().zip(&batch).enumerate() {
                        let at = format!("{arch:?} T={t} slots {slots} every {every} {steps:?} row {row}");
                        assert_eq!(c.tokens, b.tokens, "{at}");
                        assert_eq!(c.finish_reason, b.finish_reason, "{at}");
                        for (x, y) in c
                            .logprobs
                            .iter()
                            .zip(&b.logprobs)
                            .chain(c.entropies.iter().zip(&b.entropies))
                        {
                            assert!((x - y).abs() < 1e-4, "{at}: {x} vs {y}");
                        }
                    }
                }
            }
        }
    }

    /// The samples of a prompt come one after another (a group), or a few rows apart (requests to
    /// a server finish out of order): each after the first copies the prompt's keys, values and
    /// logits from a slot that holds it, and every row still gets its static batch tokens (the
    /// copies are the values a prefill gives). A slot refilled with another prompt holds the old
    /// one no more: with one slot, a prompt that comes back is prefilled again.
    #[test]
    fn samples_of_one_prompt_share_its_prefill_and_keep_their_tokens() {
        let m = tiny_model(Arch::Qwen2, 53);
        let (distinct, _) = ragged_prompts(3, m.cfg.vocab_size);
        // Groups of 3, 1 and 4 samples, then the first prompt again after another one; then the
        // three prompts interleaved.
        for order in [&[0, 0, 0, 1, 2, 2, 2, 2, 0][..], &[0, 1, 0, 2, 1, 0, 2, 2, 1]] {
            let prompts: Vec<Vec<i64>> = order.iter().map(|&i| distinct[i].clone()).collect();
            let seeds: Vec<u64> = (0..prompts.len() as u64).map(|i| 300 + i).collect();
            // With one slot, a prefill per run of equal prompts; with a slot per row, one per prompt.
            let mut runs = order.to_vec();
            runs.dedup();
            let positions_of = |ps: &[usize]| ps.iter().map(|&i| distinct[i].len() as u64).sum::<u64>();
            for t in [0.0, 1.0] {
                let p = stop_params(&m, &prompts, &seeds, &params(t));
                let positions = prefilled_positions();
                let batch = generate(&m, None, &prompts, &seeds, &p).unwrap();
                let longest = prompts.iter().map(Vec::len).max().unwrap() as u64;
                assert_eq!(prefilled_positions() - positions, prompts.len() as u64 * longest, "a static batch prefills its padding");
                for ((slots, every), steps) in [(1, 1), (2, 1), (4, 3), (0, 16)].into_iter().flat_map(|x| [(x, Steps::Eager), (x, Steps::Static { graph: false })]) {
                    let (before, positions) = (PREFILLS.with(|n| n.get()), prefilled_positions());
                    let cont = continuous(&m, Completions::new(None, &p, prompts.len()), &prompts, &seeds, slots, every, steps).unwrap();
                    let prefills = PREFILLS.with(|n| n.get()) - before;
                    let at = format!("{order:?} T={t} slots {slots} every {every} {steps:?}");
                    match slots {
                        1 => assert_eq!((prefills, prefilled_positions() - positions), (runs.len(), positions_of(&runs)), "{at}: one prefill per run"),
                        0 => assert_eq!((prefills, prefilled_positions() - positions), (3, positions_of(&[0, 1, 2])), "{at}: one prefill per prompt"),
                        _ => assert!((3..=runs.len()).contains(&prefills), "{at}: {prefills} prefills"),
                    }
                    for (row, (c, b)) in cont.iter().zip(&batch).enumerate() {
                        assert_eq!((&c.tokens, c.finish_reason), (&b.tokens, b.finish_reason), "{at} row {row}");
                        for (x, y) in c.logprobs.iter().zip(&b.logprobs) {
                            assert!((x - y).abs() < 1e-4, "{at} row {row}: {x} vs {y}");
                        }
                    }
                }
            }
        }
    }

    /// A feed whose rows arrive over time: row i is waiting only once `after[i]` rows have
    /// finished (a server taking requests between read-backs). Keeps what comes back, the order
    /// rows finished in, and how often it had nothing while rows were still to come.
    struct LateFeed {
        prompts: Vec<Vec<i64>>,
        seeds: Vec<u64>,
        limits: Vec<usize>,
        after: Vec<usize>,
        given: usize,
        empty_asks: usize,
        reads: usize,
        out: Vec<Option<Generation>>,
        finished_order: Vec<usize>,
        /// Each row's tokens at each read-back it went on after.
        progress: Vec<Vec<Vec<i64>>>,
        /// (row, n): row `row` is stopped once it has at least `n` tokens.
        stop: Option<(usize, usize)>,
        /// Each row's own stop rules and distribution, if any.
        stops: Vec<Option<StopRules>>,
        sampling: Vec<Option<SamplingParams>>,
    }

    impl LateFeed {
        fn new(prompts: &[Vec<i64>], seeds: &[u64], limits: Vec<usize>, after: Vec<usize>) -> Self {
            let progress = vec![vec![]; prompts.len()];
            let (stops, sampling) = (vec![None; prompts.len()], vec![None; prompts.len()]);
            LateFeed { prompts: prompts.to_vec(), seeds: seeds.to_vec(), limits, after, given: 0, empty_asks: 0, reads: 0, out: vec![], finished_order: vec![], progress, stop: None, stops, sampling }
        }
    }

    impl RowFeed for LateFeed {
        fn next_row(&mut self) -> Option<FedRow> {
            let r = self.given;
            if r >= self.prompts.len() {
                return None;
            }
            if self.after[r] > self.finished_order.len() {
                self.empty_asks += 1;
                return None;
            }
            self.given += 1;
            self.out.push(None);
            Some(FedRow { prompt: self.prompts[r].clone(), seed: self.seeds[r], limit: self.limits[r], stops: self.stops[r].clone(), sampling: self.sampling[r].clone() })
        }

        fn finished(&mut self, id: usize, g: Generation) {
            assert!(self.out[id].replace(g).is_none(), "row {id} finished twice");
            self.finished_order.push(id);
        }

        fn between_reads(&mut self) {
            self.reads += 1;
        }

        fn progressed(&mut self, id: usize, tokens: &[i64]) -> bool {
            assert!(self.out[id].is_none(), "row {id} went on after it finished");
            self.progress[id].push(tokens.to_vec());
            self.stop.is_none_or(|(row, n)| row != id || tokens.len() < n)
        }
    }

    #[test]
    fn rows_fed_while_the_decode_runs_get_their_static_batch_tokens_and_finish_as_they_end() {
        let m = tiny_model(Arch::Qwen2, 47);
        let (prompts, seeds) = ragged_prompts(7, m.cfg.vocab_size);
        for t in [0.0, 1.0] {
            let p = stop_params(&m, &prompts, &seeds, &params(t));
            let batch = generate(&m, None, &prompts, &seeds, &p).unwrap();
            let fits = prompts.iter().map(|pr| pr.len()).max().unwrap() + p.max_new_tokens;
            // Row 5 has no budget.
            let mut limits = vec![p.max_new_tokens; prompts.len()];
            limits[5] = 0;
            // Three slots: after the first row ends its slot idles (row 3 is not there yet) while
            // two rows decode on; row 6 comes only after row 5 (no budget) finished at once.
            let mut feed = LateFeed::new(&prompts, &seeds, limits, vec![0, 0, 0, 2, 3, 3, 5]);
            generate_fed(&m, None, &p, 3, fits, &mut feed).unwrap();
            assert_eq!(feed.given, prompts.len(), "T={t}: every row was taken");
            assert!(feed.empty_asks > 0, "T={t}: a slot waited for a row that came later");
            // On the CPU every step is read back, and the feed hears of each read.
            let longest = feed.out.iter().flatten().map(|g| g.tokens.len()).max().unwrap();
            assert!(feed.reads >= longest, "T={t}: {} reads for a row of {longest} tokens", feed.reads);
            for (row, (g, b)) in feed.out.iter().zip(&batch).enumerate() {
                let g = g.as_ref().unwrap_or_else(|| panic!("T={t}: row {row} never finished"));
                if row == 5 {
                    assert!(g.tokens.is_empty(), "T={t}: a row without budget samples nothing");
                    continue;
                }
                assert_eq!((&g.tokens, g.finish_reason), (&b.tokens, b.finish_reason), "T={t} row {row}");
                for (x, y) in g.logprobs.iter().zip(&b.logprobs) {
                    assert!((x - y).abs() < 1e-4, "T={t} row {row}: {x} vs {y}");
                }
            }
            // Rows are handed back as they end, not in row order at the end of the session.
            let mut sorted = feed.finished_order.clone();
            sorted.sort();
            assert_eq!(sorted, (0..prompts.len()).collect::<Vec<_>>());
            assert_ne!(feed.finished_order, sorted, "T={t}: {:?}", feed.finished_order);
            // The feed heard each going row's tokens after every read-back (on the CPU, one token
            // more each time), each a prefix of what the row ends with.
            for (row, (heard, b)) in feed.progress.iter().zip(&batch).enumerate() {
                let lens: Vec<usize> = heard.iter().map(Vec::len).collect();
                let want: Vec<usize> = if row == 5 { vec![] } else { (1..b.tokens.len()).collect() };
                assert_eq!(lens, want, "T={t} row {row}");
                assert!(heard.iter().all(|h| b.tokens.starts_with(h)), "T={t} row {row}");
            }
            // A row the feed stops (its client gone) ends with the tokens it has; its slot takes
            // the next row, and every other row samples as before.
            let stopped = (0..prompts.len()).find(|&r| r != 5 && batch[r].tokens.len() > 3).expect("a row of 4 tokens or more");
            let mut limits = vec![p.max_new_tokens; prompts.len()];
            limits[5] = 0;
            let mut feed = LateFeed::new(&prompts, &seeds, limits, vec![0, 0, 0, 2, 3, 3, 5]);
            feed.stop = Some((stopped, 2));
            generate_fed(&m, None, &p, 3, fits, &mut feed).unwrap();
            for (row, (g, b)) in feed.out.iter().zip(&batch).enumerate() {
                let g = g.as_ref().unwrap_or_else(|| panic!("T={t}: row {row} never finished"));
                let want = match row {
                    5 => &[][..],
                    r if r == stopped => &b.tokens[..2],
                    _ => &b.tokens[..],
                };
                assert_eq!(g.tokens, want, "T={t} row {row} (row {stopped} stopped)");
            }
        }
        // A row longer than the session's `fits` is an error naming it, not a cache overrun.
        let p = params(1.0);
        let mut feed = LateFeed::new(&[vec![1, 2, 3]], &[0], vec![8], vec![0]);
        let e = generate_fed(&m, None, &p, 2, 10, &mut feed).unwrap_err();
        assert!(e.to_string().contains("row 0: 3 prompt and 8 new tokens are more than the session's 10"), "{e}");
    }

    #[test]
    fn rows_with_their_own_stop_rules_and_budgets_end_as_each_would_alone() {
        let m = tiny_model(Arch::Qwen2, 47);
        let (prompts, seeds) = ragged_prompts(7, m.cfg.vocab_size);
        for t in [0.0, 1.0] {
            // The session's params stop at row 6's second free token; row 6 has rules of its own
            // (no stop token) and must run past it.
            let free = generate(&m, None, &prompts, &seeds, &params(t)).unwrap();
            let session = SamplingParams { stop_token_ids: vec![free[6].tokens[1]], ..params(t) };
            // Row r: a budget of its own, and (but for rows 0 and 4, which keep the session's
            // rules) a stop at the (r % 3 + 1)-th token it samples freely, or none (row 6).
            let own: Vec<Option<SamplingParams>> = (0..prompts.len())
                .map(|r| {
                    let at = (r % 3 + 1).min(free[r].tokens.len() - 1);
                    let ids = if r == 6 { vec![] } else { vec![free[r].tokens[at]] };
                    (r != 0 && r != 4).then(|| SamplingParams { max_new_tokens: 4 + r, stop_token_ids: ids, ..params(t) })
                })
                .collect();
            let alone: Vec<Generation> = (0..prompts.len())
                .map(|r| {
                    let p = own[r].clone().unwrap_or_else(|| session.clone());
                    generate(&m, None, &prompts[r..r + 1], &seeds[r..r + 1], &p).unwrap().remove(0)
                })
                .collect();
            let limits = own.iter().map(|o| o.as_ref().map_or(session.max_new_tokens, |p| p.max_new_tokens)).collect();
            let mut feed = LateFeed::new(&prompts, &seeds, limits, vec![0; prompts.len()]);
            feed.stops = own.iter().map(|o| o.as_ref().map(|p| StopRules::new(None, &p.stop_strings, &p.stop_token_ids))).collect();
            let fits = prompts.iter().map(|pr| pr.len()).max().unwrap() + session.max_new_tokens;
            generate_fed(&m, None, &session, 3, fits, &mut feed).unwrap();
            for (row, (g, a)) in feed.out.iter().zip(&alone).enumerate() {
                let g = g.as_ref().unwrap_or_else(|| panic!("T={t}: row {row} never finished"));
                assert_eq!((&g.tokens, g.finish_reason), (&a.tokens, a.finish_reason), "T={t} row {row}");
            }
            // Both ways of ending occur among the rows with rules of their own; row 6 ran past the
            // session's stop token to its own budget.
            let ends = |f: FinishReason| (0..prompts.len()).any(|r| own[r].is_some() && alone[r].finish_reason == f);
            assert!(ends(FinishReason::Stop) && ends(FinishReason::Length), "T={t}: {alone:?}");
            assert_eq!((alone[6].tokens.len(), alone[6].finish_reason), (10, FinishReason::Length), "T={t}");
        }
    }

    #[test]
    fn rows_sampling_from_their_own_distributions_get_what_each_gets_alone() {
        let m = tiny_model(Arch::Qwen2, 47);
        let (prompts, seeds) = ragged_prompts(7, m.cfg.vocab_size);
        let session = params(1.0);
        // Greedy, other temperatures, top-k and top-p; rows 0 and 5 keep the session's, row 4
        // brings the session's as its own.
        let own = |r: usize| -> Option<SamplingParams> {
            let p = |temperature, top_p, top_k| SamplingParams { temperature, top_p, top_k, ..params(1.0) };
            match r {
                1 => Some(p(0.0, 1.0, 0)),
                2 => Some(p(0.7, 1.0, 5)),
                3 | 6 => Some(p(1.3, 0.8, 0)),
                4 => Some(session.clone()),
                _ => None,
            }
        };
        let alone: Vec<Generation> = (0..prompts.len())
            .map(|r| generate(&m, None, &prompts[r..r + 1], &seeds[r..r + 1], &own(r).unwrap_or_else(|| session.clone())).unwrap().remove(0))
            .collect();
        let fits = prompts.iter().map(|pr| pr.len()).max().unwrap() + session.max_new_tokens;
        for slots in [2, 7] {
            let mut feed = LateFeed::new(&prompts, &seeds, vec![session.max_new_tokens; prompts.len()], vec![0; prompts.len()]);
            feed.sampling = (0..prompts.len()).map(own).collect();
            generate_fed(&m, None, &session, slots, fits, &mut feed).unwrap();
            for (row, (g, a)) in feed.out.iter().zip(&alone).enumerate() {
                let g = g.as_ref().unwrap_or_else(|| panic!("{slots} slots: row {row} never finished"));
                assert_eq!((&g.tokens, g.finish_reason), (&a.tokens, a.finish_reason), "{slots} slots, row {row}");
                // A batched step's products may round differently from a lone row's.
                for (x, y) in g.logprobs.iter().zip(&a.logprobs) {
                    assert!((x - y).abs() < 1e-4, "{slots} slots, row {row}: {x} vs {y}");
                }
            }
        }
        // The distributions differ where it shows: greedy row 1 alone is not what T = 1 gives it.
        let as_session = generate(&m, None, &prompts[1..2], &seeds[1..2], &session).unwrap().remove(0);
        assert_ne!(as_session.tokens, alone[1].tokens);
        // A captured step samples from one distribution: a row with another is an error naming it.
        let mut feed = LateFeed::new(&prompts, &seeds, vec![session.max_new_tokens; prompts.len()], vec![0; prompts.len()]);
        feed.sampling = (0..prompts.len()).map(own).collect();
        let e = fed(&m, Completions::new(None, &session, 0), &mut feed, 3, fits, 1, Steps::Static { graph: false }).unwrap_err();
        assert!(e.to_string().contains("row 1: its sampling distribution differs from the session's"), "{e}");
    }

    #[test]
    fn continuous_batching_within_the_context_budgets_each_row_by_its_own_prompt() {
        let m = tiny_model(Arch::Qwen2, 45);
        let ctx = m.cfg.max_position_embeddings as usize;
        let ids = |n: usize, k: i64| (0..n as i64).map(|i| (i * 7 + k) % m.cfg.vocab_size).collect::<Vec<i64>>();
        // Row 1's prompt leaves 5 tokens of context and row 2's none; rows 0 and 3 keep 12.
        let prompts = vec![ids(6, 1), ids(ctx - 5, 2), ids(ctx, 3), ids(9, 4)];
        let seeds = [1u64, 2, 3, 4];
        let p = SamplingParams { max_new_tokens: 12, ..params(1.0) };
        let mut seen = vec![];
        let got = generate_continuous_within_context(&m, None, &prompts, &seeds, &p, 2, Some(&mut |x| seen.push(x))).unwrap();
        let lens: Vec<usize> = got.iter().map(|g| g.tokens.len()).collect();
        assert_eq!(lens, vec![12, 5, 0, 12]);
        assert_eq!(seen.last().map(|x| x.rows_done), Some(4), "the row without budget counts as done");
        // Each row's tokens are those of its prompt decoded alone with its own budget.
        for (row, limit) in [(0, 12), (1, 5), (3, 12)] {
            let alone = SamplingParams { max_new_tokens: limit, ..p.clone() };
            let want = generate(&m, None, &prompts[row..=row], &seeds[row..=row], &alone).unwrap();
            assert_eq!(got[row].tokens, want[0].tokens, "row {row}");
        }
        // One budget for all rows (the static batch's rule) refuses the long prompts.
        let e = generate_continuous(&m, None, &prompts, &seeds, &p, 2).unwrap_err();
        assert!(matches!(e, ModelError::ContextOverflow { row: 1, .. }), "{e}");
    }

    #[test]
    fn continuous_batching_checks_requests_like_the_static_batch() {
        let m = tiny_model(Arch::Qwen3, 44);
        let e =
            generate_continuous(&m, None, &[vec![1i64; 500]], &[0], &SamplingParams { max_new_tokens: 20, ..params(1.0) }, 2).unwrap_err();
        assert!(
            matches!(e, ModelError::ContextOverflow { row: 0, .. }),
            "{e}"
        );
        let none = generate_continuous(
            &m,
            None,
            &[vec![1, 2]],
            &[0],
            &SamplingParams {
                max_new_tokens: 0,
                ..params(1.0)
            },
            2,
        )
        .unwrap();
        assert_eq!(none[0].tokens, Vec::<i64>::new());
    }

    fn params(t: f64) -> SamplingParams {
        SamplingParams {
            temperature: t,
            top_p: 0.9,
            top_k: 20,
            max_new_tokens: 12,
            ..Default::default()
        }
    }

    #[test]
    fn sampling_is_deterministic_per_seed_and_padding_invariant() {
        let m = tiny_model(Arch::Qwen2, 11);
        let prompts = vec![
            vec![1, 2, 3, 4, 5, 6, 7],
            vec![9, 8],
            vec![1, 2, 3, 4, 5, 6, 7],
        ];
        let a = generate(&m, None, &prompts, &[1, 2, 3], &params(1.0)).unwrap();
        let b = generate(&m, None, &prompts, &[1, 2, 3], &params(1.0)).unwrap();
        assert_eq!(a, b);
        // Same prompt, other seed: different sample (with overwhelming probability).
        assert_ne!(a[0].tokens, a[2].tokens);
        // A row's result does not depend on the padding added for the other rows.
        let alone = generate(&m, None, &prompts[1..2], &[2], &params(1.0)).unwrap();
        assert_eq!(alone[0].tokens, a[1].tokens);
        for g in &a {
            assert_eq!(g.tokens.len(), 12);
            assert_eq!(g.finish_reason, FinishReason::Length);
            assert!(g.logprobs.iter().all(|&l| l <= 0.0 && l.is_finite()));
            assert!(g
                .entropies
                .iter()
                .all(|&e| e >= 0.0 && e <= (20f32).ln() + 1e-4));
        }
    }

    /// The two-level cdf of CUDA picks the one-level cdf's token for every uniform except one
    /// within a rounding error of a cdf step: peaked, flat and filtered (zero-mass runs and whole
    /// zero chunks) rows, chunks that do and do not divide the vocabulary, u near 0 and near 1.
    #[test]
    fn chunked_inverse_cdf_picks_the_one_level_token() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let v = 1000i64;
        let mut rows: Vec<Vec<f32>> = Vec::new();
        for r in 0..24 {
            let sharp = [0.3f32, 3.0, 12.0][r % 3];
            let mut logits: Vec<f32> = (0..v).map(|_| rng.random::<f32>() * sharp).collect();
            if r % 4 == 1 {
                // Top-k style filtering: most tokens, and whole chunks, get no mass.
                for (i, l) in logits.iter_mut().enumerate() {
                    if i % 97 != 3 {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            rows.push(logits);
        }
        let b = rows.len() as i64;
        let flat: Vec<f32> = rows.concat();
        let probs = Tensor::from_slice(&flat).view([b, v]).softmax(-1, Kind::Float);
        let cdf = Vec::<f32>::try_from(probs.cumsum(-1, Kind::Float).view([-1])).unwrap();
        let mut mismatches = 0;
        for draw in 0..200 {
            let us: Vec<f32> = (0..b)
                .map(|i| match (draw, i) {
                    (0, _) => 1e-9,
                    (1, _) => 1.0 - 1e-7,
                    _ => rng.random::<f32>(),
                })
                .collect();
            let u = Tensor::from_slice(&us);
            let one = Vec::<i64>::try_from(inverse_cdf(&probs, &u)).unwrap();
            for chunk in [7i64, 64, 1000, 4096] {
                let two = Vec::<i64>::try_from(inverse_cdf_chunked(&probs, &u, chunk)).unwrap();
                for row in 0..b as usize {
                    let (a, c) = (one[row], two[row]);
                    assert!((0..v).contains(&c), "token {c} out of the vocabulary");
                    if a != c {
                        // u sits on the step between the two choices.
                        let step = cdf[row * v as usize + a.min(c) as usize];
                        assert!((step - us[row]).abs() < 1e-5, "row {row}, chunk {chunk}: {a} vs {c}, u {}", us[row]);
                        mismatches += 1;
                    }
                    let p_row = &flat[row * v as usize..(row + 1) * v as usize];
                    assert!(p_row[c as usize].is_finite(), "row {row}: a filtered token {c} drawn");
                }
            }
        }
        assert!(mismatches <= 5, "{mismatches} of 19,200 draws differ");
    }

    #[test]
    fn greedy_logprobs_match_teacher_forcing_and_stop_tokens_stop() {
        let m = tiny_model(Arch::Llama, 12);
        let prompt = vec![3, 1, 4, 1, 5];
        let g = generate(&m, None, std::slice::from_ref(&prompt), &[0], &params(0.0)).unwrap();
        let tf =
            crate::model::score::logprob(&m, &[(prompt.clone(), g[0].tokens.clone())], 1).unwrap();
        for (a, b) in g[0].logprobs.iter().zip(&tf[0]) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
        let stop_at = g[0].tokens[4];
        let first = g[0].tokens.iter().position(|&t| t == stop_at).unwrap();
        let p = SamplingParams {
            stop_token_ids: vec![stop_at],
            ..params(0.0)
        };
        let s = generate(&m, None, &[prompt], &[0], &p).unwrap();
        assert_eq!(s[0].tokens, g[0].tokens[..=first].to_vec());
        assert_eq!(s[0].finish_reason, FinishReason::Stop);
    }

    #[test]
    fn prompt_beyond_context_is_an_error() {
        let m = tiny_model(Arch::Qwen3, 13);
        let p = SamplingParams {
            max_new_tokens: 20,
            ..params(1.0)
        };
        let long = vec![vec![1i64; 500]];
        let e = generate(&m, None, &long, &[0], &p).unwrap_err();
        assert!(
            matches!(e, ModelError::ContextOverflow { row: 0, .. }),
            "{e}"
        );
        let e = generate(&m, None, &[vec![1, 99]], &[0], &p).unwrap_err();
        assert!(e.to_string().contains("99"), "{e}");
    }
}
