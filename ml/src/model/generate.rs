//! Batched sampling with a KV cache.
//!
//! Prompts are left-padded into one batch; positions come from the attention mask (as in
//! `transformers`' `generate`), so padded and unpadded rows produce the same tokens. Each row
//! draws its uniforms from its own ChaCha stream seeded by the row's seed, so a row's sample is a
//! deterministic function of (model, prompt, seed, params, batch) and independent of the global
//! torch RNG. Per step the host reads back only `[B, 4]` numbers (token, logprob, entropy,
//! finite flag), needed anyway to check stop conditions.
//!
//! `logprobs`/`entropies` are those of the *sampling distribution*: softmax(logits / T) after
//! top-k and top-p filtering. For greedy decoding (`temperature == 0`) they are those of the
//! unmodified model distribution softmax(logits).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use super::decoder::{DecoderLm, MASKED};
use super::error::{ModelError, Result};
use super::layers::AttnMask;
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

/// Samples the next token of every row from `logits: [B, V]` (float32); `uniforms: [B]`.
/// Returns `(tokens [B], logprobs [B], entropies [B], finite [B])`.
fn sample_step(
    logits: &Tensor,
    p: &SamplingParams,
    uniforms: &Tensor,
) -> (Tensor, Tensor, Tensor, Tensor) {
    let finite = logits.isfinite().all_dim(-1, false);
    let logits = logits.nan_to_num(0.0, 0.0, 0.0);
    let (token, logp) = if p.temperature <= 0.0 {
        (
            logits.argmax(-1, false),
            logits.log_softmax(-1, Kind::Float),
        )
    } else {
        let mut scaled = &logits / p.temperature;
        let v = scaled.size()[1];
        if p.top_k > 0 && p.top_k < v {
            let (vals, _) = scaled.topk(p.top_k, -1, true, true);
            let kth = vals.narrow(1, p.top_k - 1, 1);
            scaled = scaled.masked_fill(&scaled.lt_tensor(&kth), f64::NEG_INFINITY);
        }
        if p.top_p < 1.0 {
            let (sorted, idx) = scaled.sort(-1, true);
            let probs = sorted.softmax(-1, Kind::Float);
            // Drop a token when the mass before it already reaches top_p (keeps >= 1 token).
            let before = probs.cumsum(-1, Kind::Float) - &probs;
            let drop_sorted = before.ge(p.top_p);
            let drop = drop_sorted.scatter(-1, &idx, &drop_sorted);
            scaled = scaled.masked_fill(&drop, f64::NEG_INFINITY);
        }
        let logp = scaled.log_softmax(-1, Kind::Float);
        let cdf = logp.exp().cumsum(-1, Kind::Float);
        // Inverse-CDF sampling with the row's own uniform; clamp guards the cdf's last value
        // falling a rounding error below u.
        let token = cdf
            .lt_tensor(&uniforms.unsqueeze(-1))
            .sum_dim_intlist(-1, false, Kind::Int64)
            .clamp_max(v - 1);
        (token, logp)
    };
    let chosen = logp.gather(-1, &token.unsqueeze(-1), false).squeeze_dim(-1);
    let probs = logp.exp();
    let entropy = -(probs * logp.clamp_min(MASKED)).sum_dim_intlist(-1, false, Kind::Float);
    (token, chosen, entropy, finite)
}

/// Generates completions for `prompts` (token ids), one seed per row.
pub fn generate(
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
            AttnMask::Bias(super::decoder::causal_bias(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::Arch;
    use crate::model::score::tests::tiny_model;

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
