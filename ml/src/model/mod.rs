//! Decoder language models on `tch` (libtorch): Qwen2, Qwen3 and Llama (SmolLM2), loaded from
//! Hugging Face directories or GGUF files, with batched KV-cache sampling and batched prefix
//! scoring. Compiled only with the `ml` feature and linked only into `rredcot-worker`.
//!
//! Owns: architectures ([`decoder`], [`layers`], [`qwen2`], [`qwen3`], [`llama`]), weights
//! ([`weights`], [`gguf`]), [`tokenizer`], [`generate`] and [`score`]. Knows nothing of the
//! engine, stages or artifacts: stages call [`load`], [`generate::generate`],
//! [`score::score_cuts`] and use [`decoder::DecoderLm::forward`] with gradients for training.

pub mod config;
pub mod cpu_matmul;
pub mod cuda_graph;
pub mod decoder;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod head;
pub mod layers;
pub mod llama;
pub mod matmul_precision;
pub mod nucleus;
pub mod qwen2;
pub mod qwen3;
pub mod score;
mod static_decode;
pub mod step_profile;
pub mod tokenizer;
pub mod weights;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::{Device, Kind};

pub use config::{Arch, ModelConfig};
pub use decoder::DecoderLm;
pub use error::{ModelError, Result};
pub use generate::{
    generate, generate_continuous, generate_continuous_with_progress, generate_continuous_within_context, generate_fed, generate_with_progress, prefilled_positions,
    fed_rows_may_mix_distributions, prefill_completion, same_distribution, FedRow, FinishReason,
    Generation, Prefilled, RowFeed, SamplingParams, StopRules,
};
pub use layers::KvCache;
pub use score::{
    embedding_grad_l1, logprob, score_cuts, score_cuts_batch, score_cuts_many, score_cuts_naive, score_cuts_reusing, CutCost,
    CutRequest, CutScorer, PackError, PrefixReuse, SharedRows,
};
pub use tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

/// Where to run. `Auto` = CUDA device 0 if libtorch sees one, else CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    #[default]
    Auto,
    Cpu,
    Cuda,
}

impl DeviceChoice {
    /// The choice that loads onto `device` (CUDA means device 0, the only one `Cuda` names).
    pub fn of(device: Device) -> DeviceChoice {
        match device {
            Device::Cpu => DeviceChoice::Cpu,
            _ => DeviceChoice::Cuda,
        }
    }
}

/// Parameter dtype for inference. `Auto` = float32 on every device, the exact choice: bf16
/// scoring moved log-probabilities by up to 0.48 nats (the 1.5B Qwen2 shape on an H200,
/// bench/results/gpu.json), and bf16 rollouts on CUDA did not equal the CPU's. bf16 is no faster
/// at batch 1 and faster at large batches (H100, warm, sampled: 123 vs 127 tok/s at b1, 7658 vs
/// 5079 at b64, 19404 vs 7807 at b256), so `Bf16` is there for large-batch rollouts that can take
/// the rounding. `Tf32` (CUDA only) keeps float32 weights and activations with TF32 products
/// ([`matmul_precision`]): the tensor cores for float32 work, with far less rounding than bf16.
/// (Training has its own `dtype`: [`crate::train::step`].)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DtypeChoice {
    #[default]
    Auto,
    F32,
    Bf16,
    Tf32,
}

/// How to load a model (stage params map onto this).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LoadOptions {
    #[serde(default)]
    pub device: DeviceChoice,
    #[serde(default)]
    pub dtype: DtypeChoice,
}

impl LoadOptions {
    pub fn device(&self) -> Result<Device> {
        match self.device {
            DeviceChoice::Auto => Ok(Device::cuda_if_available()),
            DeviceChoice::Cpu => Ok(Device::Cpu),
            DeviceChoice::Cuda if tch::Cuda::is_available() => Ok(Device::Cuda(0)),
            DeviceChoice::Cuda if std::env::var_os("CUDA_VISIBLE_DEVICES").is_some_and(|v| v.is_empty()) => {
                Err(ModelError::Request(
                    "device = cuda but CUDA_VISIBLE_DEVICES is empty: the engine hides the GPUs from a stage \
                     without a GPU slot, so give it one (`resources.gpus = 1` in its stage file or pipeline)"
                        .into(),
                ))
            }
            DeviceChoice::Cuda => Err(ModelError::Request(
                "device = cuda but libtorch sees no CUDA device".into(),
            )),
        }
    }

    pub fn kind(&self, _device: Device) -> Kind {
        match self.dtype {
            DtypeChoice::F32 | DtypeChoice::Auto | DtypeChoice::Tf32 => Kind::Float,
            DtypeChoice::Bf16 => Kind::BFloat16,
        }
    }

    /// Sets this process's CUDA float32 products for a model loaded on `device` (TF32 for
    /// `Tf32`, float32 otherwise: a warm stage process serves stages of either kind).
    /// `Tf32` on the CPU is an error: it has no TF32 products.
    pub fn apply_matmul_precision(&self, device: Device) -> Result<()> {
        let tf32 = self.dtype == DtypeChoice::Tf32;
        if tf32 && !device.is_cuda() {
            return Err(ModelError::Request(
                "dtype = tf32 is TensorFloat-32 products on CUDA, and this model is on the CPU: use f32 (or auto)".into(),
            ));
        }
        matmul_precision::set_cuda_matmul_tf32(tf32);
        Ok(())
    }
}

