//! Makes `rredcot-worker` (and this package's tests and examples) find libtorch without
//! `LD_LIBRARY_PATH`: an rpath to the torch wheel's lib dir, plus `libtorch_cuda` force-linked into
//! the worker when the wheel has it, so CUDA is used automatically where a GPU is present.
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
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=PATH");
    if let Some(lib) = torch_lib_dir() {
        let worker = "rredcot-worker";
        // Every linked target of this package (worker, unit and integration tests, examples).
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
        if lib.join("libtorch_cuda.so").exists() {
            println!(
                "cargo:rustc-link-arg-bin={worker}=-Wl,--no-as-needed,-ltorch_cuda,--as-needed"
            );
            println!("cargo:rustc-link-arg-bin={worker}=-L{}", lib.display());
        }
    }
}
