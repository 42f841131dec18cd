//! The policy's side of one optimizer step, apart from any loss: which precision the forward and
//! backward run in, activation checkpointing, and the gradients the optimizer reads.
//!
//! - `f32`: the model trains as it is (float32 weights, gradients, AdamW moments).
//! - `bf16`: mixed precision with float32 master weights, as `torch.autocast` + an f32 optimizer
//!   do. The forward and backward run on a bfloat16 copy of the weights; its gradients are added
//!   to the float32 master weights' gradients, which clipping and AdamW (f32 moments) read; after
//!   the step the copy is refreshed from the master weights. The saved policy is the master.
//! - `auto`: `bf16` on CUDA (tensor cores, half the activation memory), `f32` on the CPU (bf16
//!   matrix products are slower there and nothing is gained).
//!
//! With `checkpointing`, each micro-batch's backward recomputes the layers one at a time
//! ([`DecoderLm::backward_checkpointed`]): the activations of one layer instead of all of them;
//! and the LM head runs in pieces of positions ([`chunked_head`]), so the logits of the whole
//! micro-batch (16 × 1087 × 151,936 floats = 10.6 GB for Table 2's shape) never exist at once.
//! The log-probabilities that need no gradient (π_old's, the reference policy's) are computed
//! in such pieces too, with or without checkpointing.

use anyhow::Result;
use serde::Deserialize;
use tch::{Device, Kind, Tensor};

use crate::model::{head, DecoderLm};

/// The `dtype` param of a training stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrainDtype {
    Auto,
    #[default]
    F32,
    Bf16,
}

impl TrainDtype {
    /// Whether the forward and backward run in bfloat16 on `device`.
    pub fn mixed_on(self, device: Device) -> bool {
        match self {
            TrainDtype::Auto => device != Device::Cpu,
            TrainDtype::F32 => false,
            TrainDtype::Bf16 => true,
        }
    }
}

/// A policy being trained: float32 master weights and, in mixed precision, their bf16 copy.
pub struct TrainModel {
    master: DecoderLm,
    compute: Option<DecoderLm>,
    checkpointing: bool,
    /// Master variables sorted by name (what the optimizer steps).
    params: Vec<(String, Tensor)>,
    /// The bf16 copy's variables, in the same order.
    compute_params: Vec<(String, Tensor)>,
}

impl TrainModel {
    /// `master` is made float32; with `dtype` mixed on its device a bfloat16 copy is made.
    pub fn new(mut master: DecoderLm, dtype: TrainDtype, checkpointing: bool) -> TrainModel {
        if master.kind() != Kind::Float {
            master.set_kind(Kind::Float);
        }
        let params = master.sorted_variables();
        let compute = dtype.mixed_on(master.device()).then(|| {
            let mut copy = DecoderLm::new(&master.cfg, master.device());
            tch::no_grad(|| copy.vs.copy(&master.vs)).expect("a model of the same config has the same variables");
            copy.set_kind(Kind::BFloat16);
            // The master's gradients exist from the start: the copy's are added into them.
            for (_, p) in &params {
                (p.sum(Kind::Float) * 0.0).backward();
            }
            copy
        });
        let compute_params = compute.as_ref().map(DecoderLm::sorted_variables).unwrap_or_default();
        TrainModel { master, compute, checkpointing, params, compute_params }
    }

    /// The float32 weights (what is saved).
    pub fn master(&self) -> &DecoderLm {
        &self.master
    }

