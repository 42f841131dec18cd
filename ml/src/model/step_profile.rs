//! Where a decode step's time goes (bench_gpu's `step_breakdown` figure): each piece of every
//! layer (the two norms, the q|k|v product with the rotation, the attention with its cache write
//! and output product, the output product alone, the MLP, the residual adds), the final norm
//! with the LM head and the sampler, each timed alone over all layers, beside the whole step.
//!
//! A piece's time is that of `reps` runs queued back to back between two synchronisations, so it
//! is what the piece costs in the stream: its kernels' time where they are slower than their
//! launches (a GPU at a large batch), else its launches' (a GPU at batch 1). Which of the two
//! paces a step, and which piece, is what the 5x decode target of issue 17 turns on.

use std::time::Instant;

use tch::{Device, Kind, Tensor};

use super::decoder::DecoderLm;
use super::generate::{sample_record, SamplingParams};
use super::layers::{AttnMask, Rotary};

/// The attention a decode step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepMask {
    /// No mask: every cached key visible, the eager static batch's path (flash attention on a
    /// GPU in bf16).
    Full,
    /// An additive bias over a fixed cache written at each row's column: the path of
    /// continuous batching and of the fixed-shape step a CUDA graph replays.
    Bias,
}

/// Waits for `dev`'s queued work (nothing to wait for on the CPU).
pub fn sync(dev: Device) {
    if let Device::Cuda(i) = dev {
        tch::Cuda::synchronize(i as i64);
    }
}

/// Milliseconds per run of `f`: one run to warm up, then `reps` queued between two syncs.
pub fn time(dev: Device, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    sync(dev);
    let t = Instant::now();
    for _ in 0..reps {
        f();
    }
    sync(dev);
    t.elapsed().as_secs_f64() * 1e3 / reps.max(1) as f64
}

/// Milliseconds per decode step of `batch` rows with `past` tokens cached, per piece (summed over
/// the layers) and for the whole step (`"whole_step"`), sampling at T = 1, through the fused
/// projections where the model decodes with them. `"attention"` includes the cache write and the
/// output product; `"o_proj"` is the output product alone.
pub fn decode_step(model: &DecoderLm, batch: i64, past: i64, mask: StepMask, reps: usize) -> Vec<(&'static str, f64)> {
    tch::no_grad(|| {
        let (dev, kind, vocab) = (model.device(), model.kind(), model.cfg.vocab_size);
        let cap = past + 1;
        let mut cache = model.new_cache(batch, cap);
        let prompt = Tensor::randint(vocab, [batch, past], (Kind::Int64, dev));
        let _ = model.hidden(&prompt, &Tensor::arange(past, (Kind::Int64, dev)).expand([batch, past], false), &AttnMask::Causal, Some(&mut cache));
        let attn_mask = match mask {
            StepMask::Full => AttnMask::Full,
            StepMask::Bias => {
                // As the fixed-shape step: every row writes at its column and reads the whole cache.
                cache.write_rows_at(&Tensor::full([batch], past, (Kind::Int64, dev)), cap);
                AttnMask::Bias(Tensor::zeros([batch, 1, 1, cap], (kind, dev)))
            }
        };
        // A Full step appends at column `past`: truncating after it keeps every run the same.
        let reset = |c: &mut super::layers::KvCache| {
            if mask == StepMask::Full {
                c.truncate(past)
            }
        };
        let tok = Tensor::randint(vocab, [batch, 1], (Kind::Int64, dev));
        let pos = Tensor::full([batch, 1], past, (Kind::Int64, dev));
        let fused = model.decode_projections();
        let mut rope = model.rotary.tables(&pos, kind);
        if fused.is_some() {
            rope = Rotary::with_signed_sin(rope);
        }
        let x = model.embed(&tok);
        let layers = &model.layers;
        let qkv = |i: usize, xn: &Tensor| {
            let a = &layers[i].self_attn;
            match &fused {
                Some(f) => a.qkv_fused(xn, &rope, &f[i].qkv),
                None => a.qkv(xn, &rope),
            }
        };
        let heads: Vec<_> = (0..layers.len()).map(|i| qkv(i, &x)).collect();
        let y = Tensor::randn([batch, 1, model.cfg.num_attention_heads * model.cfg.head_dim], (kind, dev));
        let logits = model.logits(&x.squeeze_dim(1));
        let p = SamplingParams { temperature: 1.0, ..Default::default() };
        let u = Tensor::rand([batch], (Kind::Float, dev));

        let mut pieces = vec![
            ("norms", time(dev, reps, || {
                for l in layers {
                    let _ = (l.input_layernorm.forward(&x), l.post_attention_layernorm.forward(&x));
                }
            })),
            ("qkv_rope", time(dev, reps, || {
                for i in 0..layers.len() {
                    let _ = qkv(i, &x);
                }
            })),
            ("attention", time(dev, reps, || {
                for (i, (l, (q, k, v))) in layers.iter().zip(&heads).enumerate() {
                    let _ = l.self_attn.attend(q.shallow_clone(), k.shallow_clone(), v.shallow_clone(), &attn_mask, Some(&mut cache.layers[i]));
                }
                reset(&mut cache);
            })),
            ("o_proj", time(dev, reps, || {
                for l in layers {
                    let _ = l.self_attn.o_proj.forward(&y);
                }
            })),
            ("mlp", time(dev, reps, || {
                for (i, l) in layers.iter().enumerate() {
                    let _ = match &fused {
                        Some(f) => l.mlp.forward_fused(&x, &f[i].gate_up),
                        None => l.mlp.forward(&x),
                    };
                }
            })),
            ("residual_adds", time(dev, reps, || {
                for _ in layers {
                    let _ = (&x + &x, &x + &x);
                }
            })),
            ("final_norm_lm_head", time(dev, reps, || {
                let _ = model.logits(&model.norm.forward(&x).squeeze_dim(1));
            })),
            ("sampler", time(dev, reps, || {
                let _ = sample_record(&logits, &p, &u);
            })),
        ];
        let sum: f64 = pieces.iter().map(|(_, ms)| ms).sum();
        pieces.push(("sum_of_pieces", sum));
        pieces.push(("whole_step", time(dev, reps, || {
            let (_, tok) = sample_record(&logits, &p, &u);
            let h = model.hidden_decode(&tok.unsqueeze(-1), &pos, &attn_mask, Some(&mut cache), fused.as_deref());
            let _ = model.logits(&h.squeeze_dim(1));
            reset(&mut cache);
        })));
        pieces
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelConfig;

    #[test]
    fn every_piece_of_a_decode_step_is_timed_on_both_attention_paths() {
        let json = r#"{"model_type": "qwen2", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "tie_word_embeddings": false}"#;
        let cfg = ModelConfig::from_json_str(json, std::path::Path::new("<test>")).unwrap();
        let model = DecoderLm::new(&cfg, Device::Cpu);
        for mask in [StepMask::Full, StepMask::Bias] {
            let pieces = decode_step(&model, 3, 20, mask, 2);
            let names: Vec<&str> = pieces.iter().map(|(n, _)| *n).collect();
            assert_eq!(
                names,
                ["norms", "qkv_rope", "attention", "o_proj", "mlp", "residual_adds", "final_norm_lm_head", "sampler", "sum_of_pieces", "whole_step"]
            );
            assert!(pieces.iter().all(|(_, ms)| ms.is_finite() && *ms > 0.0), "{mask:?}: {pieces:?}");
        }
    }
}
