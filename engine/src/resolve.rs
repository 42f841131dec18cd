//! Turning plan nodes into instance specs (and keys) once their upstream outputs are known.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use super::error::Result;
use super::hash::sha256_file;
use super::plan::{InputRef, Plan, Runner};
use super::record::RunRecord;
use super::spec::{InputSource, InputSpec, InstanceSpec, RunnerSpec};
use super::file_hashes::FileHashes;

/// A `file:` input is hashed as an artifact (manifest); a script by its raw bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum HashKind {
    Source,
    ScriptBytes,
}

pub struct Resolver<'a> {
    pub plan: &'a Plan,
    /// (path, hash kind) -> hash: each source file and script is hashed once per run.
    file_hashes: HashMap<(PathBuf, HashKind), String>,
    /// Hashes of large source files remembered across runs.
    remembered: FileHashes,
    git_rev: Option<Option<String>>,
}

impl<'a> Resolver<'a> {
    /// `hashes`: where large `file:` inputs' hashes are remembered ([`FileHashes::in_store`]).
    pub fn new(plan: &'a Plan, hashes: FileHashes) -> Self {
        Resolver { plan, file_hashes: HashMap::new(), remembered: hashes, git_rev: None }
    }

    /// Upstream nodes of `i` (each once).
    pub fn upstream(&self, i: usize) -> Vec<usize> {
        let mut ups: Vec<usize> =
            self.plan.nodes[i].inputs.values().filter_map(|r| if let InputRef::Output { node, .. } = r { Some(*node) } else { None }).collect();
        ups.sort();
        ups.dedup();
        ups
    }

    /// Build the spec of node `i`; `done[j]` holds the run record of every upstream node.
    pub fn spec(&mut self, i: usize, done: &[Option<Arc<RunRecord>>]) -> Result<InstanceSpec> {
        let node = &self.plan.nodes[i];
        let mut inputs = BTreeMap::new();
        for (name, r) in &node.inputs {
            let schema = node.kind.input_schema(name).expect("wired inputs have a schema").name().to_string();
            let spec = match r {
                InputRef::Output { node: up, output } => {
                    let rec = done[*up].as_ref().expect("upstream resolved before downstream");
                    let hash = rec.outputs.get(output).map(|o| o.hash.clone()).unwrap_or_default();
                    InputSpec {
                        schema,
                        hash,
                        source: InputSource::Instance { key: rec.key.clone(), stage: self.plan.nodes[*up].name.clone(), output: output.clone() },
                    }
                }
                InputRef::File { path } => {
                    let hash = self.cached_hash(path, HashKind::Source)?;
                    let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
                    InputSpec { schema, hash, source: InputSource::File { path: abs } }
                }
            };
            inputs.insert(name.clone(), spec);
        }
        let runner = match &node.kind.runner {
            Runner::Builtin { name, in_worker } => RunnerSpec::Builtin { name: name.clone(), in_worker: *in_worker },
            Runner::External { command, script, workdir } => {
                let script_sha256 = match script {
                    Some(s) => Some(self.cached_hash(s, HashKind::ScriptBytes)?),
                    None => None,
                };
                let abs = |p: &PathBuf| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
                RunnerSpec::External { command: command.clone(), script: script.as_ref().map(abs), script_sha256, workdir: abs(workdir) }
            }
        };
        let mut spec = InstanceSpec {
            key: String::new(),
            pipeline: self.plan.name.clone(),
            instance: node.name.clone(),
            kind: node.kind.name.clone(),
            code_version: node.kind.code_version.clone(),
            runner,
            params: node.params.clone(),
            inputs,
            outputs: node.kind.outputs.iter().map(|(n, s)| (n.clone(), s.name().to_string())).collect(),
            resources: node.resources.clone(),
            git_rev: None,
        };
        spec.key = spec.compute_key();
        Ok(spec)
    }

    fn cached_hash(&mut self, path: &std::path::Path, kind: HashKind) -> Result<String> {
        if let Some(h) = self.file_hashes.get(&(path.to_path_buf(), kind)) {
            return Ok(h.clone());
        }
        let h = match kind {
            HashKind::Source => self.remembered.source(path)?,
            HashKind::ScriptBytes => sha256_file(path)?,
        };
        self.file_hashes.insert((path.to_path_buf(), kind), h.clone());
        Ok(h)
    }

    /// The pipeline's git revision, asked once and only when something runs.
    pub fn git_rev(&mut self) -> Option<String> {
        if self.git_rev.is_none() {
            let dir = self.plan.file.parent().map(|p| if p.as_os_str().is_empty() { PathBuf::from(".") } else { p.to_path_buf() });
            let out = std::process::Command::new("git")
                .arg("-C")
                .arg(dir.unwrap_or_else(|| PathBuf::from(".")))
                .args(["rev-parse", "HEAD"])
                .stderr(std::process::Stdio::null())
                .output()
                .ok();
            let rev = out.filter(|o| o.status.success()).map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
            self.git_rev = Some(rev);
        }
        self.git_rev.clone().flatten()
    }
}
