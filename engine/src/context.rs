//! What a builtin stage function sees: its params, input and output paths, a progress reporter
//! and counters that end up in the run record.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::anyhow;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::schema::SchemaInfo;
use crate::record::RunRecord;
use crate::spec::InputSource;
use crate::store::Store;

/// A builtin stage: reads inputs, writes every declared output.
pub type BuiltinFn = fn(&mut StageContext) -> anyhow::Result<()>;

/// Prefix of the progress lines a stage prints on stdout; the runner turns them into bars.
pub const PROGRESS_PREFIX: &str = "@@progress ";

pub struct StageContext {
    pub instance: String,
    pub key: String,
    pub params: Map<String, Value>,
    pub inputs: BTreeMap<String, (SchemaInfo, PathBuf)>,
    /// Content hash of each input (what the instance key was computed from).
    pub input_hashes: BTreeMap<String, String>,
    /// Where each input came from (upstream instance and key, or a file): provenance for reports.
    pub input_sources: BTreeMap<String, InputSource>,
    pub outputs: BTreeMap<String, (SchemaInfo, PathBuf)>,
    /// Scratch space inside the instance's temp dir (not part of the artifact).
    pub scratch: PathBuf,
    /// `<store>/cache/`: state a stage keeps across its runs outside any instance (e.g. the HTTP
    /// judge's response cache), so a failed run's partial work is reused by the next one. Never
    /// part of an artifact or a key; a stage's output must not depend on whether it was there.
    pub cache_dir: PathBuf,
    pub counters: BTreeMap<String, i64>,
    pub metrics: Map<String, Value>,
}

impl StageContext {
    /// Every param at once, as the stage's params struct (serde: names, types and docs in one
    /// place; `#[serde(deny_unknown_fields)]` makes a param the stage file declares but the code
    /// does not read an error too). Errors name the stage and the param.
    pub fn params<P: DeserializeOwned>(&self) -> anyhow::Result<P> {
        parse_params(&self.instance, &self.params)
    }

    pub fn input(&self, name: &str) -> anyhow::Result<&Path> {
        self.inputs
            .get(name)
            .map(|(_, p)| p.as_path())
            .ok_or_else(|| anyhow!("stage `{}`: no input `{name}`", self.instance))
    }

    /// The content hash of input `name`.
    pub fn input_hash(&self, name: &str) -> anyhow::Result<&str> {
        self.input_hashes
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| anyhow!("stage `{}`: no input `{name}`", self.instance))
    }

    pub fn output(&self, name: &str) -> anyhow::Result<&Path> {
        self.outputs
            .get(name)
            .map(|(_, p)| p.as_path())
            .ok_or_else(|| anyhow!("stage `{}`: no output `{name}`", self.instance))
    }

    /// The run record of the instance that produced input `name`, when it came from one in this
    /// store (`cache_dir` is `<store>/cache`): its counters, e.g. the model cost of a scoring
    /// stage. None for a file input or a record the store does not have.
    pub fn upstream_record(&self, name: &str) -> Option<RunRecord> {
        let InputSource::Instance { key, .. } = self.input_sources.get(name)? else { return None };
        Store::unopened(self.cache_dir.parent()?).record(key)
    }

    pub fn count(&mut self, name: &str, n: i64) {
        *self.counters.entry(name.to_string()).or_insert(0) += n;
    }

    pub fn metric(&mut self, name: &str, v: impl Into<Value>) {
        self.metrics.insert(name.to_string(), v.into());
    }

    pub fn progress(&self, len: u64, message: &str) -> Progress {
        Progress::new(len, message)
    }
}

/// Progress reporting over stdout, throttled to a few lines per second.
pub struct Progress {
    pos: u64,
    len: u64,
    message: String,
    last: Option<Instant>,
}

impl Progress {
    pub fn new(len: u64, message: &str) -> Progress {
        let mut p = Progress {
            pos: 0,
            len,
            message: message.to_string(),
            last: None,
        };
        p.emit(true);
        p
    }

    pub fn inc(&mut self, n: u64) {
        self.pos += n;
        self.emit(false);
    }

    pub fn set(&mut self, pos: u64, message: &str) {
        self.pos = pos;
        self.message = message.to_string();
        self.emit(false);
    }

