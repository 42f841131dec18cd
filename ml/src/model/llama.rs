//! Llama decoder (SmolLM2-135M-Instruct is one).
//!
//! Traits: grouped-query attention, no bias by default (`attention_bias`, `mlp_bias`), RoPE
//! (`rope_theta`; scaled RoPE variants are rejected by the config parser), RMSNorm, SwiGLU MLP.
//! GGUF files of this architecture store `attn_q`/`attn_k` rows permuted for llama.cpp's
//! interleaved RoPE; [`unpermute_qk`] restores the Hugging Face order.
//! Reference: `transformers/models/llama/modeling_llama.py`; candle `models/llama.rs`.

use tch::Tensor;

use super::config::ModelConfig;
use super::layers::AttnOptions;

/// Attention options of a Llama layer.
pub fn attn_options(cfg: &ModelConfig) -> AttnOptions {
    AttnOptions {
        n_heads: cfg.num_attention_heads,
        n_kv_heads: cfg.num_key_value_heads,
        head_dim: cfg.head_dim,
        qkv_bias: cfg.qkv_bias,
        o_bias: cfg.o_bias,
        qk_norm_eps: None,
    }
}

/// Inverse of llama.cpp's `permute` (convert_hf_to_gguf.py) for a `[n_head * head_dim, ..]`
/// q or k weight: `reshape(n_head, head_dim/2, 2, ..).swapaxes(1, 2)`.
pub fn unpermute_qk(w: &Tensor, n_head: i64) -> Tensor {
    let s = w.size();
    let mut shape = vec![n_head, s[0] / n_head / 2, 2];
    shape.extend_from_slice(&s[1..]);
    w.reshape(shape.as_slice())
        .transpose(1, 2)
        .reshape(s.as_slice())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        let (n_head, hd, d) = (3i64, 8i64, 5i64);
        let w = Tensor::randn([n_head * hd, d], (tch::Kind::Float, tch::Device::Cpu));
        // llama.cpp: reshape(n_head, 2, hd/2, d).swapaxes(1, 2)
        let permuted = w
            .reshape([n_head, 2, hd / 2, d])
            .transpose(1, 2)
            .reshape([n_head * hd, d]);
        assert!(!permuted.equal(&w));
        assert!(unpermute_qk(&permuted, n_head).equal(&w));
    }
}