    /// The master variables sorted by name, for clipping and the optimizer.
    pub fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }

    /// The weights the forward pass runs on.
    fn model(&self) -> &DecoderLm {
        self.compute.as_ref().unwrap_or(&self.master)
    }

    /// Sets every gradient to zero (before a step's micro-batches).
    pub fn zero_grad(&self) {
        for (_, p) in self.params.iter().chain(&self.compute_params) {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
    }

    /// Log-probabilities `[B, L-1]` of `ids[:, 1:]` under the model (logits / temperature), as
    /// the forward of a micro-batch computes them (call under `no_grad` for old/reference ones).
    pub fn token_logprobs(&self, ids: &Tensor, temperature: f64) -> Result<Tensor> {
        token_logprobs(self.model(), ids, temperature)
    }

    /// Forward and backward of one micro-batch: `loss_of` maps the token log-probabilities
    /// `[B, L-1]` to a scalar loss (and what the caller wants back); the gradients accumulate
    /// into [`Self::params`].
    pub fn backward<R>(&self, ids: &Tensor, temperature: f64, loss_of: impl FnOnce(&Tensor) -> Result<(Tensor, R)>) -> Result<R> {
        let model = self.model();
        let out = if self.checkpointing {
            let len = ids.size()[1];
            model.backward_checkpointed(&ids.narrow(1, 0, len - 1), |hidden| {
                chunked_head(model, hidden, ids, temperature, loss_of)
            })?
        } else {
            let (loss, out) = loss_of(&self.token_logprobs(ids, temperature)?)?;
            loss.backward();
            out
        };
        if self.compute.is_some() {
            tch::no_grad(|| {
                for ((_, master), (_, copy)) in self.params.iter().zip(&self.compute_params) {
                    let mut g = copy.grad();
                    if g.defined() {
                        let _ = master.grad().g_add_(&g.to_kind(Kind::Float));
                        let _ = g.zero_();
                    }
                }
            });
        }
        Ok(out)
    }

    /// After the optimizer moved the master weights: the bf16 copy follows them.
    pub fn weights_changed(&self) {
        tch::no_grad(|| {
            for ((_, master), (_, copy)) in self.params.iter().zip(&self.compute_params) {
                copy.shallow_clone().copy_(master);
            }
        });
    }
}

/// Log-probabilities `[B, L-1]` of `ids[:, 1:]` under `model` (logits / temperature), the LM
/// head run in pieces of positions ([`head::position_logprobs`]): the reference policy's and
/// π_old's log-probabilities of a micro-batch never hold its `[B, L, V]` logits at once.
pub fn token_logprobs(model: &DecoderLm, ids: &Tensor, temperature: f64) -> Result<Tensor> {
    let len = ids.size()[1];
    let hidden = model.forward_hidden(&ids.narrow(1, 0, len - 1), None, None)?;
    let targets = ids.to_device(model.device()).narrow(1, 1, len - 1);
    Ok(head::position_logprobs(model, &hidden, &targets, temperature))
}

