//! The causal decoder LM shared by all architectures: token embedding, a stack of
//! [`DecoderLayer`]s, a final RMSNorm and the (tied or untied) LM head. The per-architecture
//! modules ([`super::qwen2`], [`super::qwen3`], [`super::llama`]) only choose the layer options.
//!
//! Weights live in a `tch::nn::VarStore` whose variable names are the Hugging Face names
//! (`model.layers.0.self_attn.q_proj.weight`, …): the same model is used for inference and for
//! training with gradients and a `tch` optimizer over [`DecoderLm::vs`].

use tch::{nn, Device, Kind, Tensor};

use super::config::{Arch, ModelConfig};
use super::error::{ModelError, Result};
use super::layers::{AttnMask, DecoderLayer, FusedProjections, KvCache, RmsNorm, Rotary, INIT_STD};

/// Large negative additive bias for hidden keys (finite, so fully hidden rows never give NaN).
pub const MASKED: f64 = -1e30;

/// A decoder-only causal language model.
#[derive(Debug)]
pub struct DecoderLm {
    pub cfg: ModelConfig,
    pub vs: nn::VarStore,
    embed_tokens: Tensor,
    pub(super) layers: Vec<DecoderLayer>,
    pub(super) norm: RmsNorm,
    lm_head: Tensor,
    pub(super) rotary: Rotary,
}

impl DecoderLm {
    /// A model with freshly initialised weights (normal(0, 0.02), norms 1, biases 0) on
    /// `device`, in float32. Load weights with [`super::weights`] or train it.
    pub fn new(cfg: &ModelConfig, device: Device) -> Self {
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let model = &root / "model";
        let embed_tokens = (&model / "embed_tokens").var(
            "weight",
            &[cfg.vocab_size, cfg.hidden_size],
            nn::Init::Randn {
                mean: 0.,
                stdev: INIT_STD,
            },
        );
        let attn = match cfg.arch {
            Arch::Qwen2 => super::qwen2::attn_options(cfg),
            Arch::Qwen3 => super::qwen3::attn_options(cfg),
            Arch::Llama => super::llama::attn_options(cfg),
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| {
                DecoderLayer::new(
                    &model / "layers" / i,
                    cfg.hidden_size,
                    cfg.intermediate_size,
                    cfg.rms_norm_eps,
                    attn,
                    cfg.mlp_bias,
                )
            })
            .collect();
        let norm = RmsNorm::new(&model / "norm", cfg.hidden_size, cfg.rms_norm_eps);
        let lm_head = if cfg.tie_word_embeddings {
            embed_tokens.shallow_clone()
        } else {
            (&root / "lm_head").var(
                "weight",
                &[cfg.vocab_size, cfg.hidden_size],
                nn::Init::Randn {
                    mean: 0.,
                    stdev: INIT_STD,
                },
            )
        };
        let rotary = Rotary::new(cfg.head_dim, cfg.rope_theta, device);
        DecoderLm {
            cfg: cfg.clone(),
            vs,
            embed_tokens,
            layers,
            norm,
            lm_head,
            rotary,
        }
    }

    pub fn device(&self) -> Device {
        self.vs.device()
    }

    /// Parameter dtype (float32 or bfloat16).
    pub fn kind(&self) -> Kind {
        self.embed_tokens.kind()
    }