    pub fn finish(&mut self) {
        self.pos = self.len;
        self.emit(true);
    }

    fn emit(&mut self, force: bool) {
        let due = self
            .last
            .map(|t| t.elapsed() >= Duration::from_millis(200))
            .unwrap_or(true);
        if force || due || self.pos == self.len {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "{PROGRESS_PREFIX}{} {} {}",
                self.pos, self.len, self.message
            );
            let _ = out.flush();
            self.last = Some(Instant::now());
        }
    }
}

/// Prefix of the lines `stage exec` prints on stdout to tell the runner what it did other than
/// running the stage: `waiting` (another process holds the instance lock) and `reused` (the
/// instance was committed by someone else, nothing ran).
pub const STATUS_PREFIX: &str = "@@status ";

/// Tell the runner (on stdout) about waiting for or reusing an instance.
pub fn emit_status(status: ExecStatus) {
    let word = match status {
        ExecStatus::Waiting => "waiting",
        ExecStatus::Reused => "reused",
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{STATUS_PREFIX}{word}");
    let _ = out.flush();
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecStatus {
    Waiting,
    Reused,
}

/// Parse a status line.
pub fn parse_status(line: &str) -> Option<ExecStatus> {
    match line.strip_prefix(STATUS_PREFIX)?.trim() {
        "waiting" => Some(ExecStatus::Waiting),
        "reused" => Some(ExecStatus::Reused),
        _ => None,
    }
}

/// Parse a progress line: (pos, len, message).
pub fn parse_progress(line: &str) -> Option<(u64, u64, String)> {
    let rest = line.strip_prefix(PROGRESS_PREFIX)?;
    let mut it = rest.splitn(3, ' ');
    let pos = it.next()?.parse().ok()?;
    let len = it.next()?.parse().ok()?;
    Some((pos, len, it.next().unwrap_or("").to_string()))
}

/// `params` as a `P`, errors naming `stage` and the param (`StageContext::params`).
pub fn parse_params<P: DeserializeOwned>(stage: &str, params: &Map<String, Value>) -> anyhow::Result<P> {
    let v = Value::Object(params.clone());
    serde_path_to_error::deserialize(&v).map_err(|e| {
        let at = e.path().to_string();
        if at == "." {
            anyhow!("stage `{stage}`: params: {}", e.inner())
        } else {
            anyhow!("stage `{stage}`: param `{at}` = {}: {}", v.pointer(&format!("/{}", at.replace('.', "/"))).unwrap_or(&Value::Null), e.inner())
        }
    })
}

#[cfg(test)]
mod tests {
    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct P {
        lr: f64,
        steps: usize,
    }

    #[test]
    fn params_errors_name_the_stage_and_the_param() {
        let parse = |v: serde_json::Value| super::parse_params::<P>("train.update[3]", v.as_object().unwrap()).map_err(|e| e.to_string());
        assert_eq!(parse(serde_json::json!({"lr": 1e-4, "steps": 3})).unwrap().steps, 3);
        let e = parse(serde_json::json!({"lr": "fast", "steps": 3})).unwrap_err();
        assert!(e.contains("stage `train.update[3]`: param `lr` = \"fast\"") && e.contains("expected f64"), "{e}");
        let e = parse(serde_json::json!({"lr": 1e-4, "steps": 3, "lr_typo": 1})).unwrap_err();
        assert!(e.contains("stage `train.update[3]`") && e.contains("unknown field `lr_typo`"), "{e}");
        let e = parse(serde_json::json!({"lr": 1e-4})).unwrap_err();
        assert!(e.contains("missing field `steps`"), "{e}");
    }

    #[test]
    fn progress_lines_parse() {
        assert_eq!(
            super::parse_progress("@@progress 3 10 tokens/s 12"),
            Some((3, 10, "tokens/s 12".into()))
        );
        assert_eq!(super::parse_progress("hello"), None);
        assert_eq!(super::parse_progress("@@progress x 10"), None);
        assert_eq!(
            super::parse_status("@@status reused"),
            Some(super::ExecStatus::Reused)
        );
        assert_eq!(
            super::parse_status("@@status waiting"),
            Some(super::ExecStatus::Waiting)
        );
        assert_eq!(super::parse_status("@@status bogus"), None);
    }
}
