//! Instance specs and cache keys.
//!
//! A spec is everything needed to run one stage instance anywhere (`rredcot stage exec KEY` on
//! this machine or a cluster node). Its key is the sha256 of the key material: kind, code
//! version, what runs (builtin name, or command + script bytes), canonical params, declared
//! outputs and the content hashes of the inputs. Paths never enter the key.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::defs::{Command, Resources};
use super::hash::sha256_json;

/// Bumped when the key material layout changes (invalidates every cache entry).
pub const KEY_FORMAT: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RunnerSpec {
    /// `in_worker`: tagged [`Executable::Worker`](super::programs::Executable) (stored specs
    /// written before the rename say `needs_ml`).
    Builtin {
        name: String,
        #[serde(alias = "needs_ml")]
        in_worker: bool,
    },
    External { command: Command, script: Option<PathBuf>, script_sha256: Option<String>, workdir: PathBuf },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InputSource {
    Instance { key: String, stage: String, output: String },
    File { path: PathBuf },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputSpec {
    pub schema: String,
    /// Content hash of the input artifact.
    pub hash: String,
    pub source: InputSource,
}

/// The schema of an input that is one opaque file, which a stage may read by its name (an
/// importer picks its parser by the extension and names its rows after the file).
pub const FILE_SCHEMA: &str = "file";

impl InputSpec {
    /// The name the stage sees, for a `file` input: its content hash alone would let two files
    /// of one content but different names share a key.
    pub fn file_name(&self) -> Option<String> {
        if self.schema != FILE_SCHEMA {
            return None;
        }
        Some(match &self.source {
            InputSource::File { path } => path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            InputSource::Instance { output, .. } => output.clone(),
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InstanceSpec {
    pub key: String,
    pub pipeline: String,
    pub instance: String,
    pub kind: String,
    pub code_version: String,
    pub runner: RunnerSpec,
    pub params: Map<String, Value>,
    pub inputs: BTreeMap<String, InputSpec>,
    /// output name -> schema name
    pub outputs: BTreeMap<String, String>,
    pub resources: Resources,
    #[serde(default)]
    pub git_rev: Option<String>,
}

impl InstanceSpec {
    /// The JSON that is hashed into the key (also kept in refs to explain staleness).
    pub fn key_material(&self) -> Value {
        let runner = match &self.runner {
            RunnerSpec::Builtin { name, .. } => json!({ "builtin": name }),
            RunnerSpec::External { command, script_sha256, .. } => json!({ "command": command, "script_sha256": script_sha256 }),
        };
        let inputs: Map<String, Value> = self
            .inputs
            .iter()
            .map(|(n, i)| {
                let mut input = json!({ "schema": i.schema, "hash": i.hash });
                if let Some(name) = i.file_name() {
                    input["name"] = json!(name);
                }
                (n.clone(), input)
            })
            .collect();
        json!({
            "key_format": KEY_FORMAT,
            "kind": self.kind,
            "code_version": self.code_version,
            "runner": runner,
            "params": Value::Object(self.params.clone()),
            "inputs": Value::Object(inputs),
            "outputs": self.outputs,
        })
    }

    pub fn compute_key(&self) -> String {
        sha256_json(&self.key_material())
    }
}

/// Short form of a key for humans.
pub fn short(key: &str) -> &str {
    &key[..key.len().min(12)]
}

/// Human-readable differences between two key materials ("why is this stale").
pub fn explain_change(old: &Value, new: &Value) -> Vec<String> {
    let mut why = Vec::new();
    let get = |v: &Value, k: &str| v.get(k).cloned().unwrap_or(Value::Null);
    for field in ["key_format", "kind", "code_version", "runner", "outputs"] {
        let (a, b) = (get(old, field), get(new, field));
        if a != b {
            why.push(match field {
                "code_version" => format!("code version changed: {} -> {}", a, b),
                "runner" => format!("command or script changed: {} -> {}", a, b),
                _ => format!("{field} changed: {a} -> {b}"),
            });
        }
    }
    let empty = Map::new();
    let obj = |v: &Value, k: &str| v.get(k).and_then(Value::as_object).cloned().unwrap_or_else(|| empty.clone());
    let (po, pn) = (obj(old, "params"), obj(new, "params"));
    let mut names: Vec<&String> = po.keys().chain(pn.keys()).collect();
    names.sort();
    names.dedup();
    for n in names {
        match (po.get(n), pn.get(n)) {
            (Some(a), Some(b)) if a != b => why.push(format!("param {n}: {a} -> {b}")),
            (None, Some(b)) => why.push(format!("param {n} added: {b}")),
            (Some(a), None) => why.push(format!("param {n} removed (was {a})")),
            _ => {}
        }
    }
    let (io, inw) = (obj(old, "inputs"), obj(new, "inputs"));
    let mut names: Vec<&String> = io.keys().chain(inw.keys()).collect();
    names.sort();
    names.dedup();
    for n in names {
        let h = |v: Option<&Value>| v.and_then(|x| x.get("hash")).and_then(Value::as_str).map(|s| short(s).to_string());
        let (a, b) = (h(io.get(n)), h(inw.get(n)));
        if a != b {
            why.push(format!("input {n} changed: {} -> {}", a.unwrap_or("none".into()), b.unwrap_or("none".into())));
        }
        let file_name = |v: Option<&Value>| v.and_then(|x| x.get("name")).cloned();
        let (a, b) = (file_name(io.get(n)), file_name(inw.get(n)));
        if a != b {
            why.push(format!("input {n} file name: {} -> {}", a.unwrap_or(Value::Null), b.unwrap_or(Value::Null)));
        }
    }
    why
}