    /// Every variable with its Hugging Face name, sorted by name: the store's map iterates in a
    /// random order, and whatever walks the weights (init, optimizer state, comparisons) must
    /// see one order.
    pub fn sorted_variables(&self) -> Vec<(String, Tensor)> {
        let mut v: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Converts all weights to `kind` (e.g. `Kind::BFloat16`).
    pub fn set_kind(&mut self, kind: Kind) {
        self.vs.set_kind(kind);
    }

    /// Moves all weights (and the rotary tables) to `device`.
    pub fn to_device(&mut self, device: Device) {
        self.vs.set_device(device);
        self.rotary = Rotary::new(self.cfg.head_dim, self.cfg.rope_theta, device);
    }

    /// An empty KV cache for `batch` rows with room for `capacity` tokens.
    pub fn new_cache(&self, batch: i64, capacity: i64) -> KvCache {
        KvCache::new(
            self.cfg.num_hidden_layers,
            batch,
            self.cfg.num_key_value_heads,
            self.cfg.head_dim,
            capacity,
            self.kind(),
            self.device(),
        )
    }

    /// Checks token ids and lengths before they reach libtorch (which would abort on them).
    pub fn check_ids(&self, ids: &[i64], row: usize, past: usize) -> Result<()> {
        let max = self.cfg.max_position_embeddings as usize;
        if past + ids.len() > max {
            return Err(ModelError::ContextOverflow {
                row,
                len: past + ids.len(),
                max,
            });
        }
        if let Some(bad) = ids.iter().find(|&&t| t < 0 || t >= self.cfg.vocab_size) {
            return Err(ModelError::Request(format!(
                "row {row}: token id {bad} outside the vocabulary (size {})",
                self.cfg.vocab_size
            )));
        }
        Ok(())
    }

    /// Final hidden states `[B, L, D]` (after the last norm) for `input_ids: [B, L]` at integer
    /// `positions: [B, L]`, appending to `cache` when given.
    pub fn hidden(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        mask: &AttnMask,
        cache: Option<&mut KvCache>,
    ) -> Tensor {
        self.hidden_from_embeds(self.embed(input_ids), positions, mask, cache)
    }

    /// Every layer's [`FusedProjections`] (copies of the current weights).
    pub fn fused_projections(&self) -> Vec<FusedProjections> {
        tch::no_grad(|| self.layers.iter().map(DecoderLayer::fused_projections).collect())
    }

    /// What a decode loop passes to [`Self::hidden_decode`]: the fused projections on a GPU,
    /// where a decode step is paced by kernel launches; `None` on the CPU, whose decode keeps
    /// the separate products and so its outputs bit for bit (a stacked product may round
    /// otherwise). `RREDCOT_DECODE_FUSION=0` decodes a GPU with the separate products too (the
    /// path the CPU takes), to compare (bench/gpu.sh measures both).
    pub fn decode_projections(&self) -> Option<Vec<FusedProjections>> {
        let off = std::env::var("RREDCOT_DECODE_FUSION").is_ok_and(|v| v == "0");
        (self.device().is_cuda() && !off).then(|| self.fused_projections())
    }

    /// [`Self::hidden`], through `fused` ([`Self::fused_projections`]) where given.
    pub fn hidden_decode(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        mask: &AttnMask,
        cache: Option<&mut KvCache>,
        fused: Option<&[FusedProjections]>,
    ) -> Tensor {
        self.layers_from(self.embed(input_ids), positions, mask, cache, fused)
    }

    /// Input embeddings `[B, L, D]` of `input_ids: [B, L]`: what [`Self::hidden_from_embeds`]
    /// takes (e.g. as a leaf with `requires_grad` for gradient attribution).
    pub fn embed(&self, input_ids: &Tensor) -> Tensor {
        Tensor::embedding(&self.embed_tokens, input_ids, -1, false, false)
    }

    /// [`Self::hidden`] from given input embeddings `x: [B, L, D]` instead of token ids.
    pub fn hidden_from_embeds(
        &self,
        x: Tensor,
        positions: &Tensor,
        mask: &AttnMask,
        cache: Option<&mut KvCache>,
    ) -> Tensor {
        self.layers_from(x, positions, mask, cache, None)
    }

    /// Every layer over `x: [B, L, D]`, then the final norm; through `fused` where given.
    fn layers_from(
        &self,
        mut x: Tensor,
        positions: &Tensor,
        mask: &AttnMask,
        mut cache: Option<&mut KvCache>,
        fused: Option<&[FusedProjections]>,
    ) -> Tensor {
        let mut rope = self.rotary.tables(positions, x.kind());
        if fused.is_some() {
            rope = Rotary::with_signed_sin(rope);
        }
        for (i, layer) in self.layers.iter().enumerate() {
            let c = cache.as_deref_mut().map(|c| &mut c.layers[i]);
            x = layer.forward_with(&x, &rope, mask, c, fused.map(|f| &f[i]));
        }
        self.norm.forward(&x)
    }

    /// The training forward and backward of [`Self::forward`] (no mask, no cache) with activation
    /// checkpointing: the layers run without autograd keeping only each layer's input; `head`
    /// gets the final hidden states `[B, L, D]` (after the last norm) as a leaf that requires
    /// grad, computes the loss from them and runs its backward (so it may do that in pieces, see
    /// [`crate::train::step`]), leaving their gradient; then each layer runs forward again, one
    /// at a time, last first. Gradients accumulate into the variables as a plain backward would:
    /// the same values, with the memory of one layer's activations instead of all of them, for
    /// one extra forward pass.
    pub fn backward_checkpointed<R>(
        &self,
        input_ids: &Tensor,
        head: impl FnOnce(&Tensor) -> anyhow::Result<R>,
    ) -> anyhow::Result<R> {
        let (b, l) = input_ids.size2()?;
        let positions = Tensor::arange(l, (Kind::Int64, self.device()))
            .unsqueeze(0)
            .expand([b, l], false);
        let rope = self.rotary.tables(&positions, self.kind());
        let mask = AttnMask::Causal;
        let mut inputs = Vec::with_capacity(self.layers.len());
        let (last, hidden) = tch::no_grad(|| {
            let mut x = self.embed(input_ids);
            for layer in &self.layers {
                let y = layer.forward(&x, &rope, &mask, None);
                inputs.push(x);
                x = y;
            }
            let h = self.norm.forward(&x);
            (x, h)
        });
        let hidden = hidden.set_requires_grad(true);
        let out = head(&hidden)?;
        let top = last.set_requires_grad(true);
        // Backward of sum(y * dL/dy) gives a piece's parameters' and its input's gradients: the
        // final norm, then each layer again, last first.
        (self.norm.forward(&top) * hidden.grad()).sum(Kind::Float).backward();
        let mut grad = top.grad();
        for (layer, x) in self.layers.iter().zip(inputs).rev() {
            let x = x.set_requires_grad(true);
            let y = layer.forward(&x, &rope, &mask, None);
            (y * &grad).sum(Kind::Float).backward();
            grad = x.grad();
        }
        if self.embed_tokens.requires_grad() {
            (self.embed(input_ids) * &grad).sum(Kind::Float).backward();
        }
        Ok(out)
    }

    /// Hidden states of continuations that all share one prefix held in `prefix` (batch 1);
    /// see [`super::layers::Attention::forward_shared_prefix`].
    pub fn hidden_shared_prefix(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        prefix: &KvCache,
        prefix_bias: &Tensor,
        own_bias: &Tensor,
    ) -> Tensor {
        let mut x = self.embed(input_ids);
        let rope = self.rotary.tables(positions, x.kind());
        for (layer, kv) in self.layers.iter().zip(&prefix.layers) {
            x = layer.forward_shared_prefix(&x, &rope, kv, prefix_bias, own_bias);
        }
        self.norm.forward(&x)
    }

    /// LM head: hidden `[.., D]` to logits `[.., V]` (a decode step's few rows on the CPU
    /// through [`super::cpu_matmul`]).
    pub fn logits(&self, hidden: &Tensor) -> Tensor {
        super::cpu_matmul::linear(hidden, &self.lm_head, None)
            .unwrap_or_else(|| hidden.matmul(&self.lm_head.tr()))
    }

    /// Logits `[B, L, V]` for `input_ids: [B, L]` (int64), like `transformers`' `forward`.
    ///
    /// `attention_mask: [B, past + L]` (1 = real token, 0 = padding, left padding allowed)
    /// covers the cached and the new tokens; positions are its cumulative sum, as in
    /// `transformers`' `generate`. Without a mask every token is real and positions continue
    /// after the cache. With gradients enabled this is the training forward.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        cache: Option<&mut KvCache>,
    ) -> Result<Tensor> {
        Ok(self.logits(&self.forward_hidden(input_ids, attention_mask, cache)?))
    }

