//! Engine errors: every variant names the file, stage or instance it is about.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },

    #[error("{path}: stage `{stage}` uses unknown stage kind `{kind}` (looked in {searched}; known kinds: {known})")]
    UnknownKind {
        path: PathBuf,
        stage: String,
        kind: String,
        searched: String,
        known: String,
    },

    #[error("{path}: stage kind `{kind}` names builtin `{builtin}`, which this build does not have (known builtins: {known})")]
    UnknownBuiltin {
        path: PathBuf,
        kind: String,
        builtin: String,
        known: String,
    },

    #[error("{path}: stage `{stage}`: {message}")]
    Wiring {
        path: PathBuf,
        stage: String,
        message: String,
    },

    #[error("{path}: stage `{stage}` param `{param}`: {message}")]
    Param {
        path: PathBuf,
        stage: String,
        param: String,
        message: String,
    },

    #[error("{path}: the pipeline has a cycle: {cycle}")]
    Cycle { path: PathBuf, cycle: String },

    #[error("--set {arg}: {message}")]
    SetArg { arg: String, message: String },

    #[error("no stage or instance `{name}` in the pipeline (its stages: {known})")]
    NoSuchStage { name: String, known: String },

    #[error("store {path}: {message}")]
    Store { path: PathBuf, message: String },

    #[error(
        "no store at {path} (nothing has run with this store yet: check --store or RREDCOT_STORE)"
    )]
    NoStore { path: PathBuf },

    #[error("instance {key} ({stage}): {message}")]
    Instance {
        key: String,
        stage: String,
        message: String,
    },

    #[error("instance {key} ({stage}): interrupted by {}; nothing was committed", super::group::signal_name(*signal))]
    Interrupted {
        key: String,
        stage: String,
        signal: i32,
    },

    /// The OS error is part of the message, not a `source`: printing the chain (`{:#}`) would
    /// repeat it ("No such file or directory" twice).
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// Attach a path to an `io::Error`.
pub trait IoContext<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|error| EngineError::Io {
            path: path.into(),
            error,
        })
    }
}

impl EngineError {
    /// What `stage exec` exits with after this error: 128 + the signal when a termination signal
    /// stopped it, else 1.
    pub fn exit_code(&self) -> i32 {
        match self {
            EngineError::Interrupted { signal, .. } => 128 + signal,
            _ => 1,
        }
    }
}
