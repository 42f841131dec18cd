//! Stage-kind files (`stages/*.toml`) and pipeline files (`pipelines/*.toml`), as written by users.
//!
//! A stage kind reads like a recipe card: what it runs (a builtin or a command), its inputs and
//! outputs with their artifact schema, default params and resources. A pipeline instantiates kinds,
//! wires outputs to inputs and may unroll a chain of stages N times.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::{EngineError, IoContext, Result};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageKindFile {
    pub name: Option<String>,
    /// Start from that stage kind's file and state only what differs (merged in `plan`; the
    /// merged file has none).
    pub extends: Option<String>,
    #[serde(default)]
    pub description: String,
    /// Name of a builtin Rust stage function.
    pub builtin: Option<String>,
    /// External command: an argv list (no shell) or one string run with `sh -c`.
    /// Placeholders: `{io}` (path of the JSON with inputs/outputs/params), `{script}`.
    pub command: Option<Command>,
    /// Script the command runs, relative to the stage file; its bytes enter the cache key.
    pub script: Option<PathBuf>,
    /// Code-version string: bump it when the stage's behaviour changes.
    #[serde(default = "default_version")]
    pub version: String,
    #[serde(default)]
    pub inputs: BTreeMap<String, String>,
    /// Groups of inputs of one schema, any number of them: a pipeline wires `group.label = ref`
    /// (e.g. a report's `evals.GRPO`, an eval's `benchmarks.math500`), and `chain.stage[*].out`
    /// wires one input per step (`group.label[i]`).
    #[serde(default)]
    pub input_groups: BTreeMap<String, String>,
    #[serde(default)]
    pub outputs: BTreeMap<String, String>,
    #[serde(default)]
    pub params: toml::Table,
    #[serde(default)]
    pub resources: Resources,
}

