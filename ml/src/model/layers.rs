//! Building blocks shared by the decoder architectures: linear projections, RMSNorm, rotary
//! position embeddings, the SwiGLU MLP, grouped-query attention and the explicit KV cache.
//!
//! Every block is created from a `tch::nn::Path` whose variable names are the Hugging Face ones
//! (`q_proj.weight`, `input_layernorm.weight`, …), so a `VarStore` of a model *is* a Hugging Face
//! state dict and the same weights can be trained with a `tch` optimizer.
//!
//! The KV cache is a value the caller owns and passes to `forward` (as `transformers`' `Cache`
//! objects), not hidden state in the layers: scoring forks and expands caches per batch row.

use tch::{nn, Kind, Tensor};

/// Standard deviation of the normal init of fresh (untrained) weights, as `initializer_range`.
pub const INIT_STD: f64 = 0.02;

/// `y = x Wᵀ + b` with `W: [out, in]` (the Hugging Face / PyTorch layout).
#[derive(Debug)]
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    pub fn new(vs: nn::Path, in_dim: i64, out_dim: i64, bias: bool) -> Self {
        let init = nn::Init::Randn {
            mean: 0.,
            stdev: INIT_STD,
        };
        let weight = vs.var("weight", &[out_dim, in_dim], init);
        let bias = bias.then(|| vs.zeros("bias", &[out_dim]));
        Linear { weight, bias }
    }

    /// `x · Wᵀ + b`; a decode step's few rows on the CPU through [`super::cpu_matmul`].
    pub fn forward(&self, x: &Tensor) -> Tensor {
        super::cpu_matmul::linear(x, &self.weight, self.bias.as_ref())
            .unwrap_or_else(|| x.linear(&self.weight, self.bias.as_ref()))
    }

    /// The projections `parts` (same input) as one: weights stacked by output row, biases
    /// likewise, so one matrix product gives their outputs side by side.
    fn stacked(parts: &[&Linear]) -> Linear {
        let weights: Vec<&Tensor> = parts.iter().map(|p| &p.weight).collect();
        let biases: Option<Vec<&Tensor>> = parts.iter().map(|p| p.bias.as_ref()).collect();
        Linear { weight: Tensor::cat(&weights, 0), bias: biases.map(|b| Tensor::cat(&b, 0)) }
    }
}

/// Root-mean-square layer norm, computed in float32 like `transformers` (`Qwen2RMSNorm`).
#[derive(Debug)]
pub struct RmsNorm {
    pub weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    pub fn new(vs: nn::Path, size: i64, eps: f64) -> Self {
        RmsNorm {
            weight: vs.ones("weight", &[size]),
            eps,
        }
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        if x.device().is_cuda() && !x.requires_grad() {
            // In inference, PyTorch's fused kernel (float accumulation): one launch instead of
            // eight, which set the pace of a decode step on a GPU. Training keeps the exact ops
            // (under autograd torch 2.11's fused path gave other values: a checkpointed loss off
            // by 4%, tests/gpu.rs), and so does the CPU, where torch 2.13's `rms_norm` is these
            // same ops (`rms_norm_composite`, perf), no faster.
            let d = *x.size().last().expect("a hidden dimension");
            return x.rms_norm([d], Some(&self.weight), self.eps);
        }
        let kind = x.kind();
        let xf = x.to_kind(Kind::Float);
        let var = xf.square().mean_dim(-1, true, Kind::Float);
        (xf * (var + self.eps).rsqrt()).to_kind(kind) * &self.weight
    }
}

/// Rotary position embedding (non-interleaved "rotate half" layout of Hugging Face).
#[derive(Debug)]
pub struct Rotary {
    inv_freq: Tensor,
}

/// `cos`/`sin` tables for one forward call, shaped `[B, 1, L, head_dim]`.
#[derive(Debug)]
pub struct RopeTables {
    pub cos: Tensor,
    pub sin: Tensor,
    /// `sin` with its first half negated, for [`Rotary::apply_flipped`] (the fused decode path
    /// alone makes it: [`Rotary::with_signed_sin`]).
    pub sin_signed: Option<Tensor>,
}

