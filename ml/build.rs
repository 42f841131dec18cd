//! Makes `rredcot-worker` (and this package's tests and examples) find libtorch without
//! `LD_LIBRARY_PATH`: an rpath to the torch wheel's lib dir, plus `libtorch_cuda` force-linked into
//! the worker when the wheel has it, so CUDA is used automatically where a GPU is present.
use std::path::PathBuf;
use std::process::Command;

/// What the build's python (torch-sys's `PYTHON_SYS_EXECUTABLE`, else `python`) prints for
/// `code`, when it runs and prints something.
fn python_prints(code: &str) -> Option<String> {
    let python = std::env::var("PYTHON_SYS_EXECUTABLE").unwrap_or_else(|_| "python".into());
    let out = Command::new(python).args(["-c", code]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn torch_lib_dir() -> Option<PathBuf> {
    if let Ok(d) = std::env::var("LIBTORCH") {
        return Some(PathBuf::from(d).join("lib"));
    }
    python_prints("import torch,os;print(os.path.dirname(torch.__file__)+'/lib')").map(PathBuf::from)
}

/// Include directories of the CUDA runtime headers libtorch's CUDA headers include:
/// `CUDA_INCLUDE` (`:`-separated; the wheels' `cuda_runtime.h` also needs `crt/`, which PyPI
/// `nvidia-cuda-crt` ships), else those of the NVIDIA wheels beside the python's torch.
fn cuda_include() -> Option<Vec<PathBuf>> {
    if let Ok(d) = std::env::var("CUDA_INCLUDE") {
        return Some(std::env::split_paths(&d).collect());
    }
    let dir = python_prints("import torch,os,glob;r=os.path.dirname(os.path.dirname(torch.__file__));print(([d for d in glob.glob(r+'/nvidia/*/include') if os.path.exists(d+'/cuda_runtime_api.h')]+[''])[0])")?;
    Some(vec![PathBuf::from(dir)])
}

/// `RREDCOT_CUDA_GRAPHS=1`: compiles ml/csrc/cuda_graph.cpp (CUDA graphs for the decode loop,
/// src/model/cuda_graph.rs) against libtorch's CUDA headers and sets `cfg(rredcot_cuda_graphs)`.
/// Off by default: it needs a CUDA build of libtorch and the CUDA runtime headers, and only a
/// GPU host uses it (bench/gpu_bundle.sh turns it on).
fn cuda_graphs(lib: &std::path::Path) {
    println!("cargo:rerun-if-env-changed=RREDCOT_CUDA_GRAPHS");
    println!("cargo:rerun-if-env-changed=CUDA_INCLUDE");
    println!("cargo:rerun-if-changed=csrc/cuda_graph.cpp");
    if std::env::var("RREDCOT_CUDA_GRAPHS").as_deref() != Ok("1") {
        return;
    }
    let include = lib.parent().expect("libtorch root").join("include");
    let cuda = cuda_include().expect("RREDCOT_CUDA_GRAPHS=1 needs the CUDA runtime headers: set CUDA_INCLUDE");
    shim("csrc/cuda_graph.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .includes(cuda)
        .compile("rredcot_cuda_graph");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_cuda");
    println!("cargo:rustc-link-lib=dylib=c10_cuda");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-cfg=rredcot_cuda_graphs");
}

/// Compiles ml/csrc/cpu_capability.cpp (ATen's CPU kernel set for the run records,
/// src/aten_kernels.rs): a declaration of a libtorch function, no torch headers.
fn cpu_capability() {
    println!("cargo:rerun-if-changed=csrc/cpu_capability.cpp");
    shim("csrc/cpu_capability.cpp").compile("rredcot_cpu_capability");
}

/// A C++17 build of `file` with libtorch's C++ ABI (`LIBTORCH_CXX11_ABI`, default 1), warnings
/// off (libtorch's headers are not ours).
fn shim(file: &str) -> cc::Build {
    let abi = std::env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".into());
    let mut b = cc::Build::new();
    b.cpp(true).file(file).flag("-std=c++17").flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}")).warnings(false);
    b
}

/// Compiles ml/csrc/cpu_cache.cpp (the caching CPU allocator, src/cpu_cache.rs) against
/// libtorch's c10 headers and sets `cfg(rredcot_cpu_cache)`.
fn cpu_cache(lib: &std::path::Path) {
    println!("cargo:rerun-if-changed=csrc/cpu_cache.cpp");
    let include = lib.parent().expect("libtorch root").join("include");
    shim("csrc/cpu_cache.cpp").include(&include).compile("rredcot_cpu_cache");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-cfg=rredcot_cpu_cache");
}

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    println!("cargo:rerun-if-env-changed=PATH");
    println!("cargo::rustc-check-cfg=cfg(rredcot_cuda_graphs)");
    println!("cargo::rustc-check-cfg=cfg(rredcot_cpu_cache)");
    cpu_capability();
    if let Some(lib) = torch_lib_dir() {
        cpu_cache(&lib);
        cuda_graphs(&lib);
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
