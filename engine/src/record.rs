//! The run record (`run.json`): written last inside an instance; its presence commits the instance.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::spec::InputSpec;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileRecord {
    /// Path relative to the instance's `outputs/` directory.
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
    pub mtime_ns: i128,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputRecord {
    pub schema: String,
    /// Content hash of the artifact (manifest of its files).
    pub hash: String,
    pub files: Vec<FileRecord>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    pub key: String,
    /// Instance name in its pipeline, e.g. `train.update[3]`.
    pub stage: String,
    pub kind: String,
    pub pipeline: String,
    pub code_version: String,
    pub inputs: BTreeMap<String, InputSpec>,
    /// Every input's bytes were re-hashed and matched `inputs[..].hash` before the stage read
    /// them. Records without it (older builds) may come from a corrupt input that only passed the
    /// size+mtime check, so `artifact verify` treats them as suspect when that input is corrupt.
    #[serde(default)]
    pub inputs_verified: bool,
    pub params: Map<String, Value>,
    pub outputs: BTreeMap<String, OutputRecord>,
    pub start: String,
    pub end: String,
    pub wall_s: f64,
    pub peak_rss_mb: f64,
    pub host: String,
    pub git_rev: Option<String>,
    /// rredcot and key dependency versions.
    pub versions: BTreeMap<String, String>,
    /// Stage-reported integers, e.g. `tokens_generated`.
    pub counters: BTreeMap<String, i64>,
    /// Stage-reported values that are not integers (accuracy, filter report...).
    #[serde(default)]
    pub metrics: Map<String, Value>,
}
