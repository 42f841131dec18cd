//! Errors of the model layer. Every variant names the file, tensor, field or row it is about, so a
//! failing stage says *what* was wrong with its inputs rather than panicking inside libtorch.

use std::path::PathBuf;

/// Result alias for the model layer.
pub type Result<T> = std::result::Result<T, ModelError>;

/// Everything that can go wrong while loading, running or saving a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: invalid config: {msg}")]
    Config { path: PathBuf, msg: String },
    #[error("{path}: unsupported architecture {arch:?} (supported: Qwen2, Qwen3, Llama)")]
    UnsupportedArch { path: PathBuf, arch: String },
    #[error("{path}: tensor {tensor}: unsupported GGUF type {ggml_type} ({name})")]
    UnsupportedQuant {
        path: PathBuf,
        tensor: String,
        ggml_type: u32,
        name: &'static str,
    },
    #[error("{path}: malformed GGUF file: {msg}")]
    Gguf { path: PathBuf, msg: String },
    #[error("{path}: tensor {tensor}: expected shape {expected:?}, found {found:?}")]
    Shape {
        path: PathBuf,
        tensor: String,
        expected: Vec<i64>,
        found: Vec<i64>,
    },
    #[error("{path}: missing tensor {tensor}")]
    MissingTensor { path: PathBuf, tensor: String },
    #[error("{path}: unexpected tensor {tensor} (not part of the {arch} architecture)")]
    UnexpectedTensor {
        path: PathBuf,
        tensor: String,
        arch: String,
    },
    #[error("{path}: tensor {tensor}: {msg}")]
    Tensor {
        path: PathBuf,
        tensor: String,
        msg: String,
    },
    #[error("{path}: safetensors: {msg}")]
    Safetensors { path: PathBuf, msg: String },
    #[error("tokenizer {path}: {msg}")]
    Tokenizer { path: PathBuf, msg: String },
    #[error("row {row}: sequence of {len} tokens exceeds the context window of {max} tokens")]
    ContextOverflow { row: usize, len: usize, max: usize },
    #[error("row {row}: non-finite logits (NaN or inf) at step {step}")]
    NonFinite { row: usize, step: usize },
    #[error("invalid request: {0}")]
    Request(String),
    #[error("torch: {context}: {source}")]
    Torch {
        context: String,
        #[source]
        source: tch::TchError,
    },
}

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.into(),
            source,
        }
    }
    pub(crate) fn config(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        ModelError::Config {
            path: path.into(),
            msg: msg.into(),
        }
    }
    pub(crate) fn gguf(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        ModelError::Gguf {
            path: path.into(),
            msg: msg.into(),
        }
    }
}

/// Attaches a context string to libtorch errors (`.ctx("loading model.embed_tokens.weight")`).
pub(crate) trait TorchCtx<T> {
    fn ctx(self, context: impl Into<String>) -> Result<T>;
}

impl<T> TorchCtx<T> for std::result::Result<T, tch::TchError> {
    fn ctx(self, context: impl Into<String>) -> Result<T> {
        self.map_err(|source| ModelError::Torch {
            context: context.into(),
            source,
        })
    }
}