impl Rotary {
    /// `inv_freq = 1 / theta^(2i/d)`, computed in float32 exactly as `transformers` does.
    pub fn new(head_dim: i64, theta: f64, device: tch::Device) -> Self {
        let exponent = Tensor::arange_start_step(0, head_dim, 2, (Kind::Int64, device))
            .to_kind(Kind::Float)
            / head_dim as f64;
        let inv_freq = Tensor::pow_scalar(theta, &exponent).reciprocal();
        Rotary { inv_freq }
    }

    /// Tables for integer positions `[B, L]`.
    pub fn tables(&self, positions: &Tensor, kind: Kind) -> RopeTables {
        let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * self.inv_freq.unsqueeze(0);
        let emb = Tensor::cat(&[&freqs, &freqs], -1).unsqueeze(1);
        RopeTables {
            cos: emb.cos().to_kind(kind),
            sin: emb.sin().to_kind(kind),
            sin_signed: None,
        }
    }

    /// `t` with the signed sine [`Self::apply_flipped`] reads (two launches per forward, not per
    /// layer).
    pub fn with_signed_sin(mut t: RopeTables) -> RopeTables {
        let half = t.sin.size()[3] / 2;
        t.sin_signed = Some(Tensor::cat(&[&t.sin.narrow(3, 0, half).neg(), &t.sin.narrow(3, half, half)], 3));
        t
    }

    /// Rotates `x: [B, H, L, head_dim]`.
    pub fn apply(x: &Tensor, t: &RopeTables) -> Tensor {
        let half = x.size()[3] / 2;
        let x1 = x.narrow(3, 0, half);
        let x2 = x.narrow(3, half, half);
        let rotated = Tensor::cat(&[&x2.neg(), &x1], 3);
        x * &t.cos + rotated * &t.sin
    }

    /// [`Self::apply`] with two launches fewer: the halves swapped by one `flip`, times the sine
    /// whose first half is negated. `(-x2)·s` and `x2·(-s)` are the same number, so the result is
    /// bit for bit `apply`'s. Needs tables from [`Self::with_signed_sin`].
    pub fn apply_flipped(x: &Tensor, t: &RopeTables) -> Tensor {
        let half = x.size()[3] / 2;
        let sin = t.sin_signed.as_ref().expect("rope tables made by Rotary::with_signed_sin");
        let swapped = x.unflatten(3, [2, half]).flip([3]).flatten(3, 4);
        x * &t.cos + swapped * sin
    }
}

/// Inference copies of one layer's projections that read the same input, side by side: q|k|v
/// and gate|up. A decode step then runs two matrix products where it ran five; on a GPU a
/// decode step is paced by kernel launches, not arithmetic. Copies, not the weights themselves:
/// the named Hugging Face variables stay what loading, saving and training use, and a copy
/// made for one generation cannot go stale under an optimizer step.
#[derive(Debug)]
pub struct FusedProjections {
    pub(super) qkv: Linear,
    pub(super) gate_up: Linear,
}

/// SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`.
#[derive(Debug)]
pub struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    pub fn new(vs: nn::Path, hidden: i64, intermediate: i64, bias: bool) -> Self {
        Mlp {
            gate_proj: Linear::new(&vs / "gate_proj", hidden, intermediate, bias),
            up_proj: Linear::new(&vs / "up_proj", hidden, intermediate, bias),
            down_proj: Linear::new(&vs / "down_proj", intermediate, hidden, bias),
        }
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        let g = self.gate_proj.forward(x).silu();
        self.down_proj.forward(&(g * self.up_proj.forward(x)))
    }

    /// [`Self::forward`] with gate and up as one product (`gate_up` = [`Linear::stacked`]).
    pub(super) fn forward_fused(&self, x: &Tensor, gate_up: &Linear) -> Tensor {
        let y = gate_up.forward(x);
        let i = self.up_proj.weight.size()[0];
        self.down_proj.forward(&(y.narrow(-1, 0, i).silu() * y.narrow(-1, i, i)))
    }
}

/// Which keys each query may see.
#[derive(Debug)]
pub enum AttnMask {
    /// Every cached and new key is visible (one new token per row, no padding).
    Full,
    /// Plain causal attention over the new tokens, no cache before them, no padding.
    Causal,
    /// Additive bias `[B, 1, L, S]` (0 = visible, a large negative number = hidden), `S` =
    /// cached + new keys.
    Bias(Tensor),
}