    /// [`Self::forward`] without the LM head: the final hidden states `[B, L, D]`, for callers
    /// that run the head in pieces ([`super::head`]).
    pub fn forward_hidden(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        cache: Option<&mut KvCache>,
    ) -> Result<Tensor> {
        let (b, l) = input_ids
            .size2()
            .map_err(|e| ModelError::Request(format!("input_ids must be [batch, len]: {e}")))?;
        let past = cache.as_ref().map_or(0, |c| c.len());
        if past + l > self.cfg.max_position_embeddings {
            return Err(ModelError::ContextOverflow {
                row: 0,
                len: (past + l) as usize,
                max: self.cfg.max_position_embeddings as usize,
            });
        }
        let (lo, hi) = (
            input_ids.min().int64_value(&[]),
            input_ids.max().int64_value(&[]),
        );
        if lo < 0 || hi >= self.cfg.vocab_size {
            return Err(ModelError::Request(format!(
                "token id outside the vocabulary (size {}): min {lo}, max {hi}",
                self.cfg.vocab_size
            )));
        }
        let dev = self.device();
        // Ids made on the host (or another device) follow the model.
        let input_ids = &input_ids.to_device(dev);
        let (positions, mask) = match attention_mask {
            None => {
                let pos = Tensor::arange_start(past, past + l, (Kind::Int64, dev))
                    .unsqueeze(0)
                    .expand([b, l], false);
                let mask = if past == 0 {
                    AttnMask::Causal
                } else if l == 1 {
                    AttnMask::Full
                } else {
                    AttnMask::Bias(causal_bias(b, l, past, None, self.kind(), dev))
                };
                (pos, mask)
            }
            Some(m) => {
                if m.size() != [b, past + l] {
                    return Err(ModelError::Request(format!(
                        "attention_mask shape {:?} != [batch, past + len] = {:?}",
                        m.size(),
                        [b, past + l]
                    )));
                }
                let m = m.to_device(dev).to_kind(Kind::Int64);
                let pos = (m.cumsum(-1, Kind::Int64) - 1)
                    .clamp_min(0)
                    .narrow(1, past, l);
                (
                    pos,
                    AttnMask::Bias(causal_bias(b, l, past, Some(&m), self.kind(), dev)),
                )
            }
        };
        Ok(self.hidden(input_ids, &positions, &mask, cache))
    }
}

