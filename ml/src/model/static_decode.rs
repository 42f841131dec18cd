//! The static batch's decode step with fixed shapes and every per-step value on the device: the
//! next token's position and cache column advance in place, the attention reads the whole cache
//! with the columns not yet written hidden by a bias made on the device, and the uniforms are
//! copied into a fixed tensor before each step. Such a step can be captured once as a CUDA graph
//! and replayed ([`super::cuda_graph`]): one launch per step instead of one per kernel (about 550
//! for a 28-layer model), which is what paces a decode step on a GPU (bench/results/gpu.json).
//!
//! The same step serves continuous batching's slots ([`StaticStep::slots`]): a slot is filled with
//! a prompt between steps, in place, and advances only while it decodes a row, so the captured
//! graph stays valid across refills.
//!
//! Run eagerly it gives the tokens of [`super::generate::generate`]'s own loops (tested on the
//! CPU): hidden columns get a bias of -1e30, whose exponent is exactly 0 in the softmax.

use tch::{Kind, Tensor};

use super::decoder::{DecoderLm, MASKED};
use super::generate::{fill_slot, sample_record, HeldPrompts, SamplingParams};
use super::layers::{AttnMask, FusedProjections, KvCache};

/// One row per prompt of a static batch after its prefill, or one per slot of continuous batching.
pub(super) struct StaticStep<'a> {
    model: &'a DecoderLm,
    fused: Option<Vec<FusedProjections>>,
    p: &'a SamplingParams,
    cache: KvCache,
    /// Next-token logits `[B, V]` (the model's dtype), overwritten by each step.
    logits: Tensor,
    /// This step's uniforms `[B]` (float32): [`Self::set_uniforms`] before each step.
    u: Tensor,
    /// Each row's next position `[B, 1]` and next cache column `[B]`.
    pos: Tensor,
    cols: Tensor,
    /// What each step adds to a row's position and column `[B]` (int64): 1, or 0 for a free slot.
    advance: Tensor,
    /// `[B, 1, 1, capacity]`: the prompt's padding hidden, 0 elsewhere.
    pad_bias: Tensor,
    /// `[1, 1, 1, capacity]` column numbers.
    keys: Tensor,
    held: HeldPrompts,
}

impl<'a> StaticStep<'a> {
    /// `cache` holds the prefilled prompts in columns `0..column` and has room for every new
    /// token; `logits` are the prefill's last; `next_pos: [B, 1]`; `pad_bias: [B, 1, 1, capacity]`
    /// or `None` without padding.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        model: &'a DecoderLm,
        fused: Option<Vec<FusedProjections>>,
        p: &'a SamplingParams,
        mut cache: KvCache,
        logits: Tensor,
        next_pos: &Tensor,
        column: i64,
        pad_bias: Option<Tensor>,
    ) -> Self {
        let (b, cap, dev) = (cache.batch(), cache.capacity(), model.device());
        let cols = Tensor::full([b], column, (Kind::Int64, dev));
        // Once: the cache's write index views `cols`, which each step advances in place.
        cache.write_rows_at(&cols, cap);
        StaticStep {
            model,
            fused,
            p,
            cache,
            logits,
            u: Tensor::zeros([b], (Kind::Float, dev)),
            pos: next_pos.copy(),
            cols,
            advance: Tensor::ones([b], (Kind::Int64, dev)),
            pad_bias: pad_bias.unwrap_or_else(|| Tensor::zeros([b, 1, 1, cap], (model.kind(), dev))),
            keys: Tensor::arange(cap, (Kind::Int64, dev)).view([1, 1, 1, cap]),
            held: HeldPrompts::default(),
        }
    }

    /// `cache`'s rows as free slots of continuous batching, each at column 0: [`Self::fill`]
    /// puts a prompt in one. A slot's position is its cache column (its prompt starts at 0).
    pub(super) fn slots(
        model: &'a DecoderLm,
        fused: Option<Vec<FusedProjections>>,
        p: &'a SamplingParams,
        cache: KvCache,
    ) -> Self {
        let (b, dev) = (cache.batch(), model.device());
        let logits = Tensor::zeros([b, model.cfg.vocab_size], (model.kind(), dev));
        let mut step = StaticStep::new(model, fused, p, cache, logits, &Tensor::zeros([b, 1], (Kind::Int64, dev)), 0, None);
        let _ = step.advance.zero_();
        step
    }

    /// Prefills `prompt` alone into slot `s` (its cache columns from 0, its logits row; copied
    /// from a slot that holds the same prompt), which decodes from the next step
    /// on. In place: a captured graph reads the new row.
    pub(super) fn fill(&mut self, s: usize, prompt: &[i64]) {
        let len = fill_slot(self.model, prompt, s, &mut self.cache, &mut self.logits, &mut self.held);
        let s = s as i64;
        let _ = self.cols.narrow(0, s, 1).fill_(len);
        let _ = self.pos.narrow(0, s, 1).fill_(len);
        let _ = self.advance.narrow(0, s, 1).fill_(1);
    }

    /// Slot `s` stops advancing: it keeps writing at its column, which no live row reads.
    pub(super) fn free(&mut self, s: usize) {
        let _ = self.advance.narrow(0, s as i64, 1).fill_(0);
    }

    /// Sets the uniforms the next step samples with (`[B]`, on the device).
    pub(super) fn set_uniforms(&mut self, u: &Tensor) {
        self.u.copy_(u);
    }

    /// Samples every row's token from the current logits and runs the model on it (its keys
    /// and values written at the row's column): returns the `[B, 4]` record (token, logprob,
    /// entropy, finite flag). Under a CUDA graph the record is the same tensor at every replay.
    pub(super) fn run(&mut self) -> Tensor {
        let (rec, tok) = sample_record(&self.logits, self.p, &self.u);
        let unwritten = self.keys.gt_tensor(&self.cols.view([self.cache.batch(), 1, 1, 1]));
        let mask = AttnMask::Bias(self.pad_bias.masked_fill(&unwritten, MASKED));
        let h = self.model.hidden_decode(&tok.unsqueeze(-1), &self.pos, &mask, Some(&mut self.cache), self.fused.as_deref());
        self.logits.copy_(&self.model.logits(&h.squeeze_dim(1)));
        let _ = self.pos.g_add_(&self.advance.view([self.cache.batch(), 1]));
        let _ = self.cols.g_add_(&self.advance);
        rec
    }
}