/// Keys and values of one layer for a batch: `[B, n_kv_heads, capacity, head_dim]`, of which
/// the first `len` slots are filled.
#[derive(Debug)]
pub struct LayerKv {
    k: Tensor,
    v: Tensor,
    len: i64,
    /// Per-row write columns (continuous batching): see [`KvCache::write_rows_at`].
    rows_at: Option<RowsAt>,
}

/// Where each row writes its one new token, and how many columns the attention reads.
#[derive(Debug)]
struct RowsAt {
    /// `[B, n_kv, 1, hd]` column index of every row (on the cache's device).
    index: Tensor,
    /// Columns read by the attention (the largest column written + 1).
    read: i64,
}

impl LayerKv {
    /// Appends `[B, n_kv, L, hd]` keys/values (growing the buffers if needed) and returns views
    /// of everything cached so far. With per-row columns set, writes each row's single new
    /// token at its own column instead (in place, no copy of the cache).
    fn append(&mut self, k: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        if let Some(at) = &self.rows_at {
            let _ = self.k.scatter_(2, &at.index, k);
            let _ = self.v.scatter_(2, &at.index, v);
            return (self.k.narrow(2, 0, at.read), self.v.narrow(2, 0, at.read));
        }
        let l = k.size()[2];
        let cap = self.k.size()[2];
        if self.len + l > cap {
            let new_cap = (self.len + l).max(cap * 2);
            let grow = |t: &Tensor| {
                let mut s = t.size();
                s[2] = new_cap - cap;
                Tensor::cat(
                    &[t, &Tensor::zeros(s.as_slice(), (t.kind(), t.device()))],
                    2,
                )
            };
            self.k = grow(&self.k);
            self.v = grow(&self.v);
        }
        self.k.narrow(2, self.len, l).copy_(k);
        self.v.narrow(2, self.len, l).copy_(v);
        self.len += l;
        (self.k.narrow(2, 0, self.len), self.v.narrow(2, 0, self.len))
    }

    /// Filled keys and values, `[B, n_kv, len, hd]`.
    pub fn kv(&self) -> (Tensor, Tensor) {
        (self.k.narrow(2, 0, self.len), self.v.narrow(2, 0, self.len))
    }
}

/// The KV cache of a whole model for a batch of rows; explicit state owned by the caller.
#[derive(Debug)]
pub struct KvCache {
    pub layers: Vec<LayerKv>,
}

impl KvCache {
    /// An empty cache with room for `capacity` tokens per row (it grows if exceeded).
    pub fn new(
        n_layers: i64,
        batch: i64,
        n_kv_heads: i64,
        head_dim: i64,
        capacity: i64,
        kind: Kind,
        device: tch::Device,
    ) -> Self {
        let shape = [batch, n_kv_heads, capacity.max(1), head_dim];
        let layers = (0..n_layers)
            .map(|_| LayerKv {
                k: Tensor::zeros(shape, (kind, device)),
                v: Tensor::zeros(shape, (kind, device)),
                len: 0,
                rows_at: None,
            })
            .collect();
        KvCache { layers }
    }