/// Additive bias `[B, 1, L, past + L]`: query `i` (slot `past + i`) sees key slot `j` iff
/// `j <= past + i` and `key_mask[b, j] == 1`.
pub fn causal_bias(
    b: i64,
    l: i64,
    past: i64,
    key_mask: Option<&Tensor>,
    kind: Kind,
    dev: Device,
) -> Tensor {
    let s = past + l;
    let q = Tensor::arange_start(past, s, (Kind::Int64, dev)).view([l, 1]);
    let k = Tensor::arange(s, (Kind::Int64, dev)).view([1, s]);
    let mut visible = k
        .le_tensor(&q)
        .view([1, 1, l, s])
        .expand([b, 1, l, s], false);
    if let Some(m) = key_mask {
        visible = visible.logical_and(&m.ne(0).view([b, 1, 1, s]));
    }
    Tensor::zeros([b, 1, l, s], (kind, dev)).masked_fill(&visible.logical_not(), MASKED)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::score::tests::tiny_model;
    use tch::nn::OptimizerConfig;

    #[test]
    fn bf16_forward_tracks_f32() {
        let mut m = tiny_model(Arch::Qwen3, 21);
        let ids = Tensor::from_slice(&[1i64, 5, 9, 2, 33, 7]).view([1, 6]);
        let f32_logits = tch::no_grad(|| m.forward(&ids, None, None)).unwrap();
        m.set_kind(Kind::BFloat16);
        assert_eq!(m.kind(), Kind::BFloat16);
        let bf = tch::no_grad(|| m.forward(&ids, None, None))
            .unwrap()
            .to_kind(Kind::Float);
        let err = (bf - &f32_logits).abs().max().double_value(&[]);
        let scale = f32_logits.abs().max().double_value(&[]);
        assert!(
            err < 0.05 * scale.max(1.0),
            "bf16 error {err} vs scale {scale}"
        );
    }

    /// Gradients of every variable with activation checkpointing equal the plain backward's.
    #[test]
    fn checkpointed_backward_gives_the_plain_gradients() {
        let m = tiny_model(Arch::Qwen2, 23);
        let ids = Tensor::from_slice(&[3i64, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]).view([2, 6]);
        let loss_of = |h: &Tensor| {
            let logits = m.logits(h);
            (logits.log_softmax(-1, Kind::Float) * logits.softmax(-1, Kind::Float)).sum(Kind::Float) / 7.0
        };
        let grads = |m: &DecoderLm| -> Vec<(String, Tensor)> {
            let v: Vec<(String, Tensor)> = m.sorted_variables().into_iter().map(|(n, t)| (n, t.grad().copy())).collect();
            for (_, t) in m.vs.variables() {
                let _ = t.grad().zero_();
            }
            v
        };
        let plain_loss = loss_of(&m.hidden(&ids, &Tensor::arange(6, (Kind::Int64, Device::Cpu)).unsqueeze(0).expand([2, 6], false), &AttnMask::Causal, None));
        plain_loss.backward();
        let plain = grads(&m);
        let value = m
            .backward_checkpointed(&ids, |h| {
                let l = loss_of(h);
                l.backward();
                Ok(l.double_value(&[]))
            })
            .unwrap();
        let ckpt = grads(&m);
        assert!((value - plain_loss.double_value(&[])).abs() < 1e-6);
        assert_eq!(plain.len(), ckpt.len());
        for ((name, a), (_, b)) in plain.iter().zip(&ckpt) {
            let d = (a - b).abs().max().double_value(&[]);
            let scale = a.abs().max().double_value(&[]);
            assert!(scale > 0.0, "{name}: no gradient");
            assert!(d <= 1e-5 * scale.max(1e-3), "{name}: checkpointed gradient differs by {d} (scale {scale})");
        }
    }

    /// The fused decode path (q|k|v and gate|up stacked, rope by flip) gives the plain path's
    /// hidden states on every architecture, through a prefill and decode steps over one cache.
    #[test]
    fn fused_projections_decode_as_the_separate_ones() {
        for (arch, seed) in [(Arch::Qwen2, 31), (Arch::Qwen3, 32), (Arch::Llama, 33)] {
            let m = tiny_model(arch, seed);
            let fused = m.fused_projections();
            let ids = Tensor::from_slice(&[3i64, 1, 4, 1, 5, 9, 2, 6, 5, 3]).view([2, 5]);
            let pos = |from: i64, l: i64| Tensor::arange_start(from, from + l, (Kind::Int64, Device::Cpu)).unsqueeze(0).expand([2, l], false);
            let (mut plain, mut fast) = (m.new_cache(2, 8), m.new_cache(2, 8));
            tch::no_grad(|| {
                let a = m.hidden_decode(&ids.narrow(1, 0, 3), &pos(0, 3), &AttnMask::Causal, Some(&mut plain), None);
                let b = m.hidden_decode(&ids.narrow(1, 0, 3), &pos(0, 3), &AttnMask::Causal, Some(&mut fast), Some(&fused));
                let d = (&a - &b).abs().max().double_value(&[]);
                assert!(d < 1e-5, "{arch:?} prefill: fused differs by {d}");
                for t in 3..5 {
                    let step = ids.narrow(1, t, 1);
                    let a = m.hidden_decode(&step, &pos(t, 1), &AttnMask::Full, Some(&mut plain), None);
                    let b = m.hidden_decode(&step, &pos(t, 1), &AttnMask::Full, Some(&mut fast), Some(&fused));
                    let d = (&a - &b).abs().max().double_value(&[]);
                    assert!(a.abs().max().double_value(&[]) > 0.1);
                    assert!(d < 1e-5, "{arch:?} step {t}: fused differs by {d}");
                }
            });
        }
        // The decode loop uses them on a GPU only: the CPU keeps its outputs bit for bit.
        assert!(tiny_model(Arch::Qwen2, 34).decode_projections().is_none());
    }

    #[test]
    fn forward_with_cache_equals_full_forward_and_model_is_trainable() {
        let m = tiny_model(Arch::Qwen2, 22);
        let ids = Tensor::from_slice(&[3i64, 1, 4, 1, 5, 9, 2, 6]).view([1, 8]);
        let full = tch::no_grad(|| m.forward(&ids, None, None)).unwrap();
        let mut cache = m.new_cache(1, 2);
        let a = tch::no_grad(|| m.forward(&ids.narrow(1, 0, 5), None, Some(&mut cache))).unwrap();
        let b = tch::no_grad(|| m.forward(&ids.narrow(1, 5, 3), None, Some(&mut cache))).unwrap();
        let inc = Tensor::cat(&[a, b], 1);
        assert!((inc - &full).abs().max().double_value(&[]) < 1e-4);

        // One optimizer step on the VarStore lowers the next-token loss.
        let mut opt = nn::Adam::default().build(&m.vs, 1e-2).unwrap();
        let loss = |m: &DecoderLm| {
            let logits = m.forward(&ids.narrow(1, 0, 7), None, None).unwrap();
            logits
                .view([-1, m.cfg.vocab_size])
                .cross_entropy_for_logits(&ids.narrow(1, 1, 7).view([-1]))
        };
        let l0 = loss(&m);
        opt.backward_step(&l0);
        let l1 = loss(&m);
        assert!(l1.double_value(&[]) < l0.double_value(&[]), "{l0} -> {l1}");
        assert!(m
            .vs
            .variables()
            .contains_key("model.layers.1.self_attn.q_proj.bias"));
    }
}