/// A model with its tokenizer, ready to generate or score.
#[derive(Debug)]
pub struct LoadedModel {
    pub model: DecoderLm,
    /// `None` for a Hugging Face directory without `tokenizer.json`.
    pub tokenizer: Option<Tokenizer>,
    pub source: PathBuf,
}

/// The chat template used for an architecture's checkpoints.
pub fn default_template(arch: Arch) -> ChatTemplate {
    match arch {
        Arch::Qwen2 | Arch::Qwen3 => ChatTemplate::Qwen,
        Arch::Llama => ChatTemplate::SmolLm2,
    }
}

/// EOS ids of `generation_config.json` (if present), else of the config.
fn eos_ids(dir: &Path, cfg: &ModelConfig) -> Result<Vec<i64>> {
    let path = dir.join("generation_config.json");
    if !path.exists() {
        return Ok(cfg.eos_token_ids.clone());
    }
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ModelError::config(&path, e.to_string()))?;
    Ok(match v.get("eos_token_id") {
        Some(serde_json::Value::Number(n)) => n.as_i64().into_iter().collect(),
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|x| x.as_i64()).collect(),
        _ => cfg.eos_token_ids.clone(),
    })
}

/// The config and tokenizer of a Hugging Face checkpoint directory, without its weights (what a
/// stage that samples through an inference engine needs).
pub fn load_config(dir: &Path) -> Result<(ModelConfig, Option<Tokenizer>)> {
    let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
    let tok_path = dir.join("tokenizer.json");
    let tokenizer = if tok_path.exists() {
        Some(Tokenizer::from_file(&tok_path, default_template(cfg.arch), eos_ids(dir, &cfg)?)?)
    } else {
        None
    };
    Ok((cfg, tokenizer))
}

/// Loads a Hugging Face checkpoint directory or a `.gguf` file.
pub fn load(path: &Path, opts: &LoadOptions) -> Result<LoadedModel> {
    let device = opts.device()?;
    opts.apply_matmul_precision(device)?;
    let (mut model, tokenizer) = if path.is_dir() {
        let (cfg, tokenizer) = load_config(path)?;
        let mut model = DecoderLm::new(&cfg, device);
        weights::load_safetensors_dir(&mut model, path)?;
        (model, tokenizer)
    } else {
        let g = gguf::GgufModel::load(path, device)?;
        (g.model, Some(g.tokenizer))
    };
    let kind = opts.kind(device);
    if kind != Kind::Float {
        model.set_kind(kind);
    }
    Ok(LoadedModel {
        model,
        tokenizer,
        source: path.into(),
    })
}

/// Files beside a checkpoint's weights that transformers reads for its tokenizer and chat template
/// and that [`save`] does not write.
const TOKENIZER_SIDE_FILES: &[&str] = &["tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "chat_template.json"];

/// Copies [`TOKENIZER_SIDE_FILES`] from the checkpoint directory a model was trained from into
/// the one it is saved to (without them `AutoTokenizer` loads the trained policy with no EOS
/// token and no chat template); none from a GGUF file. Returns how many were copied.
pub fn copy_tokenizer_files(from: &Path, to: &Path) -> Result<usize> {
    let mut copied = 0;
    for name in TOKENIZER_SIDE_FILES {
        let src = from.join(name);
        if from.is_dir() && src.is_file() && !to.join(name).exists() {
            std::fs::copy(&src, to.join(name)).map_err(|e| ModelError::io(&src, e))?;
            copied += 1;
        }
    }
    Ok(copied)
}

/// Saves a model (and tokenizer) as a Hugging Face checkpoint directory loadable by
/// `transformers.AutoModelForCausalLM.from_pretrained`.
pub fn save(model: &DecoderLm, tokenizer: Option<&Tokenizer>, dir: &Path) -> Result<()> {
    weights::save_hf(model, dir)?;
    if let Some(t) = tokenizer {
        t.save(&dir.join("tokenizer.json"))?;
    }
    let gen = serde_json::json!({
        "bos_token_id": model.cfg.bos_token_id,
        "eos_token_id": tokenizer.map_or(model.cfg.eos_token_ids.clone(), |t| t.eos_ids.clone()),
    });
    let p = dir.join("generation_config.json");
    std::fs::write(&p, serde_json::to_string_pretty(&gen).expect("json"))
        .map_err(|e| ModelError::io(&p, e))
}

#[cfg(test)]
mod side_file_tests {
    /// A trained checkpoint keeps its source's tokenizer config and chat template; what `save`
    /// wrote is not overwritten; a GGUF source gives none.
    #[test]
    fn tokenizer_side_files_follow_the_checkpoint() {
        let (from, to) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::write(from.path().join("tokenizer_config.json"), r#"{"eos_token": "<|im_end|>"}"#).unwrap();
        std::fs::write(from.path().join("chat_template.jinja"), "{{ messages }}").unwrap();
        std::fs::write(from.path().join("model.safetensors"), "weights").unwrap();
        std::fs::write(to.path().join("chat_template.jinja"), "mine").unwrap();
        assert_eq!(super::copy_tokenizer_files(from.path(), to.path()).unwrap(), 1);
        assert_eq!(std::fs::read_to_string(to.path().join("tokenizer_config.json")).unwrap(), r#"{"eos_token": "<|im_end|>"}"#);
        assert_eq!(std::fs::read_to_string(to.path().join("chat_template.jinja")).unwrap(), "mine");
        assert!(!to.path().join("model.safetensors").exists());
        let gguf = from.path().join("model.gguf");
        std::fs::write(&gguf, "GGUF").unwrap();
        assert_eq!(super::copy_tokenizer_files(&gguf, to.path()).unwrap(), 0);
    }
}