    /// Tokens cached per row.
    pub fn len(&self) -> i64 {
        self.layers.first().map_or(0, |l| l.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps the first `len` cached tokens of every row (later appends overwrite the rest).
    pub fn truncate(&mut self, len: i64) {
        for l in &mut self.layers {
            l.len = l.len.min(len);
        }
    }

    /// An empty cache for row `row` alone that writes into this cache's buffers (a view, not a
    /// copy): a prompt prefilled through it lands in that row's slot, from column 0.
    pub fn row_view(&self, row: i64) -> KvCache {
        let layers = self
            .layers
            .iter()
            .map(|l| LayerKv {
                k: l.k.narrow(0, row, 1),
                v: l.v.narrow(0, row, 1),
                len: 0,
                rows_at: None,
            })
            .collect();
        KvCache { layers }
    }

    /// Copies row `from`'s first `len` columns into row `to` (in place: a captured graph reads
    /// them): a prompt prefilled once serves another slot.
    pub fn copy_row_prefix(&mut self, from: i64, to: i64, len: i64) {
        for l in &mut self.layers {
            for t in [&l.k, &l.v] {
                t.narrow(0, to, 1).narrow(2, 0, len).copy_(&t.narrow(0, from, 1).narrow(2, 0, len));
            }
        }
    }

    /// Rows `start..start + len` of this cache as a cache of their own that writes into this
    /// one's buffers (views, not copies), with nothing cached: for a forward that writes each
    /// row's columns itself ([`Self::write_rows_at`]).
    pub fn rows_view(&self, start: i64, len: i64) -> KvCache {
        let layers = self
            .layers
            .iter()
            .map(|l| LayerKv { k: l.k.narrow(0, start, len), v: l.v.narrow(0, start, len), len: 0, rows_at: None })
            .collect();
        KvCache { layers }
    }

    /// Makes the next forward (one new token per row) write row `b`'s keys and values at
    /// column `columns[b]` (`[B]` int64, on the cache's device) and attend over the first
    /// `read` columns, so rows of different lengths share one batch without padding between
    /// prompt and completion (continuous batching). The caller masks each row's unused columns.
    pub fn write_rows_at(&mut self, columns: &Tensor, read: i64) {
        for l in &mut self.layers {
            let s = l.k.size();
            let index = columns
                .view([s[0], 1, 1, 1])
                .expand([s[0], s[1], 1, s[3]], false);
            l.rows_at = Some(RowsAt { index, read });
        }
    }

    /// Columns per row the buffers hold.
    pub fn capacity(&self) -> i64 {
        self.layers.first().map_or(0, |l| l.k.size()[2])
    }

    /// Rows in the cache.
    pub fn batch(&self) -> i64 {
        self.layers.first().map_or(0, |l| l.k.size()[0])
    }

    /// The first `lens[b]` cached tokens of every row `b`, laid end to end as one row (a batch-1
    /// cache of Σ lens tokens). Each part keeps its own rotary positions, so a query that masks
    /// every key outside one part attends exactly as it would to that row alone.
    pub fn packed(&self, lens: &[i64]) -> KvCache {
        let total: i64 = lens.iter().sum();
        let layers = self
            .layers
            .iter()
            .map(|l| {
                let cat = |t: &Tensor| {
                    let parts: Vec<Tensor> =
                        lens.iter().enumerate().map(|(b, &n)| t.narrow(0, b as i64, 1).narrow(2, 0, n)).collect();
                    Tensor::cat(&parts, 2)
                };
                LayerKv { k: cat(&l.k), v: cat(&l.v), len: total, rows_at: None }
            })
            .collect();
        KvCache { layers }
    }

    /// A new cache holding rows `rows` of this one (repeats allowed: expands a shared prefix to
    /// a batch), with `extra` free slots for new tokens. The source is untouched (a fork).
    pub fn select_rows(&self, rows: &[i64], extra: i64) -> KvCache {
        let layers = self
            .layers
            .iter()
            .map(|l| {
                let idx = Tensor::from_slice(rows).to_device(l.k.device());
                let take = |t: &Tensor| {
                    let filled = t.narrow(2, 0, l.len).index_select(0, &idx);
                    let mut s = filled.size();
                    s[2] = extra.max(1);
                    Tensor::cat(
                        &[
                            &filled,
                            &Tensor::zeros(s.as_slice(), (t.kind(), t.device())),
                        ],
                        2,
                    )
                };
                LayerKv {
                    k: take(&l.k),
                    v: take(&l.v),
                    len: l.len,
                    rows_at: None,
                }
            })
            .collect();
        KvCache { layers }
    }
}

/// Options that distinguish the attention blocks of the architectures.
#[derive(Debug, Clone, Copy)]
pub struct AttnOptions {
    pub n_heads: i64,
    pub n_kv_heads: i64,
    pub head_dim: i64,
    /// Bias on q/k/v projections (Qwen2).
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    /// RMSNorm over each head of q and k before RoPE (Qwen3), with this epsilon.
    pub qk_norm_eps: Option<f64>,
}

/// Multi-head attention with grouped key/value heads and rotary embeddings.
#[derive(Debug)]
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    pub(super) o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    o: AttnOptions,
}

impl Attention {
    pub fn new(vs: nn::Path, hidden: i64, o: AttnOptions) -> Self {
        let (h, kv, d) = (o.n_heads, o.n_kv_heads, o.head_dim);
        Attention {
            q_proj: Linear::new(&vs / "q_proj", hidden, h * d, o.qkv_bias),
            k_proj: Linear::new(&vs / "k_proj", hidden, kv * d, o.qkv_bias),
            v_proj: Linear::new(&vs / "v_proj", hidden, kv * d, o.qkv_bias),
            o_proj: Linear::new(&vs / "o_proj", h * d, hidden, o.o_bias),
            q_norm: o
                .qk_norm_eps
                .map(|eps| RmsNorm::new(&vs / "q_norm", d, eps)),
            k_norm: o
                .qk_norm_eps
                .map(|eps| RmsNorm::new(&vs / "k_norm", d, eps)),
            o,
        }
    }

