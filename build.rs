//! Records the versions of result-shaping dependencies (from Cargo.lock) for run records, and
//! with the `ml` feature makes `rredcot-worker` find libtorch without `LD_LIBRARY_PATH`: an rpath
//! to the torch wheel's lib dir, plus `libtorch_cuda` force-linked (only into the worker, only
//! when the wheel has it) so CUDA is used automatically where a GPU is present. The engine binary
//! `rredcot` never references libtorch.
use std::fs;
use std::path::PathBuf;
use std::process::Command;

fn torch_lib_dir() -> Option<PathBuf> {
    if let Ok(d) = std::env::var("LIBTORCH") {
        return Some(PathBuf::from(d).join("lib"));
    }
    let python = std::env::var("PYTHON_SYS_EXECUTABLE").unwrap_or_else(|_| "python".into());
    let out = Command::new(python)
        .args([
            "-c",
            "import torch,os;print(os.path.dirname(torch.__file__)+'/lib')",
        ])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn main() {
    println!("cargo:rerun-if-changed=Cargo.lock");
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=PATH");
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

    if std::env::var_os("CARGO_FEATURE_ML").is_some() {
        if let Some(lib) = torch_lib_dir() {
            let worker = "rredcot-worker";
            println!(
                "cargo:rustc-link-arg-bin={worker}=-Wl,-rpath,{}",
                lib.display()
            );
            // Tests and examples link libtorch too; give them the same rpath.
            println!("cargo:rustc-link-arg-tests=-Wl,-rpath,{}", lib.display());
            println!("cargo:rustc-link-arg-examples=-Wl,-rpath,{}", lib.display());
            if lib.join("libtorch_cuda.so").exists() {
                println!(
                    "cargo:rustc-link-arg-bin={worker}=-Wl,--no-as-needed,-ltorch_cuda,--as-needed"
                );
                println!("cargo:rustc-link-arg-bin={worker}=-L{}", lib.display());
            }
        }
    }
}