/// The head under checkpointing: `loss_of` over the log-probabilities of `ids[:, 1:]` given the
/// final hidden states `hidden: [B, L-1, D]` (a leaf), with the LM head run in pieces of
/// positions ([`head::position_pieces`]) twice — without autograd for the loss, then piece by
/// piece with it for the backward of sum(logp * dL/dlogp) — so the `[B, L, V]` logits never
/// exist at once. Leaves `hidden.grad()` and the head's parameter gradients.
fn chunked_head<R>(
    model: &DecoderLm,
    hidden: &Tensor,
    ids: &Tensor,
    temperature: f64,
    loss_of: impl FnOnce(&Tensor) -> Result<(Tensor, R)>,
) -> Result<R> {
    let (b, l, _) = hidden.size3()?;
    let targets = ids.narrow(1, 1, l);
    let logp = tch::no_grad(|| head::position_logprobs(model, hidden, &targets, temperature)).set_requires_grad(true);
    let (loss, out) = loss_of(&logp)?;
    loss.backward();
    let grad = logp.grad();
    for (s, n) in head::position_pieces(model, b, l) {
        (head::position_piece(model, hidden, &targets, temperature, s, n) * grad.narrow(1, s, n)).sum(Kind::Float).backward();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::score::tests::tiny_model;
    use crate::model::Arch;

    /// Two models with the same weights (one draw: other tests share torch's global RNG).
    fn twins(arch: Arch, seed: i64) -> (DecoderLm, DecoderLm) {
        let a = tiny_model(arch, seed);
        let mut b = DecoderLm::new(&a.cfg, Device::Cpu);
        tch::no_grad(|| b.vs.copy(&a.vs)).unwrap();
        (a, b)
    }

    fn ids() -> Tensor {
        Tensor::from_slice(&[3i64, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]).view([2, 6])
    }

    fn loss(logp: &Tensor) -> Result<(Tensor, f64)> {
        let l = -logp.mean(Kind::Float);
        let v = l.double_value(&[]);
        Ok((l, v))
    }

    fn grads(t: &TrainModel) -> Vec<Tensor> {
        t.params().iter().map(|(_, p)| p.grad().copy()).collect()
    }

    /// Mixed precision: the master stays float32, gradients land on it as float32 and are close
    /// to the float32 ones, and after a step the bf16 copy holds the moved master weights.
    #[test]
    fn bf16_compute_accumulates_float32_gradients_into_the_master_weights() {
        let (a, b) = twins(Arch::Qwen2, 5);
        let f32_model = TrainModel::new(a, TrainDtype::F32, false);
        let mixed = TrainModel::new(b, TrainDtype::Bf16, false);
        assert!(mixed.compute.is_some());
        assert!(!TrainDtype::Auto.mixed_on(Device::Cpu) && TrainDtype::Auto.mixed_on(Device::Cuda(0)));
        let (a, b) = (f32_model.backward(&ids(), 1.0, loss).unwrap(), mixed.backward(&ids(), 1.0, loss).unwrap());
        assert!((a - b).abs() < 0.05 * a.abs(), "loss f32 {a} vs bf16 {b}");
        for ((name, p), (g32, gmix)) in f32_model.params().iter().zip(grads(&f32_model).iter().zip(grads(&mixed))) {
            assert_eq!((p.kind(), gmix.kind()), (Kind::Float, Kind::Float), "{name}");
            let scale = g32.abs().max().double_value(&[]);
            let d = (g32 - &gmix).abs().max().double_value(&[]);
            assert!(d <= 0.1 * scale + 1e-4, "{name}: bf16 gradient off by {d} (scale {scale})");
        }
        // The copy's own gradients were moved out; a step on the master shows in the copy.
        assert!(mixed.compute_params.iter().all(|(_, c)| c.grad().abs().max().double_value(&[]) == 0.0));
        tch::no_grad(|| {
            for (_, p) in mixed.params() {
                let _ = p.shallow_clone().g_add_scalar_(0.25);
            }
        });
        mixed.weights_changed();
        for ((_, p), (_, c)) in mixed.params.iter().zip(&mixed.compute_params) {
            assert_eq!(c.kind(), Kind::BFloat16);
            assert!((p - c.to_kind(Kind::Float)).abs().max().double_value(&[]) < 0.02);
        }
    }

    /// Checkpointing changes memory, not the gradients: the layers recomputed, and the LM head in
    /// pieces of 2, 2 and 1 positions. Without checkpointing the head in such pieces (under
    /// autograd) gives the same gradients too.
    #[test]
    fn checkpointing_gives_the_same_gradients() {
        let (a, b) = twins(Arch::Qwen3, 6);
        let plain = TrainModel::new(a, TrainDtype::F32, false);
        let ckpt = TrainModel::new(b, TrainDtype::F32, true);
        let pieces_of_two = 2 * 2 * ckpt.master.cfg.vocab_size;
        assert_eq!(head::items_per_piece(pieces_of_two, 2 * ckpt.master.cfg.vocab_size), 2);
        let a = plain.backward(&ids(), 0.7, loss).unwrap();
        head::TEST_LOGITS_AT_ONCE.set(Some(pieces_of_two));
        assert_eq!(head::position_pieces(&ckpt.master, 2, 5), [(0, 2), (2, 2), (4, 1)]);
        let b = ckpt.backward(&ids(), 0.7, loss);
        head::TEST_LOGITS_AT_ONCE.set(None);
        let b = b.unwrap();
        assert!((a - b).abs() < 1e-6);
        let same = |x: &Tensor, y: &Tensor, what: &str| {
            let d = (x - y).abs().max().double_value(&[]);
            assert!(d <= 1e-5 * x.abs().max().double_value(&[]).max(1e-3), "{what}: {d}");
        };
        let (plain_grads, ckpt_grads) = (grads(&plain), grads(&ckpt));
        for ((name, _), (x, y)) in plain.params().iter().zip(plain_grads.iter().zip(&ckpt_grads)) {
            same(x, y, name);
        }
        plain.zero_grad();
        head::TEST_LOGITS_AT_ONCE.set(Some(pieces_of_two));
        let c = plain.backward(&ids(), 0.7, loss);
        head::TEST_LOGITS_AT_ONCE.set(None);
        assert!((a - c.unwrap()).abs() < 1e-6);
        for ((name, _), (x, y)) in plain.params().iter().zip(plain_grads.iter().zip(grads(&plain))) {
            same(x, &y, &format!("{name}, head in pieces without checkpointing"));
        }
    }
}