    /// Projects `x: [B, L, D]` to rotated `q: [B, H, L, hd]` and `k, v: [B, KV, L, hd]`.
    pub(super) fn qkv(&self, x: &Tensor, rope: &RopeTables) -> (Tensor, Tensor, Tensor) {
        let (b, l) = (x.size()[0], x.size()[1]);
        let heads = |t: Tensor, n: i64| t.view([b, l, n, self.o.head_dim]);
        let mut q = heads(self.q_proj.forward(x), self.o.n_heads);
        let mut k = heads(self.k_proj.forward(x), self.o.n_kv_heads);
        let v = heads(self.v_proj.forward(x), self.o.n_kv_heads).transpose(1, 2);
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            q = qn.forward(&q);
            k = kn.forward(&k);
        }
        // One rotation over the query and key heads together: half the kernel launches, which
        // set the pace of a decode step on a GPU (elementwise, so the same numbers).
        let (h, kv) = (self.o.n_heads, self.o.n_kv_heads);
        let qk = Rotary::apply(&Tensor::cat(&[&q, &k], 2).transpose(1, 2), rope);
        (qk.narrow(1, 0, h), qk.narrow(1, h, kv), v)
    }

    /// [`Self::qkv`] from one product with `qkv` (= [`Linear::stacked`] q|k|v): the query and key
    /// heads are already side by side in its output, so they rotate together without a `cat`
    /// (Qwen3 normalises each head first and concatenates), by [`Rotary::apply_flipped`].
    pub(super) fn qkv_fused(&self, x: &Tensor, rope: &RopeTables, qkv: &Linear) -> (Tensor, Tensor, Tensor) {
        let (b, l) = (x.size()[0], x.size()[1]);
        let (h, kv, d) = (self.o.n_heads, self.o.n_kv_heads, self.o.head_dim);
        let y = qkv.forward(x);
        let part = |from: i64, n: i64| y.narrow(-1, from * d, n * d).view([b, l, n, d]);
        let v = part(h + kv, kv).transpose(1, 2);
        let qk = match (&self.q_norm, &self.k_norm) {
            (Some(qn), Some(kn)) => Tensor::cat(&[qn.forward(&part(0, h)), kn.forward(&part(h, kv))], 2),
            _ => part(0, h + kv),
        };
        let qk = Rotary::apply_flipped(&qk.transpose(1, 2), rope);
        (qk.narrow(1, 0, h), qk.narrow(1, h, kv), v)
    }

    /// Repeats key/value heads to match the query heads (grouped-query attention).
    fn repeat_kv(&self, t: &Tensor) -> Tensor {
        let groups = self.o.n_heads / self.o.n_kv_heads;
        if groups == 1 {
            return t.shallow_clone();
        }
        let s = t.size();
        t.unsqueeze(2)
            .expand([s[0], s[1], groups, s[2], s[3]], false)
            .reshape([s[0], s[1] * groups, s[2], s[3]])
    }

    fn out(&self, y: &Tensor) -> Tensor {
        let s = y.size();
        let y = y.transpose(1, 2).reshape([s[0], s[2], s[1] * s[3]]);
        self.o_proj.forward(&y)
    }

