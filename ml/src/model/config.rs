//! `config.json` of a Hugging Face decoder LM, deserialized with serde, validated, and written
//! back in the same layout so `transformers` can load our checkpoints.
//!
//! Unknown keys are an error unless they are on a short list of keys known not to change the
//! forward pass (training metadata, dtype hints, token ids). Keys that *would* change it and that
//! we do not implement (RoPE scaling, sliding windows, non-SiLU activations) are rejected by
//! value, so a checkpoint is never run with silently different semantics.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::error::{ModelError, Result};

/// The decoder architectures implemented in this crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Arch {
    /// Qwen2 / Qwen2.5: bias on q/k/v projections.
    Qwen2,
    /// Qwen3: RMSNorm on q and k per head, no q/k/v bias, explicit `head_dim`.
    Qwen3,
    /// Llama (SmolLM2): no bias.
    Llama,
}

impl Arch {
    /// The Hugging Face `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Llama => "llama",
        }
    }
    /// The Hugging Face `architectures[0]` class name.
    pub fn hf_class(self) -> &'static str {
        match self {
            Arch::Qwen2 => "Qwen2ForCausalLM",
            Arch::Qwen3 => "Qwen3ForCausalLM",
            Arch::Llama => "LlamaForCausalLM",
        }
    }
    /// Parses a `model_type` string.
    pub fn from_model_type(s: &str) -> Option<Arch> {
        match s {
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            "llama" => Some(Arch::Llama),
            _ => None,
        }
    }
}

/// Validated model hyper-parameters (the subset of `config.json` that shapes the forward pass).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    pub head_dim: i64,
    pub max_position_embeddings: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub tie_word_embeddings: bool,
    /// Bias on the q/k/v projections (always on for Qwen2, `attention_bias` for the others).
    pub qkv_bias: bool,
    /// Bias on the attention output projection (`attention_bias` for Llama/Qwen3, never Qwen2).
    pub o_bias: bool,
    /// Bias on the MLP projections (Llama `mlp_bias`).
    pub mlp_bias: bool,
    pub bos_token_id: Option<i64>,
    pub eos_token_ids: Vec<i64>,
    pub pad_token_id: Option<i64>,
}

/// `config.json` as written by `transformers` 4.x and 5.x.
#[derive(Debug, Deserialize)]
struct RawConfig {
    model_type: String,
    vocab_size: i64,
    hidden_size: i64,
    intermediate_size: i64,
    num_hidden_layers: i64,
    num_attention_heads: i64,
    num_key_value_heads: Option<i64>,
    head_dim: Option<i64>,
    max_position_embeddings: i64,
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    rope_parameters: Option<Value>,
    rope_scaling: Option<Value>,
    #[serde(default)]
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    hidden_act: Option<String>,
    use_sliding_window: Option<bool>,
    bos_token_id: Option<Value>,
    eos_token_id: Option<Value>,
    pad_token_id: Option<Value>,
    #[serde(flatten)]
    rest: BTreeMap<String, Value>,
}

/// Keys that do not change the forward pass of an inference/training step we implement.
const IGNORED_KEYS: &[&str] = &[
    "architectures",
    "attention_dropout",
    "dtype",
    "torch_dtype",
    "transformers_version",
    "use_cache",
    "initializer_range",
    "pretraining_tp",
    "sliding_window",
    "max_window_layers",
    "layer_types",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "is_decoder",
    "_name_or_path",
    "_model_name_or_path",
    "is_encoder_decoder",
    "torchscript",
    "pruned_heads",
    "tie_encoder_decoder",
    "auto_map",
    "bos_token",
    "eos_token",
    "pad_token",
    "unk_token_id",
    "chunk_size_feed_forward",
    "tokenizer_class",
    "problem_type",
    "id2label",
    "label2id",
    "quantization_config",
    "_attn_implementation_autoset",
    "model_name",
    "use_bfloat16",
];

fn token_ids(v: &Option<Value>) -> Vec<i64> {
    match v {
        Some(Value::Number(n)) => n.as_i64().into_iter().collect(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_i64).collect(),
        _ => vec![],
    }
}

