//! Checkpoint I/O on the host (bench/checkpoint_io.sh): seconds and peak RSS of one operation per
//! process, rredcot's way beside the way it read and wrote checkpoints before, which this file
//! keeps as the baseline.
//!
//! usage: bench_checkpoint_io load MODEL_DIR (mapped | read)
//!        bench_checkpoint_io save MODEL_DIR OUT_DIR (streamed | copied)
//!        bench_checkpoint_io adamw STATE_DIR (mapped | read)
//!
//! - load: `model::load` (each file memory-mapped) vs the whole file read into a buffer first;
//! - save: `model::save` (each tensor copied out as the writer reaches it) vs every tensor
//!   copied to a host buffer before writing;
//! - adamw: `AdamW::load_or_new` (mapped) vs tch's `Tensor::read_safetensors` (the whole file
//!   read, then every tensor made on the host).
//!
//! Prints one JSON line: {"op", "mode", "seconds", "peak_rss_mb" (VmHWM), "peak_anon_mb"
//! (anonymous memory, sampled; for save, during the save, beside "anon_before_mb")}.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use rredcot_ml::model::{self, LoadOptions};
use rredcot_ml::train::adamw::{AdamW, AdamWConfig};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use tch::{Device, Kind, Tensor};

/// A field of /proc/self/status in MB.
fn status_mb(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn peak_rss_mb() -> f64 {
    status_mb("VmHWM:")
}

/// The largest anonymous resident memory seen since the last [`AnonPeak::reset`], sampled every
/// 2 ms by a thread. VmHWM also counts a mapped file's pages, which are page cache the kernel
/// can drop; the anonymous peak is the memory a load or save takes from everything else.
struct AnonPeak(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl AnonPeak {
    fn start() -> AnonPeak {
        let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let p = peak.clone();
        std::thread::spawn(move || loop {
            let kb = (status_mb("RssAnon:") * 1024.0) as u64;
            p.fetch_max(kb, std::sync::atomic::Ordering::Relaxed);
            std::thread::sleep(std::time::Duration::from_millis(2));
        });
        AnonPeak(peak)
    }

    fn reset(&self) {
        self.0.store((status_mb("RssAnon:") * 1024.0) as u64, std::sync::atomic::Ordering::Relaxed);
    }

    fn mb(&self) -> f64 {
        let now = (status_mb("RssAnon:") * 1024.0) as u64;
        self.0.fetch_max(now, std::sync::atomic::Ordering::Relaxed).max(now) as f64 / 1024.0
    }
}

fn cpu() -> LoadOptions {
    serde_json::from_value(serde_json::json!({"device": "cpu", "dtype": "f32"})).expect("load options")
}

fn kind_of(d: Dtype) -> Kind {
    match d {
        Dtype::BF16 => Kind::BFloat16,
        Dtype::F16 => Kind::Half,
        _ => Kind::Float,
    }
}

/// The baseline load: each safetensors file read whole into memory, then copied tensor by tensor.
fn load_read(dir: &Path) -> anyhow::Result<()> {
    let cfg = model::ModelConfig::from_json_str(&std::fs::read_to_string(dir.join("config.json"))?, &dir.join("config.json"))?;
    let m = model::DecoderLm::new(&cfg, Device::Cpu);
    let vars = m.vs.variables();
    let bytes = std::fs::read(dir.join("model.safetensors"))?;
    let st = SafeTensors::deserialize(&bytes)?;
    tch::no_grad(|| {
        for (name, view) in st.tensors() {
            if let Some(dst) = vars.get(&name) {
                let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
                let t = Tensor::from_data_size(view.data(), &shape, kind_of(view.dtype())).to_kind(Kind::Float);
                dst.shallow_clone().copy_(&t);
            }
        }
    });
    Ok(())
}

/// The baseline save: every tensor copied to a host buffer, then the file written.
fn save_copied(m: &model::DecoderLm, out: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    let vars = m.vs.variables();
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort();
    let owned: Vec<(String, Vec<u8>, Vec<usize>)> = names
        .into_iter()
        .map(|n| {
            let t = vars[n].detach().to_kind(Kind::Float).contiguous();
            let mut data = vec![0u8; t.numel() * 4];
            t.copy_data_u8(&mut data, t.numel());
            (n.clone(), data, t.size().iter().map(|&d| d as usize).collect())
        })
        .collect();
    let views = owned
        .iter()
        .map(|(n, d, s)| Ok((n.clone(), TensorView::new(Dtype::F32, s.clone(), d)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    safetensors::tensor::serialize_to_file(views, Some(HashMap::new()), &out.join("model.safetensors"))?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (op, mode) = (args[0].as_str(), args.last().expect("a mode").as_str());
    let anon = AnonPeak::start();
    let t0 = Instant::now();
    match (op, mode) {
        ("load", "mapped") => drop(model::load(Path::new(&args[1]), &cpu())?),
        ("load", "read") => load_read(Path::new(&args[1]))?,
        ("save", _) => {
            let m = model::load(Path::new(&args[1]), &cpu())?.model;
            // Peak and time of the save alone: the model is loaded before the clock starts.
            anon.reset();
            let (before, t1) = (status_mb("RssAnon:"), Instant::now());
            let out = Path::new(&args[2]);
            if mode == "streamed" {
                model::save(&m, None, out)?;
            } else {
                save_copied(&m, out)?;
            }
            println!(
                "{}",
                serde_json::json!({"op": op, "mode": mode, "seconds": t1.elapsed().as_secs_f64(),
                                   "peak_rss_mb": peak_rss_mb(), "peak_anon_mb": anon.mb(), "anon_before_mb": before})
            );
            return Ok(());
        }
        ("adamw", "mapped") => {
            let cfg = AdamWConfig { beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.0 };
            drop(AdamW::load_or_new(Path::new(&args[1]), cfg, Device::Cpu)?)
        }
        ("adamw", "read") => drop(Tensor::read_safetensors(Path::new(&args[1]).join("moments.safetensors"))?),
        _ => anyhow::bail!("usage: see the header of ml/examples/bench_checkpoint_io.rs"),
    }
    println!(
        "{}",
        serde_json::json!({"op": op, "mode": mode, "seconds": t0.elapsed().as_secs_f64(), "peak_rss_mb": peak_rss_mb(),
                           "peak_anon_mb": anon.mb()})
    );
    Ok(())
}