    /// Attention of rotated `q` over `k`, `v` (appended to `cache` first), projected out.
    pub(super) fn attend(&self, q: Tensor, k: Tensor, v: Tensor, mask: &AttnMask, cache: Option<&mut LayerKv>) -> Tensor {
        let (k, v) = match cache {
            Some(c) => c.append(&k, &v),
            None => (k, v),
        };
        // In inference, attention reads grouped key/value heads itself (no copy of the cache per
        // step). On the CPU, PyTorch's flash kernel does it with any mask and the same numbers
        // bit for bit (a decode step's attention 3-5x faster at batch 32-128, 120-160 cached
        // tokens); on a GPU, flash attention does it in bf16/f16 but takes no bias, so masked
        // attention repeats the heads. Training repeats them everywhere (its backward keeps the
        // path every test covers).
        let native_gqa = !q.requires_grad()
            && match q.device() {
                tch::Device::Cpu => true,
                _ => {
                    matches!(q.kind(), Kind::BFloat16 | Kind::Half)
                        && !matches!(mask, AttnMask::Bias(_))
                }
            };
        let groups = self.o.n_heads / self.o.n_kv_heads;
        if !native_gqa && !q.requires_grad() && q.size()[2] == 1 && groups > 1 && !matches!(mask, AttnMask::Causal) {
            return self.out(&attend_grouped(&q, &k, &v, mask, groups));
        }
        let (k, v) = if native_gqa {
            (k, v)
        } else {
            (self.repeat_kv(&k), self.repeat_kv(&v))
        };
        let y = match mask {
            AttnMask::Full => Tensor::scaled_dot_product_attention::<Tensor>(
                &q, &k, &v, None, 0., false, None, native_gqa,
            ),
            AttnMask::Causal => Tensor::scaled_dot_product_attention::<Tensor>(
                &q, &k, &v, None, 0., true, None, native_gqa,
            ),
            AttnMask::Bias(b) => Tensor::scaled_dot_product_attention(
                &q, &k, &v, Some(b), 0., false, None, native_gqa,
            ),
        };
        self.out(&y)
    }

    /// Attention for many continuations that share one prefix: `x: [M, L, D]` are the
    /// continuation tokens; `prefix_k/v: [1, KV, N, hd]` the shared prefix (computed once);
    /// `prefix_bias: [M, 1, 1, N]` hides the prefix keys beyond each row's cut point and
    /// `own_bias: [M, 1, L, L]` is causal attention within the continuation (plus padding).
    pub fn forward_shared_prefix(
        &self,
        x: &Tensor,
        rope: &RopeTables,
        prefix_k: &Tensor,
        prefix_v: &Tensor,
        prefix_bias: &Tensor,
        own_bias: &Tensor,
    ) -> Tensor {
        let (q, k, v) = self.qkv(x, rope);
        let (pk, pv) = (self.repeat_kv(prefix_k), self.repeat_kv(prefix_v));
        let (k, v) = (self.repeat_kv(&k), self.repeat_kv(&v));
        let scale = 1.0 / (self.o.head_dim as f64).sqrt();
        // Scores against the shared prefix without materialising it per row: fold the M rows
        // into the query-length dimension, `[H, M*L, hd] @ [H, hd, N]`.
        let (m, h, l, d) = (q.size()[0], q.size()[1], q.size()[2], q.size()[3]);
        let q_fold = q.permute([1, 0, 2, 3]).reshape([h, m * l, d]);
        let n_prefix = pk.size()[2];
        let s_prefix = (q_fold.matmul(&pk.squeeze_dim(0).transpose(-1, -2)) * scale)
            .view([h, m, l, n_prefix])
            .permute([1, 0, 2, 3])
            + prefix_bias;
        let s_own = q.matmul(&k.transpose(-1, -2)) * scale + own_bias;
        let n = s_prefix.size()[3];
        let p = Tensor::cat(&[&s_prefix, &s_own], -1)
            .to_kind(Kind::Float)
            .softmax(-1, Kind::Float)
            .to_kind(q.kind());
        let own_len = s_own.size()[3];
        let p_prefix = p
            .narrow(-1, 0, n)
            .permute([1, 0, 2, 3])
            .reshape([h, m * l, n]);
        let y_prefix = p_prefix
            .matmul(&pv.squeeze_dim(0))
            .view([h, m, l, d])
            .permute([1, 0, 2, 3]);
        let y = y_prefix + p.narrow(-1, n, own_len).matmul(&v);
        self.out(&y)
    }
}

/// Attention of one new token per row, `q: [B, H, 1, hd]`, over `k, v: [B, KV, S, hd]` without
/// copying them per query head: the `groups = H / KV` query heads of each key/value head become
/// `groups` queries of it (`[B, KV, groups, hd]`), the bias (`[B, 1, 1, S]`) shared by them. The
/// same dot products and softmax per query head as repeating the key/value heads. For inference
/// where the kernel cannot read grouped heads itself (a GPU in f32, or with a bias): a decode
/// step there copied the whole cache `groups` times per layer.
fn attend_grouped(q: &Tensor, k: &Tensor, v: &Tensor, mask: &AttnMask, groups: i64) -> Tensor {
    let (b, h, d) = (q.size()[0], q.size()[1], q.size()[3]);
    let qg = q.reshape([b, h / groups, groups, d]);
    let bias = match mask {
        AttnMask::Bias(m) => Some(m.expand([b, 1, groups, m.size()[3]], false)),
        _ => None,
    };
    Tensor::scaled_dot_product_attention(&qg, k, v, bias.as_ref(), 0., false, None, false).reshape([b, h, 1, d])
}