impl ModelConfig {
    /// Reads and validates `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
        Self::from_json_str(&text, path)
    }

    /// Parses a `config.json` text; `path` only names the file in errors.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self> {
        let raw: RawConfig =
            serde_json::from_str(text).map_err(|e| ModelError::config(path, e.to_string()))?;
        let arch =
            Arch::from_model_type(&raw.model_type).ok_or_else(|| ModelError::UnsupportedArch {
                path: path.to_path_buf(),
                arch: raw.model_type.clone(),
            })?;
        let unknown: Vec<&String> = raw
            .rest
            .keys()
            .filter(|k| !IGNORED_KEYS.contains(&k.as_str()))
            .collect();
        if !unknown.is_empty() {
            return Err(ModelError::config(
                path,
                format!(
                    "unknown field(s) {unknown:?} for model_type {:?}",
                    raw.model_type
                ),
            ));
        }
        if let Some(act) = &raw.hidden_act {
            if act != "silu" {
                return Err(ModelError::config(
                    path,
                    format!("hidden_act {act:?} is not supported (only \"silu\")"),
                ));
            }
        }
        if raw.use_sliding_window == Some(true) {
            return Err(ModelError::config(
                path,
                "use_sliding_window = true is not supported",
            ));
        }
        let mut rope_theta = raw.rope_theta;
        for (key, v) in [
            ("rope_scaling", &raw.rope_scaling),
            ("rope_parameters", &raw.rope_parameters),
        ] {
            match v {
                None | Some(Value::Null) => {}
                Some(Value::Object(m)) => {
                    let ty = m
                        .get("rope_type")
                        .or_else(|| m.get("type"))
                        .and_then(Value::as_str)
                        .unwrap_or("default");
                    if ty != "default" {
                        return Err(ModelError::config(
                            path,
                            format!("{key}.rope_type {ty:?} is not supported (only \"default\")"),
                        ));
                    }
                    if let Some(t) = m.get("rope_theta").and_then(Value::as_f64) {
                        rope_theta = Some(t);
                    }
                }
                Some(other) => {
                    return Err(ModelError::config(
                        path,
                        format!("{key} must be an object, found {other}"),
                    ))
                }
            }
        }
        let rope_theta = rope_theta.ok_or_else(|| {
            ModelError::config(
                path,
                "missing field `rope_theta` (or `rope_parameters.rope_theta`)",
            )
        })?;
        let num_key_value_heads = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        let head_dim = match (arch, raw.head_dim) {
            (_, Some(h)) => h,
            (Arch::Qwen3, None) => {
                return Err(ModelError::config(path, "missing field `head_dim`"))
            }
            (_, None) => raw.hidden_size / raw.num_attention_heads.max(1),
        };
        let attention_bias = raw.attention_bias.unwrap_or(false);
        let cfg = ModelConfig {
            arch,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: raw.num_attention_heads,
            num_key_value_heads,
            head_dim,
            max_position_embeddings: raw.max_position_embeddings,
            rms_norm_eps: raw.rms_norm_eps,
            rope_theta,
            // transformers' PretrainedConfig default is true; Qwen2/Qwen3 configs write it out.
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(true),
            qkv_bias: match arch {
                Arch::Qwen2 => true,
                _ => attention_bias,
            },
            o_bias: match arch {
                Arch::Qwen2 => false,
                _ => attention_bias,
            },
            mlp_bias: arch == Arch::Llama && raw.mlp_bias.unwrap_or(false),
            bos_token_id: token_ids(&raw.bos_token_id).first().copied(),
            eos_token_ids: token_ids(&raw.eos_token_id),
            pad_token_id: token_ids(&raw.pad_token_id).first().copied(),
        };
        cfg.validate().map_err(|m| ModelError::config(path, m))?;
        Ok(cfg)
    }

    /// Checks the invariants the layers rely on.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let pos = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (k, v) in pos {
            if v <= 0 {
                return Err(format!("{k} must be positive, found {v}"));
            }
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.head_dim % 2 != 0 {
            return Err(format!("head_dim {} must be even for RoPE", self.head_dim));
        }
        if self.rope_theta.is_nan()
            || self.rope_theta <= 0.0
            || self.rms_norm_eps.is_nan()
            || self.rms_norm_eps <= 0.0
        {
            return Err("rope_theta and rms_norm_eps must be positive".into());
        }
        Ok(())
    }

    /// The `config.json` we write with checkpoints (loadable by `transformers` 4.x and 5.x).
    pub fn to_hf_json(&self) -> Value {
        let eos: Value = match self.eos_token_ids.as_slice() {
            [] => Value::Null,
            [one] => json!(one),
            many => json!(many),
        };
        let mut v = json!({
            "architectures": [self.arch.hf_class()],
            "model_type": self.arch.model_type(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": null,
            "hidden_act": "silu",
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "pad_token_id": self.pad_token_id,
            "torch_dtype": "float32",
        });
        let m = v.as_object_mut().expect("object literal");
        match self.arch {
            Arch::Qwen2 => {
                m.insert("use_sliding_window".into(), json!(false));
            }
            Arch::Qwen3 => {
                m.insert("attention_bias".into(), json!(self.qkv_bias));
                m.insert("use_sliding_window".into(), json!(false));
            }
            Arch::Llama => {
                m.insert("attention_bias".into(), json!(self.qkv_bias));
                m.insert("mlp_bias".into(), json!(self.mlp_bias));
            }
        }
        v
    }

    /// Number of query heads per key/value head (grouped-query attention).
    pub fn kv_groups(&self) -> i64 {
        self.num_attention_heads / self.num_key_value_heads
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN2: &str = r#"{"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2","vocab_size":64,
      "hidden_size":32,"intermediate_size":48,"num_hidden_layers":2,"num_attention_heads":4,
      "num_key_value_heads":2,"max_position_embeddings":128,"rms_norm_eps":1e-6,"rope_theta":10000.0,
      "tie_word_embeddings":true,"hidden_act":"silu","use_sliding_window":false,"sliding_window":null,
      "torch_dtype":"float32","transformers_version":"4.0","eos_token_id":2,"bos_token_id":1}"#;

    #[test]
    fn parses_qwen2_and_round_trips() {
        let p = Path::new("config.json");
        let c = ModelConfig::from_json_str(QWEN2, p).unwrap();
        assert_eq!(c.arch, Arch::Qwen2);
        assert_eq!(c.head_dim, 8);
        assert!(c.qkv_bias && !c.o_bias);
        assert_eq!(c.eos_token_ids, vec![2]);
        let again = ModelConfig::from_json_str(&c.to_hf_json().to_string(), p).unwrap();
        assert_eq!(c, again);
    }

    #[test]
    fn rope_parameters_of_transformers_5() {
        let text = QWEN2.replace(
            r#""rope_theta":10000.0"#,
            r#""rope_parameters":{"rope_type":"default","rope_theta":500.0}"#,
        );
        let c = ModelConfig::from_json_str(&text, Path::new("c.json")).unwrap();
        assert_eq!(c.rope_theta, 500.0);
    }

    #[test]
    fn missing_unknown_and_unsupported_fields_are_errors() {
        let p = Path::new("dir/config.json");
        let missing = QWEN2.replace(r#""hidden_size":32,"#, "");
        let e = ModelConfig::from_json_str(&missing, p)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("dir/config.json") && e.contains("hidden_size"),
            "{e}"
        );
        let unknown = QWEN2.replace(r#""bos_token_id":1"#, r#""bos_token_id":1,"moe_experts":8"#);
        let e = ModelConfig::from_json_str(&unknown, p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("moe_experts"), "{e}");
        let arch = QWEN2.replace(r#""model_type":"qwen2""#, r#""model_type":"gpt_neox""#);
        let e = ModelConfig::from_json_str(&arch, p).unwrap_err();
        assert!(matches!(e, ModelError::UnsupportedArch { .. }), "{e}");
        let scaled = QWEN2.replace(
            r#""rope_theta":10000.0"#,
            r#""rope_theta":10000.0,"rope_scaling":{"rope_type":"yarn","factor":4.0}"#,
        );
        let e = ModelConfig::from_json_str(&scaled, p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("yarn"), "{e}");
        let gqa = QWEN2.replace(r#""num_key_value_heads":2"#, r#""num_key_value_heads":3"#);
        assert!(ModelConfig::from_json_str(&gqa, p).is_err());
    }
}