fn default_version() -> String {
    "1".to_string()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Command {
    Argv(Vec<String>),
    Shell(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    #[serde(default = "one")]
    pub cpus: u32,
    /// GPUs the stage uses when the machine has them (on a CPU-only machine it runs on CPU).
    #[serde(default)]
    pub gpus: u32,
    /// Memory request, e.g. "4G" (passed to Slurm; informational locally).
    #[serde(default)]
    pub mem: Option<String>,
    /// Wall-time limit in Slurm's format, e.g. "02:00:00": `--time` on Slurm; locally the stage's
    /// process group is killed when it runs longer.
    #[serde(default)]
    pub time: Option<String>,
}

/// A pipeline's `resources` for one stage use: the entries it names replace the kind's.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourcesOverride {
    pub cpus: Option<u32>,
    pub gpus: Option<u32>,
    pub mem: Option<String>,
    pub time: Option<String>,
}

impl Resources {
    /// These resources with `o`'s entries in place of theirs.
    pub fn overridden(&self, o: &ResourcesOverride) -> Resources {
        Resources {
            cpus: o.cpus.unwrap_or(self.cpus),
            gpus: o.gpus.unwrap_or(self.gpus),
            mem: o.mem.clone().or_else(|| self.mem.clone()),
            time: o.time.clone().or_else(|| self.time.clone()),
        }
    }

    /// `time` as a duration; Err names the accepted forms.
    pub fn time_limit(&self) -> std::result::Result<Option<std::time::Duration>, String> {
        match &self.time {
            None => Ok(None),
            Some(t) => parse_slurm_time(t).map(Some).ok_or_else(|| {
                format!("resources.time `{t}`: expected Slurm's format: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
            }),
        }
    }
}

/// Slurm's `--time` forms: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`.
pub fn parse_slurm_time(s: &str) -> Option<std::time::Duration> {
    let num = |x: &str| -> Option<u64> {
        (!x.is_empty() && x.bytes().all(|b| b.is_ascii_digit()))
            .then(|| x.parse().ok())
            .flatten()
    };
    let s = s.trim();
    let (days, rest) = match s.split_once('-') {
        Some((d, r)) => (Some(num(d)?), r),
        None => (None, s),
    };
    let parts: Vec<u64> = rest.split(':').map(num).collect::<Option<_>>()?;
    let secs = match (days, parts.as_slice()) {
        (None, [m]) => m * 60,
        (None, [m, s]) => m * 60 + s,
        (None, [h, m, s]) => h * 3600 + m * 60 + s,
        (Some(d), [h]) => d * 86400 + h * 3600,
        (Some(d), [h, m]) => d * 86400 + h * 3600 + m * 60,
        (Some(d), [h, m, s]) => d * 86400 + h * 3600 + m * 60 + s,
        _ => return None,
    };
    Some(std::time::Duration::from_secs(secs))
}

fn one() -> u32 {
    1
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            cpus: 1,
            gpus: 0,
            mem: None,
            time: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineFile {
    pub name: Option<String>,
    #[serde(default)]
    pub description: String,
    /// Directories searched for stage-kind files, relative to the pipeline file.
    #[serde(default)]
    pub stage_dirs: Vec<PathBuf>,
    #[serde(default)]
    pub stage: Vec<StageUse>,
    #[serde(default)]
    pub chain: Vec<ChainDef>,
}

/// One use of a stage kind in a pipeline.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageUse {
    pub name: String,
    /// Stage kind (file `stages/<uses>.toml`); defaults to `name`.
    pub uses: Option<String>,
    /// input name -> `stage.output`, `chain.stage[i].output`, or `file:relative/path`.
    #[serde(default)]
    pub inputs: BTreeMap<String, String>,
    #[serde(default)]
    pub params: toml::Table,
    /// Resources of this use, entry by entry over the kind's (e.g. `{ cpus = 1 }` with
    /// `threads = 1`, so two such stages run side by side). Not part of the instance key.
    #[serde(default)]
    pub resources: Option<ResourcesOverride>,
    /// Set when `--set NAME.uses=KIND` swapped the kind: the file's params the new kind lacks are
    /// dropped (with a warning) instead of being errors.
    #[serde(skip)]
    pub kind_swapped: bool,
}

/// A chain of stages unrolled `repeat` times into instances `chain.stage[0..repeat]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChainDef {
    pub name: String,
    pub repeat: usize,
    /// For steps i > 0: `"stage.input" = "stage.output"` wires an input to step i-1's output.
    #[serde(default)]
    pub carry: BTreeMap<String, String>,
    pub stage: Vec<StageUse>,
}

/// Parse a TOML file into `T`; errors carry the file path and toml's line/column report.
pub fn parse_toml_file<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).at(path)?;
    toml::from_str(&text).map_err(|e| EngineError::Parse {
        path: path.to_path_buf(),
        message: describe_toml_error(&text, &e),
    })
}

/// toml's message plus an explicit "line L, column C" computed from the error span.
fn describe_toml_error(text: &str, e: &toml::de::Error) -> String {
    let msg = e.message().trim().to_string();
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let col = before
                .rsplit('\n')
                .next()
                .map(|l| l.chars().count())
                .unwrap_or(0)
                + 1;
            let src = text.lines().nth(line - 1).unwrap_or("");
            format!("line {line}, column {col}: {msg}\n  | {src}")
        }
        None => msg,
    }
}

#[cfg(test)]
mod tests {
    use super::parse_slurm_time;
    use std::time::Duration;

    #[test]
    fn slurm_time_forms() {
        let secs = |s: &str| parse_slurm_time(s).map(|d: Duration| d.as_secs());
        assert_eq!(secs("5"), Some(300));
        assert_eq!(secs("0:02"), Some(2));
        assert_eq!(secs("02:00:00"), Some(7200));
        assert_eq!(secs("1-2"), Some(93600));
        assert_eq!(secs("1-0:30"), Some(88200));
        assert_eq!(secs("1-00:00:05"), Some(86405));
        for bad in ["", "x", "1:2:3:4", "-5", "1-", "1.5", "1-2:3:4:5"] {
            assert_eq!(secs(bad), None, "{bad}");
        }
    }
}
