//! Records the versions of result-shaping dependencies (from the workspace's Cargo.lock) for run
//! records.
use std::fs;

fn main() {
    println!("cargo:rerun-if-changed=Cargo.lock");
    let wanted = [
        "arrow",
        "parquet",
        "tch",
        "tokenizers",
        "safetensors",
        "serde_json",
        "sha2",
    ];
    let lock = fs::read_to_string("Cargo.lock").unwrap_or_default();
    let mut out = Vec::new();
    let mut name: Option<String> = None;
    for line in lock.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            name = Some(n.trim_matches('"').to_string());
        } else if let Some(v) = line.strip_prefix("version = ") {
            if let Some(n) = name.take() {
                if wanted.contains(&n.as_str()) {
                    out.push(format!("{n}={}", v.trim_matches('"')));
                }
            }
        }
    }
    println!("cargo:rustc-env=RREDCOT_DEP_VERSIONS={}", out.join(","));
}
