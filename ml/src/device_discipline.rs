//! Test-only audit of device discipline: every tensor the library makes on the host must follow
//! the model's device. A CPU-only machine cannot run a two-device program, so this reads the
//! source instead: a host constructor (`Tensor::from_slice`, `read_safetensors`,
//! `from_data_size`, a literal `Device::Cpu`, `cuda_if_available`) outside test modules must be
//! moved in the same statement (`to_device(..)` / `.to(..)`), or carry a `// host:` comment on its
//! line or in the comment just above saying why it stays on the host (e.g. a copy into a
//! variable). Reading back with `to_device(Device::Cpu)` is a move, hence allowed.
//!
//! What it catches: a constructor that forgets the device (as `AdamW::load_or_new` did with
//! `read_safetensors`, the step-2 crash of issue 17) and a stage choosing its own device instead
//! of its `device` param. What it cannot: a tensor built on the right device from a wrong one
//! (`zeros(.., (kind, some_other_tensor.device()))`), or a device-less op hidden in a helper not
//! named above. The CUDA tests (`ml/tests/gpu.rs`, `make test-gpu`) check those at run time.

use std::path::{Path, PathBuf};

/// Constructors that put a tensor on the CPU whatever the model's device.
const HOST_MAKERS: &[&str] = &[
    "Tensor::from_slice(",
    "Tensor::f_from_slice(",
    "Tensor::read_safetensors(",
    "Tensor::from_data_size(",
    "Tensor::load(",
    "Tensor::read_npy(",
    "Device::Cpu",
    "cuda_if_available",
];

/// `(line number, line)` of every host constructor in `src` (test modules excluded) that is not
/// moved to a device in its statement and has no `// host:` reason.
fn violations(src: &str) -> Vec<(usize, String)> {
    let body = src.split("#[cfg(test)]").next().unwrap_or("");
    let lines: Vec<&str> = body.lines().collect();
    let mut bad = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        if !HOST_MAKERS.iter().any(|m| code.contains(m)) {
            continue;
        }
        // A match arm naming the CPU is the device choice itself, not a tensor.
        if code.contains("=>") && !code.contains("Tensor::") {
            continue;
        }
        let mut comments_above = lines[..i]
            .iter()
            .rev()
            .take_while(|l| l.trim_start().starts_with("//"));
        if line.contains("// host:") || comments_above.any(|l| l.contains("host:")) {
            continue;
        }
        // The statement from this line to its `;` (or the start of a block).
        let rest: String = std::iter::once(code)
            .chain(lines[i + 1..].iter().copied())
            .collect::<Vec<_>>()
            .join("\n");
        let stmt = rest.split([';', '{']).next().unwrap_or("");
        if !(stmt.contains("to_device(") || stmt.contains(".to(")) {
            bad.push((i + 1, line.trim().to_string()));
        }
    }
    bad
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read ml/src") {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") && !p.ends_with("device_discipline.rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_host_tensor_follows_the_model_device() {
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    assert!(files.len() > 20, "found only {} source files", files.len());
    let mut report = Vec::new();
    for f in &files {
        let src = std::fs::read_to_string(f).unwrap();
        for (n, line) in violations(&src) {
            report.push(format!("{}:{n}: {line}", f.display()));
        }
    }
    assert!(
        report.is_empty(),
        "host tensors that ignore the model's device:\n{}",
        report.join("\n")
    );
}

#[test]
fn the_audit_flags_the_step_two_crash_and_accepts_its_fix() {
    // The restore of `AdamW::load_or_new` before the fix, then after it.
    let before = "for (name, t) in Tensor::read_safetensors(&moments).with_context(|| x)? {\n    opt.m.insert(name, t);\n}";
    assert_eq!(violations(before).len(), 1, "{:?}", violations(before));
    let after = "let t = Tensor::read_safetensors(&moments)?.remove(0).1.to_device(device);";
    assert!(violations(after).is_empty());
    let own_choice = "let device = Device::cuda_if_available();";
    assert_eq!(violations(own_choice).len(), 1);
    let readback = "// host: read back for the stop checks\nlet v = x.to_kind(Kind::Double).to_device(Device::Cpu);";
    assert!(violations(readback).is_empty());
    let made_on_cpu = "let z = Tensor::zeros([3], (Kind::Float, Device::Cpu));\nlet y = x + z;";
    assert_eq!(violations(made_on_cpu).len(), 1);
    let in_tests = "#[cfg(test)]\nmod tests { let z = Tensor::from_slice(&[1]); }";
    assert!(violations(in_tests).is_empty());
}
