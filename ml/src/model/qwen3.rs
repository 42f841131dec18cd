//! Qwen3 dense decoder (the paper's Qwen3-4B-Instruct).
//!
//! Traits: grouped-query attention **without** q/k/v bias but with an **RMSNorm over each head
//! of q and k** (`q_norm`, `k_norm`, weight of size `head_dim`) applied before RoPE; `head_dim`
//! is explicit in the config (not `hidden_size / heads`); RMSNorm, SwiGLU MLP.
//! Reference: `transformers/models/qwen3/modeling_qwen3.py`; candle `models/qwen3.rs`.

use super::config::ModelConfig;
use super::layers::AttnOptions;

/// Attention options of a Qwen3 layer.
pub fn attn_options(cfg: &ModelConfig) -> AttnOptions {
    AttnOptions {
        n_heads: cfg.num_attention_heads,
        n_kv_heads: cfg.num_key_value_heads,
        head_dim: cfg.head_dim,
        qkv_bias: cfg.qkv_bias,
        o_bias: cfg.o_bias,
        qk_norm_eps: Some(cfg.rms_norm_eps),
    }
}