/// One pre-norm transformer block.
#[derive(Debug)]
pub struct DecoderLayer {
    pub(super) input_layernorm: RmsNorm,
    pub(super) self_attn: Attention,
    pub(super) post_attention_layernorm: RmsNorm,
    pub(super) mlp: Mlp,
}

impl DecoderLayer {
    pub fn new(
        vs: nn::Path,
        hidden: i64,
        intermediate: i64,
        eps: f64,
        attn: AttnOptions,
        mlp_bias: bool,
    ) -> Self {
        DecoderLayer {
            input_layernorm: RmsNorm::new(&vs / "input_layernorm", hidden, eps),
            self_attn: Attention::new(&vs / "self_attn", hidden, attn),
            post_attention_layernorm: RmsNorm::new(&vs / "post_attention_layernorm", hidden, eps),
            mlp: Mlp::new(&vs / "mlp", hidden, intermediate, mlp_bias),
        }
    }

    pub fn forward(
        &self,
        x: &Tensor,
        rope: &RopeTables,
        mask: &AttnMask,
        cache: Option<&mut LayerKv>,
    ) -> Tensor {
        self.forward_with(x, rope, mask, cache, None)
    }

    /// This layer's [`FusedProjections`] (copies of its current weights).
    pub fn fused_projections(&self) -> FusedProjections {
        let (a, m) = (&self.self_attn, &self.mlp);
        FusedProjections {
            qkv: Linear::stacked(&[&a.q_proj, &a.k_proj, &a.v_proj]),
            gate_up: Linear::stacked(&[&m.gate_proj, &m.up_proj]),
        }
    }

    /// [`Self::forward`], through `fused` (this layer's [`Self::fused_projections`]) where given;
    /// then `rope` must come from [`Rotary::with_signed_sin`]. The same function of the weights;
    /// on a GPU the stacked products may round differently from separate ones.
    pub fn forward_with(
        &self,
        x: &Tensor,
        rope: &RopeTables,
        mask: &AttnMask,
        cache: Option<&mut LayerKv>,
        fused: Option<&FusedProjections>,
    ) -> Tensor {
        let (a, xn) = (&self.self_attn, self.input_layernorm.forward(x));
        let (q, k, v) = match fused {
            Some(f) => a.qkv_fused(&xn, rope, &f.qkv),
            None => a.qkv(&xn, rope),
        };
        let h = x + a.attend(q, k, v, mask, cache);
        let hn = self.post_attention_layernorm.forward(&h);
        &h + match fused {
            Some(f) => self.mlp.forward_fused(&hn, &f.gate_up),
            None => self.mlp.forward(&hn),
        }
    }

