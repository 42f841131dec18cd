//! Helpers for CLI integration tests: a temp project with pipelines and stage files, and the
//! real `rredcot` binary run against a temp store.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub struct Project {
    pub dir: tempfile::TempDir,
}

impl Project {
    pub fn new() -> Project {
        let p = Project { dir: tempfile::tempdir().expect("tempdir") };
        std::fs::create_dir_all(p.path().join("stages")).unwrap();
        p
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn store(&self) -> PathBuf {
        self.path().join("store")
    }

    /// Write a file relative to the project; returns its path.
    pub fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }

    /// A pipeline file that finds the repo's stage kinds and the project's own `stages/`.
    pub fn pipeline(&self, name: &str, body: &str) -> PathBuf {
        let repo_stages = Path::new(env!("CARGO_MANIFEST_DIR")).join("stages");
        self.write(&format!("{name}.toml"), &format!("stage_dirs = [\"{}\", \"stages\"]\n{body}", repo_stages.display()))
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rredcot"));
        c.arg("--store").arg(self.store()).args(args).current_dir(self.path());
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run rredcot")
    }

    /// `pipeline run --json` that must succeed; returns the summary.
    pub fn run_ok(&self, pipeline: &Path, extra: &[&str]) -> Value {
        let p = pipeline.to_str().unwrap();
        let mut args = vec!["pipeline", "run", p, "--json"];
        args.extend_from_slice(extra);
        let out = self.run(&args);
        assert!(out.status.success(), "pipeline run failed:\nstdout:\n{}\nstderr:\n{}", text(&out.stdout), text(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("summary JSON: {e}\n{}", text(&out.stdout)))
    }

    /// Committed instance keys (those with a run.json).
    pub fn committed(&self) -> Vec<String> {
        let mut keys: Vec<String> = std::fs::read_dir(self.store().join("instances"))
            .map(|d| d.flatten().filter(|e| e.path().join("run.json").is_file()).map(|e| e.file_name().to_string_lossy().to_string()).collect())
            .unwrap_or_default();
        keys.sort();
        keys
    }

    pub fn record(&self, key: &str) -> Value {
        serde_json::from_slice(&std::fs::read(self.store().join("instances").join(key).join("run.json")).unwrap()).unwrap()
    }
}

/// The project venv's Python (`RREDCOT_VENV`, else `.venv`), else `python3` on the PATH.
pub fn python() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = std::env::var_os("RREDCOT_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".venv"));
    let p = venv.join("bin/python");
    if p.exists() {
        p
    } else {
        PathBuf::from("python3")
    }
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

pub fn names(summary: &Value, field: &str) -> Vec<String> {
    let mut v: Vec<String> = summary[field].as_array().unwrap().iter().map(|x| x.as_str().unwrap().to_string()).collect();
    v.sort();
    v
}

/// The engine demo pipeline body (numbers -> double/triple -> sums, a 4-step chain, final).
pub const DEMO: &str = r#"
[[stage]]
name = "numbers"
uses = "demo_numbers"
params = { n = 200, seed = 7 }

[[stage]]
name = "double"
uses = "demo_scale"
inputs = { table = "numbers.table" }
params = { factor = 2.0 }

[[stage]]
name = "triple"
uses = "demo_scale"
inputs = { table = "numbers.table" }
params = { factor = 3.0 }

[[stage]]
name = "sum_double"
uses = "demo_sum"
inputs = { table = "double.table" }

[[stage]]
name = "sum_triple"
uses = "demo_sum"
inputs = { table = "triple.table" }

[[chain]]
name = "train"
repeat = 4
carry = { "step.state" = "step.state" }

  [[chain.stage]]
  name = "step"
  uses = "demo_step"
  inputs = { state = "sum_double.table" }

[[stage]]
name = "final"
uses = "demo_sum"
inputs = { table = "train.step[last].state" }
"#;

/// `--set TARGET.inputs.NAME=file:EXISTING` for every input of a pipeline that points at a file
/// under `../models/` or `../data/paper/` (not shipped): datasets to the GSM8K fixture, models to
/// a directory of the repo (planning hashes inputs, it does not load them).
pub fn user_files(pipeline: &std::path::Path) -> Vec<String> {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc: toml::Table = toml::from_str(&std::fs::read_to_string(pipeline).unwrap()).unwrap();
    let mut uses: Vec<(String, toml::Table)> = Vec::new();
    for st in doc.get("stage").and_then(|v| v.as_array()).into_iter().flatten() {
        uses.push((st["name"].as_str().unwrap().to_string(), st.get("inputs").and_then(|i| i.as_table()).cloned().unwrap_or_default()));
    }
    for ch in doc.get("chain").and_then(|v| v.as_array()).into_iter().flatten() {
        for st in ch["stage"].as_array().unwrap() {
            let target = format!("{}.{}", ch["name"].as_str().unwrap(), st["name"].as_str().unwrap());
            uses.push((target, st.get("inputs").and_then(|i| i.as_table()).cloned().unwrap_or_default()));
        }
    }
    let mut sets = Vec::new();
    for (target, inputs) in uses {
        for (name, v) in inputs {
            let v = v.as_str().unwrap_or("");
            let to = if v.starts_with("file:../data/paper/") {
                repo.join("data/gsm8k-mgs/gsm8k-mgs-eng.jsonl")
            } else if v.starts_with("file:../models/") {
                repo.join("data/layouts")
            } else {
                continue;
            };
            sets.push(format!("{target}.inputs.{name}=file:{}", to.display()));
        }
    }
    sets
}
