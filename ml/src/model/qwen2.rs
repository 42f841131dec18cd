//! Qwen2 / Qwen2.5 decoder (also the architecture of rredcot's tiny self-trained model).
//!
//! Traits: grouped-query attention with **bias on the q/k/v projections** (none on `o_proj`),
//! RoPE (`rope_theta` from the config), RMSNorm, SwiGLU MLP without bias, embeddings usually tied
//! for small sizes. Reference: <https://huggingface.co/docs/transformers/model_doc/qwen2> and
//! `transformers/models/qwen2/modeling_qwen2.py`; candle `candle-transformers/src/models/qwen2.rs`.

use super::config::ModelConfig;
use super::layers::AttnOptions;

/// Attention options of a Qwen2 layer.
pub fn attn_options(cfg: &ModelConfig) -> AttnOptions {
    AttnOptions {
        n_heads: cfg.num_attention_heads,
        n_kv_heads: cfg.num_key_value_heads,
        head_dim: cfg.head_dim,
        qkv_bias: true,
        o_bias: false,
        qk_norm_eps: None,
    }
}