    pub fn forward_shared_prefix(
        &self,
        x: &Tensor,
        rope: &RopeTables,
        prefix: &LayerKv,
        prefix_bias: &Tensor,
        own_bias: &Tensor,
    ) -> Tensor {
        let (pk, pv) = prefix.kv();
        let h = x + self.self_attn.forward_shared_prefix(
            &self.input_layernorm.forward(x),
            rope,
            &pk,
            &pv,
            prefix_bias,
            own_bias,
        );
        &h + self.mlp.forward(&self.post_attention_layernorm.forward(&h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_matches_formula() {
        let vs = nn::VarStore::new(tch::Device::Cpu);
        let n = RmsNorm::new(vs.root() / "n", 4, 1e-6);
        let x = Tensor::from_slice(&[1.0f32, 2., 3., 4.]).view([1, 4]);
        let y = n.forward(&x);
        let rms = ((1. + 4. + 9. + 16.) / 4.0f64 + 1e-6).sqrt();
        let got = Vec::<f32>::try_from(y.view([-1])).unwrap();
        for (i, g) in got.iter().enumerate() {
            assert!((*g as f64 - (i + 1) as f64 / rms).abs() < 1e-6);
        }
    }

    #[test]
    fn rope_preserves_norm_and_is_relative() {
        let rot = Rotary::new(8, 10000.0, tch::Device::Cpu);
        let q = Tensor::randn([1, 1, 1, 8], (Kind::Float, tch::Device::Cpu));
        let k = Tensor::randn([1, 1, 1, 8], (Kind::Float, tch::Device::Cpu));
        let at = |x: &Tensor, p: i64| {
            Rotary::apply(
                x,
                &rot.tables(&Tensor::from_slice(&[p]).view([1, 1]), Kind::Float),
            )
        };
        let n0 = q.norm().double_value(&[]);
        let n1 = at(&q, 7).norm().double_value(&[]);
        assert!((n0 - n1).abs() < 1e-5);
        // <R(a)q, R(b)k> depends only on a - b.
        let d1 = (at(&q, 3) * at(&k, 1)).sum(Kind::Float).double_value(&[]);
        let d2 = (at(&q, 12) * at(&k, 10)).sum(Kind::Float).double_value(&[]);
        assert!((d1 - d2).abs() < 1e-4, "{d1} vs {d2}");
    }

    /// The flip-based rotation is the same arithmetic as the cat-based one, so bit for bit.
    #[test]
    fn flipped_rotation_is_the_rotation_bit_for_bit() {
        let rot = Rotary::new(16, 10000.0, tch::Device::Cpu);
        let pos = Tensor::from_slice(&[0i64, 5, 17, 4000]).view([2, 2]);
        for kind in [Kind::Float, Kind::BFloat16] {
            let t = Rotary::with_signed_sin(rot.tables(&pos, kind));
            // Non-contiguous, as the attention's [B, L, H, hd] -> [B, H, L, hd] transpose.
            let x = Tensor::randn([2, 2, 3, 16], (Kind::Float, tch::Device::Cpu)).to_kind(kind).transpose(1, 2);
            let (a, b) = (Rotary::apply(&x, &t), Rotary::apply_flipped(&x, &t));
            assert_eq!(a.size(), b.size());
            assert!(a.equal(&b), "{kind:?}: flipped rotation differs");
        }
    }

    /// Grouped queries attend as repeated key/value heads do, with and without a bias.
    #[test]
    fn grouped_queries_attend_as_repeated_heads() {
        let dev = tch::Device::Cpu;
        let (b, kv, groups, s, d) = (3, 2, 3, 7, 8);
        let q = Tensor::randn([b, kv * groups, 1, d], (Kind::Float, dev));
        let k = Tensor::randn([b, kv, s, d], (Kind::Float, dev));
        let v = Tensor::randn([b, kv, s, d], (Kind::Float, dev));
        let repeat = |t: &Tensor| t.unsqueeze(2).expand([b, kv, groups, s, d], false).reshape([b, kv * groups, s, d]);
        let hide = Tensor::from_slice(&[0i64, 2, 5]).view([b, 1, 1, 1]);
        let bias = Tensor::zeros([b, 1, 1, s], (Kind::Float, dev))
            .masked_fill(&Tensor::arange(s, (Kind::Int64, dev)).view([1, 1, 1, s]).lt_tensor(&hide), -1e30);
        for mask in [AttnMask::Full, AttnMask::Bias(bias)] {
            let m = match &mask { AttnMask::Bias(m) => Some(m), _ => None };
            let want = Tensor::scaled_dot_product_attention(&q, &repeat(&k), &repeat(&v), m, 0., false, None, false);
            let got = attend_grouped(&q, &k, &v, &mask, groups);
            assert_eq!(got.size(), want.size());
            let diff = (&got - &want).abs().max().double_value(&[]);
            assert!(diff < 1e-6, "{mask:?}: grouped attention differs by {diff}");
        }
    }

    #[test]
    fn cache_grows_and_forks() {
        let mut c = KvCache::new(1, 2, 1, 2, 1, Kind::Float, tch::Device::Cpu);
        let k = Tensor::ones([2, 1, 3, 2], (Kind::Float, tch::Device::Cpu));
        let (kk, _) = c.layers[0].append(&k, &k);
        assert_eq!(kk.size(), vec![2, 1, 3, 2]);
        assert_eq!(c.len(), 3);
        let f = c.select_rows(&[1, 1, 0], 4);
        assert_eq!(f.batch(), 3);
        assert_eq!(f.len(), 3);
        assert_eq!(c.batch(), 2);
    }
}
